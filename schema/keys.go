package schema

import (
	"fmt"
	"slices"
	"strings"
)

// Keys renders the FROM clause of a statement that addresses rows of
// table by primary key: a derived table k of the ids joined to table under
// alias, one primary key lookup per id:
//
//	(SELECT ? AS id UNION ALL SELECT ? ...) AS k
//	  STRAIGHT_JOIN items i FORCE INDEX (PRIMARY) ON i.id = k.id
//
// as in "SELECT i.topic FROM "+k+" WHERE i.namespace = ? FOR UPDATE" or
// "DELETE i FROM "+k. It returns the clause and its arguments: the ids
// sorted, without repeats, so that every statement locks rows in one order
// and a repeated id does not join twice. No ids give an empty k.
//
// Why not "WHERE id IN (...)": a queue's table is small whenever consumers
// keep up, and on a table of a page or two MariaDB 10.11 prefers a full
// scan, or the ready index when the statement also names the namespace, to
// a range read of a few ids; FORCE INDEX (PRIMARY) then gives a full index
// scan, a single-table DELETE takes no index hint, and a list of 1000 or
// more becomes a semi-join. A locking read or a DELETE that scans waits for
// the row lock of every row it passes, held by the prefetches, serves and
// acks of other consumers: a drill saw acks queue behind them for ten
// seconds after a failover. From the derived table, STRAIGHT_JOIN fixes
// the order and FORCE INDEX (PRIMARY) rules out every other access to
// table, leaving an eq_ref lookup per id, so a statement locks and waits
// for its own rows only. TestKeysPlan holds the plans to that.
func Keys(table, alias string, ids []uint64) (string, []any) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var b strings.Builder
	b.Grow(len(ids)*len(" UNION ALL SELECT ?") + 96)
	if len(ids) == 0 {
		b.WriteString("(SELECT CAST(NULL AS UNSIGNED) AS id LIMIT 0)")
	} else {
		b.WriteString("(SELECT ? AS id")
		for range len(ids) - 1 {
			b.WriteString(" UNION ALL SELECT ?")
		}
		b.WriteByte(')')
	}
	fmt.Fprintf(&b, " AS k STRAIGHT_JOIN %s %s FORCE INDEX (PRIMARY) ON %s.id = k.id", table, alias, alias)
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return b.String(), args
}
