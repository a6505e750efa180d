package store

import (
	"context"
	"database/sql"

	"github.com/jmoiron/sqlx"
)

// itemNextPrioritySQL finds the next priority level a topic holds above
// one: one index seek.
const itemNextPrioritySQL = "SELECT MIN(priority) FROM items WHERE namespace = ? AND topic = ? AND priority > ?"

// itemAgingCandidatesSQL reads, through the ready index, the items of one
// priority level that have been ready since the cutoff, after a
// checkpoint in (deliver_after, id) order.
const itemAgingCandidatesSQL = `SELECT id, deliver_after, priority_changed_at FROM items FORCE INDEX (ready)
			WHERE namespace = ? AND topic = ? AND priority = ? AND deliver_after <= ?
			  AND (deliver_after > ? OR (deliver_after = ? AND id > ?))
			ORDER BY deliver_after, id LIMIT ?`

// itemAgeSQL promotes items by one level, only if they still have the
// priority and readiness they were read with, so a lease, ack or
// escalation in between wins.
const itemAgeSQL = `UPDATE items FORCE INDEX (PRIMARY) SET original_priority = COALESCE(original_priority, priority), priority = priority - 1,
			priority_changed_by = 'aging', priority_changed_at = ?, ` + bumpUpdatedAt + `
			WHERE id IN (?) AND priority = ? AND deliver_after <= ?`

// ItemNextPriorityParams: see ItemNextPriority.
type ItemNextPriorityParams struct {
	Namespace, Topic string
	Above            int32
}

// ItemNextPriority returns the lowest priority above Above that the topic
// holds on the shard, if any.
func (s Store) ItemNextPriority(ctx context.Context, p ItemNextPriorityParams) (sql.NullInt32, error) {
	var next sql.NullInt32
	err := s.db.GetContext(ctx, &next, itemNextPrioritySQL, p.Namespace, p.Topic, p.Above)
	return next, err
}

// ItemAgingCandidatesParams: see ItemAgingCandidates.
type ItemAgingCandidatesParams struct {
	Namespace, Topic string
	Priority         int32
	CutoffUS         int64
	// AfterDeliverAfter, AfterID: the checkpoint the read starts after.
	AfterDeliverAfter int64
	AfterID           uint64
	Limit             int
}

// ItemAgingCandidates returns up to Limit items of one priority level
// whose deliver_after is at or before CutoffUS, after the checkpoint, in
// (deliver_after, id) order: ID, DeliverAfter and ChangedAt are set.
func (s Store) ItemAgingCandidates(ctx context.Context, p ItemAgingCandidatesParams) ([]Item, error) {
	var rows []Item
	err := s.db.SelectContext(ctx, &rows, itemAgingCandidatesSQL,
		p.Namespace, p.Topic, p.Priority, p.CutoffUS, p.AfterDeliverAfter, p.AfterDeliverAfter, p.AfterID, p.Limit)
	return rows, err
}

// ItemAgeParams: see ItemAge.
type ItemAgeParams struct {
	IDs []uint64
	// Priority: the level the items were read at.
	Priority        int32
	CutoffUS, NowUS int64
}

// ItemAge moves items of level Priority that are still there and still
// ready since CutoffUS up one level (priority - 1), recording the change
// as aging's, and returns how many moved.
func (s Store) ItemAge(ctx context.Context, p ItemAgeParams) (int64, error) {
	q, args, err := sqlx.In(itemAgeSQL, p.NowUS, p.NowUS, p.IDs, p.Priority, p.CutoffUS)
	if err != nil {
		return 0, err
	}
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return n, nil
}
