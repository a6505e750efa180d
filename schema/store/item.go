package store

import (
	"cmp"
	"database/sql"
)

// Item is a row of items, the one type every statement on the table reads
// into. A statement reads the columns it needs; the others stay zero (the
// head read, for one, skips namespace, topic and the priority history).
type Item struct {
	ID           uint64 `db:"id"`
	Namespace    string `db:"namespace"`
	Topic        string `db:"topic"`
	Priority     int32  `db:"priority"`
	DeliverAfter int64  `db:"deliver_after"`
	EnqueuedAt   int64  `db:"enqueued_at"`
	LeaseMS      uint32 `db:"lease_ms"`
	// ExpiresAt is the TTL; a buffered row past it is not served.
	ExpiresAt  sql.NullInt64 `db:"expires_at"`
	Attempts   int32         `db:"attempts"`
	LeaseToken uint64        `db:"lease_token"`
	// LeasedUntil is set only while a consumer holds (or held, until the
	// row is leased again) a delivery lease; the prefetch lease of an
	// older version left it NULL. It tells an expired delivery from a
	// lapsed prefetch.
	LeasedUntil sql.NullInt64  `db:"leased_until"`
	DedupKey    sql.NullString `db:"dedup_key"`
	Payload     []byte         `db:"payload"`
	// PayloadBytes is the whole payload's length where a statement reads
	// only its start (ItemList); zero elsewhere.
	PayloadBytes int64          `db:"payload_bytes"`
	Metadata     []byte         `db:"metadata"`
	LastError    sql.NullString `db:"last_error"`
	// UpdatedAt is the row's version as well as its time: every UPDATE
	// moves it forward (bumpUpdatedAt), and a serve compares it.
	UpdatedAt    int64          `db:"updated_at"`
	OrigPriority sql.NullInt32  `db:"original_priority"`
	ChangedBy    sql.NullString `db:"priority_changed_by"`
	ChangedAt    sql.NullInt64  `db:"priority_changed_at"`
	// Traceparent is the W3C trace context of the enqueue that stored the
	// row, for the consumer's span to link to (NULL: not traced).
	Traceparent sql.NullString `db:"traceparent"`
}

// Less orders rows as the ready index does: (priority, deliver_after, id).
func (r *Item) Less(o *Item) bool { return r.Compare(o) < 0 }

// Compare is Less as a three-way comparison.
func (r *Item) Compare(o *Item) int {
	return cmp.Or(cmp.Compare(r.Priority, o.Priority), cmp.Compare(r.DeliverAfter, o.DeliverAfter), cmp.Compare(r.ID, o.ID))
}

// Prefetched reports whether the row is under the prefetch lease of an
// older version (lease token, no leased_until), which hid rows while they
// sat in a dequeuer's buffer. Its deliver_after is that lease's expiry;
// when it became ready is kept in the ready_since column, which only the
// statements read. Rows the current version buffers are not written.
func (r *Item) Prefetched() bool { return r.LeaseToken != 0 && !r.LeasedUntil.Valid }

// DeadLetter is a row of dead_letters.
type DeadLetter struct {
	ID         uint64         `db:"id"`
	Namespace  string         `db:"namespace"`
	Topic      string         `db:"topic"`
	Priority   int32          `db:"priority"`
	EnqueuedAt int64          `db:"enqueued_at"`
	LeaseMS    uint32         `db:"lease_ms"`
	Attempts   int32          `db:"attempts"`
	DedupKey   sql.NullString `db:"dedup_key"`
	Payload    []byte         `db:"payload"`
	Metadata   []byte         `db:"metadata"`
	LastError  sql.NullString `db:"last_error"`
	DiedAt     int64          `db:"died_at"`
}
