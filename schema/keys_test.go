package schema_test

import (
	"database/sql"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/schematest"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.Main(m)) }

// TestKeysPlan: the statements that address items by id read them by
// primary key lookups whatever the table's size and statistics, so that a
// locking one waits for its own rows only (see Keys). Statistics are taken
// while the table is empty, then rows are added, as on a queue that keeps
// up; the lists run up to 1000 ids (where MariaDB turns an IN list into a
// semi-join).
func TestKeysPlan(t *testing.T) {
	ctx := t.Context()
	db := schematest.DB(t, nil)

	forms := map[string]func(ids []uint64) (string, []any){
		"locking read": func(ids []uint64) (string, []any) {
			k, args := schema.Keys("items", "i", ids)
			return "SELECT i.topic FROM " + k + " WHERE i.namespace = 'ns' FOR UPDATE", args
		},
		"delete": func(ids []uint64) (string, []any) {
			k, args := schema.Keys("items", "i", ids)
			return "DELETE i FROM " + k + " WHERE i.deliver_after <= 5", args
		},
		"copy": func(ids []uint64) (string, []any) {
			k, args := schema.Keys("items", "i", ids)
			return "INSERT INTO dead_letters (id, namespace, topic, priority, enqueued_at, lease_ms, attempts, payload, died_at) " +
				"SELECT i.id, i.namespace, i.topic, 0, 0, 0, 0, '', 0 FROM " + k, args
		},
		"serve": func(ids []uint64) (string, []any) {
			rows := make([][]any, len(ids))
			for i, id := range ids {
				rows[i] = []any{id, uint64(1)<<63 + uint64(i), int64(7), int64(0)}
			}
			k, args := schema.KeyValues("items", "i", []string{"tok", "until_us", "ver"}, rows)
			return "UPDATE " + k + " SET i.lease_token = k.tok, i.deliver_after = k.until_us WHERE i.updated_at = k.ver", args
		},
		"dead letters": func(ids []uint64) (string, []any) {
			k, args := schema.Keys("dead_letters", "i", ids)
			return "SELECT i.id FROM " + k + " WHERE i.namespace = 'ns' AND i.topic = 't' FOR UPDATE", args
		},
	}
	_, err := db.ExecContext(ctx, "ANALYZE TABLE items, dead_letters")
	require.NoError(t, err)
	size := 0
	for _, rows := range []int{0, 1, 30, 3000} {
		for ; size < rows; size++ {
			_, err := db.ExecContext(ctx, `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
				payload, updated_at) VALUES (?, 'ns', 't', 0, 0, 0, 0, '', 0)`, size+1)
			require.NoError(t, err)
			_, err = db.ExecContext(ctx, `INSERT INTO dead_letters (id, namespace, topic, priority, enqueued_at, lease_ms, attempts,
				payload, died_at) VALUES (?, 'ns', 't', 0, 0, 0, 0, '', 0)`, size+1)
			require.NoError(t, err)
		}
		for _, n := range []int{1, 2, 10, 1000} {
			ids := make([]uint64, n)
			for i := range ids {
				ids[i] = uint64(i + 1)
			}
			for name, form := range forms {
				q, err := interpolate(form(ids))
				require.NoError(t, err)
				var plan []struct {
					Table sql.NullString `db:"table"`
					Type  sql.NullString `db:"type"`
					Key   sql.NullString `db:"key"`
				}
				require.NoError(t, db.Unsafe().SelectContext(ctx, &plan, "EXPLAIN "+q))
				found := false
				for _, p := range plan {
					if p.Table.String != "i" {
						continue
					}
					found = true
					require.Contains(t, []string{"const", "eq_ref"}, p.Type.String,
						"%s of %d ids on %d rows: items read by %s on %s", name, n, rows, p.Type.String, p.Key.String)
					require.Equal(t, "PRIMARY", p.Key.String, "%s of %d ids on %d rows", name, n, rows)
				}
				if !found {
					// A lookup of one id the table lacks: "Impossible WHERE
					// noticed after reading const tables", no table read.
					for _, p := range plan {
						require.False(t, p.Table.Valid, "%s of %d ids on %d rows: no access to items in %+v", name, n, rows, plan)
					}
				}
			}
		}
	}
}

// interpolate fills the ? of q with ids, as the driver does with
// InterpolateParams (EXPLAIN takes no placeholders over the text protocol).
func interpolate(q string, args []any) (string, error) {
	out := make([]byte, 0, len(q)+len(args)*8)
	i := 0
	for _, c := range []byte(q) {
		if c != '?' {
			out = append(out, c)
			continue
		}
		if i >= len(args) {
			return "", fmt.Errorf("more placeholders than %d arguments", len(args))
		}
		switch a := args[i].(type) {
		case string: // Keys' JSON array: digits, brackets and commas
			out = fmt.Appendf(out, "'%s'", a)
		default:
			out = fmt.Appendf(out, "%d", a)
		}
		i++
	}
	if i != len(args) {
		return "", fmt.Errorf("%d placeholders for %d arguments", i, len(args))
	}
	return string(out), nil
}

// TestKeyValuesCarryEveryValueExactly: ids, tokens and times reach the
// statement exactly through the JSON array, over the whole uint64 range
// and negative int64s, sorted by id with a repeated id's first row kept;
// no rows give an empty k.
func TestKeyValuesCarryEveryValueExactly(t *testing.T) {
	ctx := t.Context()
	db := schematest.DB(t, nil)
	for _, id := range []uint64{1, 1<<63 + 1, ^uint64(0)} {
		_, err := db.ExecContext(ctx, `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
			payload, updated_at) VALUES (?, 'ns', 't', 0, 0, 0, 0, '', 0)`, id)
		require.NoError(t, err)
	}
	k, args := schema.KeyValues("items", "i", []string{"tok", "at"}, [][]any{
		{^uint64(0), uint64(1<<63 - 1), int64(-1795752388364929)},
		{uint64(1), ^uint64(0), int64(1795752388364929)},
		{1<<63 + uint64(1), uint64(1<<63 + 5), int64(-1)},
		{uint64(1), uint64(7), int64(7)}, // a repeat: the first row stands
	})
	var got []struct {
		ID  uint64 `db:"id"`
		Tok uint64 `db:"tok"`
		At  int64  `db:"at"`
	}
	require.NoError(t, db.SelectContext(ctx, &got, "SELECT i.id, k.tok, k.at FROM "+k, args...))
	require.Equal(t, []struct {
		ID  uint64 `db:"id"`
		Tok uint64 `db:"tok"`
		At  int64  `db:"at"`
	}{{1, ^uint64(0), 1795752388364929}, {1<<63 + 1, 1<<63 + 5, -1}, {^uint64(0), 1<<63 - 1, -1795752388364929}}, got)

	k, args = schema.Keys("items", "i", []uint64{^uint64(0), 1, 1})
	var ids []uint64
	require.NoError(t, db.SelectContext(ctx, &ids, "SELECT i.id FROM "+k, args...))
	require.Equal(t, []uint64{1, ^uint64(0)}, ids)
	k, args = schema.Keys("items", "i", nil)
	ids = nil
	require.NoError(t, db.SelectContext(ctx, &ids, "SELECT i.id FROM "+k, args...))
	require.Empty(t, ids)
}
