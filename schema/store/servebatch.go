package store

import (
	"context"

	"github.com/jmoiron/sqlx"
)

// MaxServeBatch bounds the deliveries one coalesced serve takes, for the
// same reasons as MaxAckBatch.
const MaxServeBatch = 500

// ServeBatcher coalesces the serves that concurrent takes make on one
// shard into one ItemServe UPDATE, as AckBatcher does for acks: in steady
// state many consumers are each handed a few items at once, and an UPDATE
// and commit per consumer spends the shard's time on commits rather than
// on rows. Each delivery carries the version its row was read with
// (Delivery.Version), so deliveries of different reads share the statement.
//
// A caller waits for the serve in flight (if any) and then for its own;
// the one in flight never waits for more, so a lone serve costs one
// statement. Each caller gets the result ItemServe would have given its
// deliveries alone: the ids served. A batch never holds the same row
// twice (a row buffered twice, read at two versions, goes to the next
// batch), so one caller's stale copy cannot keep another's current copy
// from being served. A batch that fails fails every caller in it, whose
// items then stay ready, as after a failed ItemServe.
//
// The zero value is ready to use.
type ServeBatcher struct {
	coalescer[*sqlx.DB, serveBatch]
}

type serveBatch struct {
	ds    []Delivery
	ids   map[uint64]bool
	nowUS int64
	held  map[uint64]bool
	err   error
}

// Serve serves p's deliveries on db through the batcher: see ItemServe.
// It waits for its batch even when ctx ends first (the flush has a
// deadline of its own, flushTimeout): a batch that stamped the rows has
// counted an attempt and hidden each row for its delivery lease, so the
// caller must learn which rows are now its own, to hand them out or
// unserve them. Returning early would lose that, and the rows would stay
// hidden for the whole lease (up to 12 h) with an attempt no consumer saw.
func (b *ServeBatcher) Serve(_ context.Context, db *sqlx.DB, p ItemServeParams) (map[uint64]bool, error) {
	if len(p.Deliveries) == 0 {
		return map[uint64]bool{}, nil
	}
	bt := b.add(db, func(sb *serveBatch) bool { return sb.fits(p.Deliveries) }, func(sb *serveBatch) {
		if sb.ids == nil {
			sb.ids = map[uint64]bool{}
		}
		for _, d := range p.Deliveries {
			sb.ds = append(sb.ds, d)
			sb.ids[d.ID] = true
		}
		sb.nowUS = max(sb.nowUS, p.NowUS)
	}, runServes)
	<-bt.done
	if bt.v.err != nil {
		return nil, bt.v.err
	}
	mine := make(map[uint64]bool, len(p.Deliveries))
	for _, d := range p.Deliveries {
		if bt.v.held[d.ID] {
			mine[d.ID] = true
		}
	}
	return mine, nil
}

// fits reports whether ds can join the batch: room left, and no row the
// batch already serves.
func (sb *serveBatch) fits(ds []Delivery) bool {
	if len(sb.ds)+len(ds) > MaxServeBatch {
		return false
	}
	for _, d := range ds {
		if sb.ids[d.ID] {
			return false
		}
	}
	return true
}

// runServes runs one serve batch as ItemServe.
func runServes(db *sqlx.DB, sb *serveBatch) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	sb.held, sb.err = New(db).ItemServe(ctx, ItemServeParams{Deliveries: sb.ds, NowUS: sb.nowUS})
}
