package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

// ErrListTooSlow is ItemList's statement ending at its budget
// (max_statement_time, MariaDB error 1969): too many rows of other states
// sit before the page in the index for one read.
var ErrListTooSlow = errors.New("store: the list read past its time budget")

// ItemState is a state an item is listed by: what itemProto in routing
// and TopicStats call ready, leased and delayed.
type ItemState int

// The states of ItemList.
const (
	// StateReady: deliverable now, or under an older version's prefetch
	// lease (Prefetched), which waits for a consumer all the same.
	StateReady ItemState = iota + 1
	// StateLeased: a consumer holds an unexpired delivery lease.
	StateLeased
	// StateDelayed: neither, with deliver_after in the future.
	StateDelayed
)

// stateConds are the state conditions, each with its arguments: now
// (µs) as many times as it has placeholders. They partition the rows as
// routing's itemProto does: a row under an older version's prefetch
// lease is ready, then a running lease is leased, then a future
// deliver_after is delayed, and the rest is ready.
var stateConds = map[ItemState]struct {
	sql  string
	nows int
}{
	StateReady:   {`((lease_token <> 0 AND leased_until IS NULL) OR (deliver_after <= ? AND NOT (lease_token <> 0 AND leased_until > ?)))`, 2},
	StateLeased:  {`(lease_token <> 0 AND leased_until > ?)`, 1},
	StateDelayed: {`(deliver_after > ? AND (lease_token = 0 OR leased_until <= ?))`, 2},
}

// afterSQL starts a page after a cursor (priority, deliver_after, id),
// as ranges of the ready index.
const afterSQL = `AND (priority > ? OR (priority = ? AND (deliver_after > ? OR (deliver_after = ? AND id > ?))))`

// itemListSQL reads a page of a topic's items in one state, in the ready
// index's order (priority, deliver_after, id) after a cursor, within a
// priority range. The ready index leads with (namespace, topic,
// priority, deliver_after, id), so the cursor and the range are index
// ranges and the rows come in index order with no sort; the state is a
// filter on the rows read. Rows of another state in the range are read
// and skipped (leased rows sort after the ready ones of their priority,
// their deliver_after being the lease's expiry), which max_statement_time
// bounds. Payloads come cut to ListPayloadBytes.
const itemListSQL = `SET STATEMENT max_statement_time = %g FOR
SELECT id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms, expires_at, attempts,
	lease_token, leased_until, dedup_key, LEFT(payload, %d) AS payload, LENGTH(payload) AS payload_bytes,
	metadata, last_error, updated_at, original_priority, priority_changed_by, priority_changed_at
FROM items FORCE INDEX (ready)
WHERE namespace = ? AND topic = ? AND priority BETWEEN ? AND ? %s
	AND %s
ORDER BY priority, deliver_after, id LIMIT ?`

// ListPayloadBytes is how much of each payload ItemList reads: enough to
// tell items apart in a list, while a page of 500 stays small.
const ListPayloadBytes = 1024

// ItemListParams: see ItemList.
type ItemListParams struct {
	Namespace, Topic string
	State            ItemState
	// MinPriority and MaxPriority bound the priorities listed, both
	// included.
	MinPriority, MaxPriority int32
	// After is the cursor: the page starts after the row of this
	// (Priority, DeliverAfter, ID). Nil: from the first.
	After *Item
	Limit int
	NowUS int64
	// Budget bounds the statement (max_statement_time). Default 5s.
	Budget time.Duration
}

// ItemList returns up to Limit items of a topic in State, after the
// cursor, in (priority, deliver_after, id) order. Payload holds at most
// ListPayloadBytes of each payload; PayloadBytes is its whole length.
// A read that runs past Budget is ErrListTooSlow.
func (s Store) ItemList(ctx context.Context, p ItemListParams) ([]Item, error) {
	state, ok := stateConds[p.State]
	if !ok {
		return nil, fmt.Errorf("store: item state %d", p.State)
	}
	budget := p.Budget
	if budget <= 0 {
		budget = 5 * time.Second
	}
	args := []any{p.Namespace, p.Topic, p.MinPriority, p.MaxPriority}
	after := ""
	if a := p.After; a != nil {
		after = afterSQL
		args = append(args, a.Priority, a.Priority, a.DeliverAfter, a.DeliverAfter, a.ID)
	}
	for range state.nows {
		args = append(args, p.NowUS)
	}
	args = append(args, p.Limit)
	var rows []Item
	q := fmt.Sprintf(itemListSQL, budget.Seconds(), ListPayloadBytes, after, state.sql)
	if err := s.db.SelectContext(ctx, &rows, q, args...); err != nil {
		if me := (*mysql.MySQLError)(nil); errors.As(err, &me) && me.Number == 1969 {
			return nil, fmt.Errorf("%w (%s)", ErrListTooSlow, budget)
		}
		return nil, err
	}
	return rows, nil
}
