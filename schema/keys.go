package schema

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Keys renders the FROM clause of a statement that addresses rows of
// table by primary key: a table k of the ids, from JSON_TABLE over one
// JSON array argument, joined to table under alias, one primary key
// lookup per id:
//
//	JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS k
//	  STRAIGHT_JOIN items i FORCE INDEX (PRIMARY) ON i.id = k.id
//
// as in "SELECT i.topic FROM "+k+" WHERE i.namespace = ? FOR UPDATE" or
// "DELETE i FROM "+k. It returns the clause and its one argument, the ids
// as a JSON array, sorted, without repeats, so that every statement locks
// rows in one order and a repeated id does not join twice. No ids give an
// empty k.
//
// k comes from JSON_TABLE rather than a UNION ALL of one SELECT per id,
// which MariaDB would parse and plan SELECT by SELECT: one argument, one
// plan, however many ids. JSON numbers reach JSON_TABLE's BIGINT columns
// exactly, over the whole uint64 range
// (TestKeyValuesCarryEveryValueExactly).
//
// Why not "WHERE id IN (...)": a queue's table is small whenever consumers
// keep up, and on a table of a page or two MariaDB 10.11 prefers a full
// scan, or the ready index when the statement also names the namespace, to
// a range read of a few ids; FORCE INDEX (PRIMARY) then gives a full index
// scan, a single-table DELETE takes no index hint, and a list of 1000 or
// more becomes a semi-join. A locking read or a DELETE that scans waits for
// the row lock of every row it passes, held by the prefetches, serves and
// acks of other consumers, so acks would queue behind them. From k, STRAIGHT_JOIN fixes
// the order and FORCE INDEX (PRIMARY) rules out every other access to
// table, leaving an eq_ref lookup per id, so a statement locks and waits
// for its own rows only. TestKeysPlan holds the plans to that.
func Keys(table, alias string, ids []uint64) (string, []any) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	b := make([]byte, 0, len(ids)*20+2)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, id, 10)
	}
	b = append(b, ']')
	return "JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS k" + joinByID(table, alias), []any{string(b)}
}

// joinByID joins table, under alias, to k by primary key lookups in k's
// order (see Keys).
func joinByID(table, alias string) string {
	return " STRAIGHT_JOIN " + table + " " + alias + " FORCE INDEX (PRIMARY) ON " + alias + ".id = k.id"
}

// KeyValues is Keys with a value per row beside each id: rows[i] is an id
// (uint64) followed by one value for each of cols, which k names, so a
// statement can give every row its own values:
//
//	UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
//	    tok BIGINT UNSIGNED PATH '$[1]', ...)) AS k
//	  STRAIGHT_JOIN items i FORCE INDEX (PRIMARY) ON i.id = k.id
//	  SET i.lease_token = k.tok
//
// A value is a uint64 (BIGINT UNSIGNED) or an int64 (BIGINT), the same
// type in every row; the first row sets each column's. Rows are sorted by
// id, and a repeated id keeps its first row only. The alternative, "SET c
// = CASE id WHEN ? THEN ? ... END" per column, costs MariaDB a scan of the
// list for every row it updates, so a join to k is cheaper per row. No
// rows give an empty k.
func KeyValues(table, alias string, cols []string, rows [][]any) (string, []any) {
	rows = slices.Clone(rows)
	slices.SortStableFunc(rows, func(a, b []any) int {
		x, y := a[0].(uint64), b[0].(uint64)
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	rows = slices.CompactFunc(rows, func(a, b []any) bool { return a[0].(uint64) == b[0].(uint64) })
	var q strings.Builder
	q.WriteString("JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]'")
	for i, c := range cols {
		typ := "BIGINT"
		if len(rows) > 0 {
			if _, ok := rows[0][i+1].(uint64); ok {
				typ = "BIGINT UNSIGNED"
			}
		}
		fmt.Fprintf(&q, ", %s %s PATH '$[%d]'", c, typ, i+1)
	}
	q.WriteString(")) AS k" + joinByID(table, alias))
	b := make([]byte, 0, len(rows)*(len(cols)+1)*20+2)
	b = append(b, '[')
	for i, r := range rows {
		if len(r) != len(cols)+1 {
			panic(fmt.Sprintf("schema.KeyValues: a row of %d values for %d columns and the id", len(r), len(cols)))
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for j, v := range r {
			if j > 0 {
				b = append(b, ',')
			}
			switch v := v.(type) {
			case uint64:
				b = strconv.AppendUint(b, v, 10)
			case int64:
				b = strconv.AppendInt(b, v, 10)
			default:
				panic(fmt.Sprintf("schema.KeyValues: a value of type %T (want uint64 or int64)", v))
			}
		}
		b = append(b, ']')
	}
	b = append(b, ']')
	return q.String(), []any{string(b)}
}
