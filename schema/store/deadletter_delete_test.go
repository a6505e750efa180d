package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/schema/schematest"
)

// deadLetters inserts dead letters of (namespace, topic) with keys from
// first to last, dead at died_at = key.
func (f *fixture) deadLetters(namespace, topic string, first, last uint64) {
	f.t.Helper()
	var q strings.Builder
	var args []any
	q.WriteString(`INSERT INTO dead_letters (id, namespace, topic, priority, enqueued_at, lease_ms, attempts, payload, died_at) VALUES `)
	for id := first; id <= last; id++ {
		if id > first {
			q.WriteString(",")
		}
		q.WriteString("(?, ?, ?, 0, 0, 1000, 3, '', ?)")
		args = append(args, id, namespace, topic, id)
	}
	_, err := f.db.ExecContext(f.ctx, q.String(), args...)
	require.NoError(f.t, err)
}

// TestDeadLetterDelete: by keys (only the topic's, only before the
// bound), a purge with a bound, and a purge of more than one batch; the
// other topic's and the other namespace's dead letters stay.
func TestDeadLetterDelete(t *testing.T) {
	f := newFixture(t)
	f.deadLetters(ns, topic, 1, 1200)
	f.deadLetters(ns, "other", 2001, 2010)
	f.deadLetters("ns2", topic, 3001, 3010)
	left := func() int {
		return f.count("SELECT COUNT(*) FROM dead_letters WHERE namespace = ? AND topic = ?", ns, topic)
	}

	// Keys: 5 and 6 are the topic's, 2001 another topic's, 3001 another
	// namespace's, 9999 nobody's; 7 died too late for the bound.
	n, err := f.s.DeadLetterDelete(f.ctx, DeadLetterDeleteParams{Namespace: ns, Topic: topic, Keys: []uint64{5, 6, 7, 2001, 3001, 9999}, BeforeUS: 7})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	require.Equal(t, 1198, left())
	require.Equal(t, 10, f.count("SELECT COUNT(*) FROM dead_letters WHERE topic = 'other'"))
	require.Equal(t, 10, f.count("SELECT COUNT(*) FROM dead_letters WHERE namespace = 'ns2'"))

	// A purge bounded by time: died before 101 (1..100, less 5 and 6).
	n, err = f.s.DeadLetterDelete(f.ctx, DeadLetterDeleteParams{Namespace: ns, Topic: topic, BeforeUS: 101})
	require.NoError(t, err)
	require.Equal(t, int64(98), n)
	require.Equal(t, 1100, left())
	require.Equal(t, 101, f.count("SELECT MIN(died_at) FROM dead_letters WHERE namespace = ? AND topic = ?", ns, topic))

	// The rest: more than two batches.
	n, err = f.s.DeadLetterDelete(f.ctx, DeadLetterDeleteParams{Namespace: ns, Topic: topic})
	require.NoError(t, err)
	require.Equal(t, int64(1100), n)
	require.Zero(t, left())
	require.Equal(t, 20, f.count("SELECT COUNT(*) FROM dead_letters"), "other topics and namespaces untouched")

	n, err = f.s.DeadLetterDelete(f.ctx, DeadLetterDeleteParams{Namespace: ns, Topic: topic})
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to delete")
}

// TestDeadLetterDeleteLocksOnlyItsRows: with another topic's dead letter
// and another namespace's locked by a transaction for the whole test, a
// purge and a delete by keys complete: each goes by the topic_died index
// or by primary key, never scanning (and waiting for) rows it does not
// delete.
func TestDeadLetterDeleteLocksOnlyItsRows(t *testing.T) {
	t.Parallel()
	db := schematest.DB(t, map[string]string{"tx_isolation": "'READ-COMMITTED'"})
	f := &fixture{t: t, ctx: t.Context(), db: db, s: New(db)}
	f.deadLetters(ns, topic, 1, 50)
	f.deadLetters(ns, "other", 101, 150)
	f.deadLetters("ns2", topic, 201, 250)
	_, err := f.db.ExecContext(f.ctx, "ANALYZE TABLE dead_letters")
	require.NoError(t, err)
	var key *string
	require.NoError(t, f.db.QueryRowxContext(f.ctx, "EXPLAIN "+strings.TrimSuffix(deadLetterPurgeBatchSQL, " FOR UPDATE"),
		ns, topic, 31, DeadLetterDeleteBatch).Scan(new(any), new(any), new(any), new(any), new(any), &key, new(any), new(any), new(any), new(any)))
	require.NotNil(t, key, "the purge's read uses an index")
	require.Equal(t, "topic_died", *key)
	holder, err := f.db.BeginTxx(f.ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Rollback() })
	_, err = holder.ExecContext(f.ctx, "SELECT id FROM dead_letters WHERE id IN (120, 220) FOR UPDATE")
	require.NoError(t, err)

	within := func() context.Context {
		c, cancel := context.WithTimeout(f.ctx, 5*time.Second)
		t.Cleanup(cancel)
		return c
	}
	n, err := f.s.DeadLetterDelete(within(), DeadLetterDeleteParams{Namespace: ns, Topic: topic, Keys: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}})
	require.NoError(t, err, "by keys")
	require.Equal(t, int64(10), n)
	n, err = f.s.DeadLetterDelete(within(), DeadLetterDeleteParams{Namespace: ns, Topic: topic, BeforeUS: 31})
	require.NoError(t, err, "purge before a time")
	require.Equal(t, int64(20), n)
	n, err = f.s.DeadLetterDelete(within(), DeadLetterDeleteParams{Namespace: ns, Topic: topic})
	require.NoError(t, err, "purge")
	require.Equal(t, int64(20), n)
}
