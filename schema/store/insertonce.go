package store

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema"
)

// errApplied says a batch of an at-once insert is recorded already (or
// its ID is taken): insert places the group the long way, which reads
// the records and answers each batch as the first time.
var errApplied = errors.New("store: a batch of the group is recorded as applied")

// maxBytesAtOnce bounds the payload and metadata bytes of an at-once
// insert: its statements travel as one packet, at most twice these bytes
// (hex literals, escaped placeholders: see sqlValues), which must stay
// under max_allowed_packet (16 MiB by default).
const maxBytesAtOnce = 4 << 20

// insertAtOnce places fresh batches in one round trip: START TRANSACTION,
// the batches' records, the items and COMMIT as one multi-statement
// query. The usual path takes five (begin, a read of the records, the two
// inserts, commit), and in steady state, where a group holds a few
// single-item batches, those round trips were most of a shard's
// statements (a general-log second of the mixed benchmark: 164 insert
// transactions beside 86 serves and 85 acks) and of mariadbd's CPU.
//
// The records go first and carry no outcome: a batch applied before (a
// JetStream redelivery) or a different batch with its ID fails the
// statement on the primary key, nothing of the group is written, and
// insert goes the long way, which reads the records. Groups whose
// outcome the database decides (dedup keys), which Isolate places row by
// row, or which are too large for one packet go the long way from the
// start; ok is false for them and for errApplied.
//
// A failed statement stops the ones after it, leaving the transaction
// open on the connection: onConn rolls it back.
func insertAtOnce(ctx context.Context, db *sqlx.DB, p ItemInsertBatchParams, hashes [][]byte) (out []*peerv1.EnqueueCommitted, ok bool, err error) {
	batches, nowUS := p.Batches, p.NowUS
	rows, size, wire := 0, 0, 0
	for _, b := range batches {
		for _, it := range b.Items {
			if it.DedupKey != "" {
				return nil, false, nil
			}
			rows++
			size += len(it.Payload) + len(it.Metadata)
			wire += itemWire(b, it)
		}
	}
	if rows == 0 || rows > maxRowsPerInsert || size > maxBytesAtOnce {
		return nil, false, nil
	}
	// One buffer for the whole query, sized for it once: growing it by
	// doubling was most of the enqueuer's copying.
	q := sqlValues{text: make([]byte, 0, len(batchRecordPrefix)+len(insertItemsPrefix)+128+len(batches)*batchRecordWire+wire)}
	q.raw("START TRANSACTION;")
	q.begin(batchRecordPrefix)
	for i, b := range batches {
		q.batchRecord(b.BatchId, nowUS, hashes[i], nil)
	}
	q.raw(";")
	q.begin(insertItemsPrefix)
	for i, b := range batches {
		for _, it := range b.Items {
			q.item(b, it, nowUS, p.traceparent(i))
		}
	}
	q.raw(insertItemsSuffix + ";COMMIT")
	err = schema.Retry(ctx, func() error {
		err := onConn(ctx, db, func(conn *sqlx.Conn) error {
			_, err := conn.ExecContext(ctx, q.String(), q.args...)
			return err
		})
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1062 {
			return errApplied
		}
		return err
	})
	if errors.Is(err, errApplied) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	out = make([]*peerv1.EnqueueCommitted, len(batches))
	for i, b := range batches {
		out[i] = &peerv1.EnqueueCommitted{BatchId: b.BatchId, DuplicateOf: make([]uint64, len(b.Items)), VersionUs: nowUS}
	}
	return out, true, nil
}

// onConn runs fn, which sends one multi-statement transaction (START
// TRANSACTION ... COMMIT), on a connection of its own. A failed statement
// stops the ones after it and leaves the transaction open on the
// connection, so when fn fails the transaction is rolled back there
// before the connection goes back to the pool, and a connection that
// cannot roll back is discarded (the server rolls back when it closes).
func onConn(ctx context.Context, db *sqlx.DB, fn func(conn *sqlx.Conn) error) error {
	conn, err := db.Connx(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err = fn(conn); err != nil {
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	return err
}
