package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"google.golang.org/protobuf/proto"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema"
)

const (
	// maxRowsPerInsert keeps one INSERT well under MySQL's 65,535
	// placeholders and its packet limit.
	maxRowsPerInsert = 1000
	// maxBytesPerInsert caps the bytes one INSERT's values take on the
	// wire (sqlValues.size), half MariaDB's default max_allowed_packet;
	// a row larger than that goes alone.
	maxBytesPerInsert = 8 << 20
	// maxStoredError bounds the error text kept in an outcome or a dead
	// letter's last_error.
	maxStoredError = 4 << 10
)

// insertItemsPrefix heads an insert of items; its rows follow as literals
// (sqlValues.item).
const insertItemsPrefix = `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
	expires_at, dedup_key, payload, metadata, updated_at, traceparent, attempts) VALUES `

// "id = id" makes a duplicate a no-op that still reports 0 rows affected,
// where INSERT IGNORE would also swallow real errors as warnings.
const insertItemsSuffix = ` ON DUPLICATE KEY UPDATE id = id`

// batchRecordPrefix records applied batches, with their content hash and
// outcome: the INSERT's VALUES follow, one sqlValues.batchRecord per batch.
const batchRecordPrefix = "INSERT INTO enqueue_batches (batch_id, applied_at, content_hash, outcome) VALUES "

// batchAppliedSQL reads the records of batches already applied.
const batchAppliedSQL = "SELECT batch_id, content_hash, outcome FROM enqueue_batches WHERE batch_id IN (?)"

// deadLetterInsertSQL dead-letters an item the items table refused, with
// 0 attempts and the database's reason.
const deadLetterInsertSQL = `INSERT INTO dead_letters (id, namespace, topic, priority, enqueued_at, lease_ms, attempts,
		dedup_key, payload, metadata, last_error, died_at) VALUES (?,?,?,?,?,?,0,?,?,?,?,?)
		ON DUPLICATE KEY UPDATE id = id`

// refusedInsertSQL keeps an item no table of its shape can hold.
const refusedInsertSQL = `INSERT INTO refused_items (item_id, batch_id, batch, reason, refused_at) VALUES (?,?,?,?,?)`

// itemPresentSQL reads which ids of k (schema.Keys("items", "i", ...))
// items holds.
func itemPresentSQL(k string) string { return "SELECT i.id FROM " + k }

// tombstoneCheckSQL reads, with a locking read, the tombstones that still
// hold dedup keys of a topic (the TombstoneCheck of an enqueue).
const tombstoneCheckSQL = `SELECT dedup_key, item_id, window_until, held_since FROM dedup_tombstones
				WHERE namespace = ? AND topic = ? AND dedup_key IN (?) AND expires_at > ? LOCK IN SHARE MODE`

// itemDedupHolderSQL reads, with a locking read, the live item that holds
// a dedup key.
const itemDedupHolderSQL = "SELECT id FROM items WHERE namespace = ? AND topic = ? AND dedup_key = ? LOCK IN SHARE MODE"

// ItemInsertBatchParams: see ItemInsertBatch.
type ItemInsertBatchParams struct {
	Batches []*peerv1.EnqueueBatch
	NowUS   int64
	// Isolate places the batches row by row: a row the items table
	// refuses is moved to dead_letters with the database's reason (or,
	// should dead_letters refuse it too, to refused_items), and every other
	// row is inserted as without Isolate. The batches are recorded as
	// applied either way, so nothing is lost and nothing is placed twice.
	Isolate bool
	// RetryWindow gives a namespace's dedup retry window
	// (shardmap.Namespace.RetryWindow); nil: none.
	RetryWindow func(namespace string) time.Duration
	// Traceparents holds, per batch, the W3C traceparent of the enqueue
	// that sent it, stored with each of its items ("" or a short slice:
	// none).
	Traceparents []string
}

// traceparent is the traceparent of batch i's items, "" without one.
func (p ItemInsertBatchParams) traceparent(i int) string {
	if i < len(p.Traceparents) {
		return p.Traceparents[i]
	}
	return ""
}

// retryWindow is f's answer for namespace, 0 when f is nil.
func retryWindow(f func(string) time.Duration, namespace string) time.Duration {
	if f == nil {
		return 0
	}
	return f(namespace)
}

// ItemInsertBatch writes enqueue batches to the shard in one transaction
// and returns, per batch, what EnqueueCommitted reports. A batch recorded
// in enqueue_batches as applied is skipped and answered with the outcome
// it got the first time, so it is idempotent. Without Isolate, when the
// database refuses the data, it fails with an error IsPermanent
// recognises and writes nothing; the caller then places each batch alone
// with Isolate.
func (s Store) ItemInsertBatch(ctx context.Context, p ItemInsertBatchParams) ([]*peerv1.EnqueueCommitted, error) {
	return insert(ctx, s.db, p)
}

// batchHash identifies a batch's content: a JetStream redelivery carries the
// same bytes, a different batch with the same ID (two routers minting with
// one node number) does not.
func batchHash(b *peerv1.EnqueueBatch) []byte {
	data, _ := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	sum := sha256.Sum256(data)
	return sum[:]
}

// insert stores the batches, one multi-row INSERT at once unless isolate
// or the at-once path declines, else in one transaction: batches already
// applied answer their stored outcome, fresh ones are inserted, their
// dedup keys settled and their application recorded.
func insert(ctx context.Context, db *sqlx.DB, p ItemInsertBatchParams) ([]*peerv1.EnqueueCommitted, error) {
	batches, nowUS := p.Batches, p.NowUS
	var out []*peerv1.EnqueueCommitted
	hashes := make([][]byte, len(batches))
	for i, b := range batches {
		hashes[i] = batchHash(b)
	}
	if !p.Isolate {
		if out, ok, err := insertAtOnce(ctx, db, p, hashes); ok {
			return out, err
		}
	}
	err := inTx(ctx, db, func(tx *sqlx.Tx) error {
		out = make([]*peerv1.EnqueueCommitted, len(batches))
		for i, b := range batches {
			out[i] = &peerv1.EnqueueCommitted{BatchId: b.BatchId, DuplicateOf: make([]uint64, len(b.Items))}
		}
		fresh, err := freshBatches(ctx, tx, batches, hashes, out, nowUS)
		if err != nil || len(fresh) == 0 {
			return err
		}
		rows := &rowInserter{ctx: ctx, tx: tx, isolate: p.Isolate, nowUS: nowUS, refused: map[uint64]bool{}}
		for _, i := range fresh {
			for _, it := range batches[i].Items {
				if err := rows.add(batches[i], out[i], it, p.traceparent(i)); err != nil {
					return err
				}
			}
		}
		if err := rows.flush(); err != nil {
			return err
		}
		if err := settleDedup(ctx, tx, batches, fresh, out, rows.refused, nowUS, p.RetryWindow); err != nil {
			return err
		}
		if err := recordBatches(ctx, tx, batches, hashes, fresh, out, nowUS); err != nil {
			return err
		}
		for _, i := range fresh {
			out[i].VersionUs = nowUS // the rows this insert stored
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// freshBatches returns the positions of the batches this shard has not
// applied yet. A batch applied before gets its stored outcome in out; one
// whose ID another batch holds is refused (two routers minted the same
// item IDs), its items kept as refused when it was acknowledged already.
func freshBatches(ctx context.Context, tx *sqlx.Tx, batches []*peerv1.EnqueueBatch, hashes [][]byte, out []*peerv1.EnqueueCommitted, nowUS int64) ([]int, error) {
	applied, err := appliedBatches(ctx, tx, batches)
	if err != nil {
		return nil, err
	}
	var fresh []int
	for i, b := range batches {
		rec, ok := applied[b.BatchId]
		switch {
		case !ok:
			fresh = append(fresh, i)
		case rec.Hash != nil && !bytes.Equal(rec.Hash, hashes[i]):
			// Another batch holds this ID: its items are not these. Never
			// report this one as applied.
			out[i].Error = fmt.Sprintf("batch id %d collides with a different batch already applied on this shard (two routers minted the same item IDs); nothing of this batch was stored", b.BatchId)
			if b.ReplySubject == "" {
				// Acknowledged already: keep it where an operator finds it.
				for _, it := range b.Items {
					if err := refuseItem(ctx, tx, b, it, out[i].Error, nowUS); err != nil {
						return nil, err
					}
				}
			}
		case rec.Outcome != nil:
			if err := proto.Unmarshal(rec.Outcome, out[i]); err != nil {
				return nil, fmt.Errorf("batch %d: stored outcome: %w", b.BatchId, err)
			}
			out[i].BatchId = b.BatchId
		}
	}
	return fresh, nil
}

// rowInserter gathers item rows into multi-row INSERTs of at most
// maxRowsPerInsert rows or maxBytesPerInsert bytes. With isolate every
// row is its own statement, and a row the shard refuses for good goes to
// the topic's dead letters (refused) while the transaction goes on.
type rowInserter struct {
	ctx     context.Context
	tx      *sqlx.Tx
	isolate bool
	nowUS   int64
	refused map[uint64]bool

	values  sqlValues
	pending []*peerv1.BufferedItem
	batch   *peerv1.EnqueueBatch
	out     *peerv1.EnqueueCommitted
}

func (w *rowInserter) add(b *peerv1.EnqueueBatch, out *peerv1.EnqueueCommitted, it *peerv1.BufferedItem, traceparent string) error {
	// A row that would take the statement past maxBytesPerInsert starts
	// the next one.
	if w.values.size()+itemWire(b, it) > maxBytesPerInsert {
		if err := w.flush(); err != nil {
			return err
		}
	}
	if w.values.rows == 0 {
		w.values.begin(insertItemsPrefix)
	}
	w.values.item(b, it, w.nowUS, traceparent)
	w.pending = append(w.pending, it)
	w.batch, w.out = b, out
	if w.isolate || w.values.rows == maxRowsPerInsert {
		return w.flush()
	}
	return nil
}

func (w *rowInserter) flush() error {
	if w.values.rows == 0 {
		return nil
	}
	w.values.raw(insertItemsSuffix)
	// A copy: the buffer is written again for the next statement.
	_, err := w.tx.ExecContext(w.ctx, string(w.values.text), w.values.args...)
	if err != nil && w.isolate && IsPermanent(err) {
		// One row (isolate flushes every row): the statement alone was
		// rolled back; the transaction goes on.
		it := w.pending[0]
		reason := "the shard refused the item at enqueue: " + err.Error()
		if err := deadLetter(w.ctx, w.tx, w.batch, it, reason, w.nowUS); err != nil {
			return err
		}
		w.refused[it.Key] = true
		w.out.Error = "the shard refused some items; they were moved to the topic's dead letters: " + err.Error()
		err = nil
	}
	if err != nil {
		return fmt.Errorf("insert items: %w", err)
	}
	w.values.reset()
	w.pending = w.pending[:0]
	return nil
}

// recordBatches records the fresh batches as applied, with their content
// hash and, when they had duplicates or an error, their outcome, so a
// redelivery answers the same.
func recordBatches(ctx context.Context, tx *sqlx.Tx, batches []*peerv1.EnqueueBatch, hashes [][]byte, fresh []int, out []*peerv1.EnqueueCommitted, nowUS int64) error {
	var values sqlValues
	values.begin(batchRecordPrefix)
	for _, i := range fresh {
		var outcome []byte
		if out[i].Error != "" || hasDuplicates(out[i]) {
			o := &peerv1.EnqueueCommitted{DuplicateOf: out[i].DuplicateOf, Error: truncate(out[i].Error, maxStoredError)}
			var err error
			if outcome, err = proto.Marshal(o); err != nil {
				return err
			}
		}
		values.batchRecord(batches[i].BatchId, nowUS, hashes[i], outcome)
	}
	if _, err := tx.ExecContext(ctx, values.String(), values.args...); err != nil {
		return fmt.Errorf("record batches: %w", err)
	}
	return nil
}

func hasDuplicates(c *peerv1.EnqueueCommitted) bool {
	for _, d := range c.DuplicateOf {
		if d != 0 {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

type batchRecord struct {
	ID      uint64 `db:"batch_id"`
	Hash    []byte `db:"content_hash"`
	Outcome []byte `db:"outcome"`
}

func appliedBatches(ctx context.Context, tx *sqlx.Tx, batches []*peerv1.EnqueueBatch) (map[uint64]batchRecord, error) {
	ids := make([]uint64, len(batches))
	for i, b := range batches {
		ids[i] = b.BatchId
	}
	q, args, err := sqlx.In(batchAppliedSQL, ids)
	if err != nil {
		return nil, err
	}
	var got []batchRecord
	if err := tx.SelectContext(ctx, &got, q, args...); err != nil {
		return nil, fmt.Errorf("applied batches: %w", err)
	}
	applied := make(map[uint64]batchRecord, len(got))
	for _, r := range got {
		applied[r.ID] = r
	}
	return applied, nil
}

// columns returns a buffered item's dedup key, payload and metadata as
// their columns take them: no dedup key or metadata is NULL, an empty
// payload is not.
func columns(it *peerv1.BufferedItem) (dedup any, payload []byte, meta any) {
	if it.DedupKey != "" {
		dedup = it.DedupKey
	}
	if len(it.Metadata) > 0 {
		meta = it.Metadata
	}
	payload = it.Payload
	if payload == nil {
		payload = []byte{}
	}
	return dedup, payload, meta
}

// deadLetter moves an item the items table refused into dead_letters, with
// the reason, in tx; should dead_letters refuse it too, to refused_items.
func deadLetter(ctx context.Context, tx *sqlx.Tx, b *peerv1.EnqueueBatch, it *peerv1.BufferedItem, reason string, nowUS int64) error {
	dedup, payload, meta := columns(it)
	reason = truncate(reason, maxStoredError)
	_, err := tx.ExecContext(ctx, deadLetterInsertSQL,
		it.Key, b.Namespace, b.Topic, it.Priority, b.EnqueuedAtUs, it.LeaseMs, dedup, payload, meta, reason, nowUS)
	if IsPermanent(err) {
		return refuseItem(ctx, tx, b, it, reason+"; dead_letters refused it too: "+err.Error(), nowUS)
	}
	if err != nil {
		return fmt.Errorf("dead-letter refused item: %w", err)
	}
	return nil
}

// refuseItem keeps an acknowledged item no table of its shape can hold, as
// its encoded batch, in refused_items.
func refuseItem(ctx context.Context, tx *sqlx.Tx, b *peerv1.EnqueueBatch, it *peerv1.BufferedItem, reason string, nowUS int64) error {
	one := &peerv1.EnqueueBatch{Namespace: b.Namespace, Topic: b.Topic, Shard: b.Shard, BatchId: b.BatchId,
		EnqueuedAtUs: b.EnqueuedAtUs, Items: []*peerv1.BufferedItem{it}}
	data, err := proto.Marshal(one)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, refusedInsertSQL,
		it.Key, b.BatchId, data, truncate(reason, maxStoredError), nowUS); err != nil {
		return fmt.Errorf("keep refused item: %w", err)
	}
	return nil
}

type tombKey struct{ ns, topic, key string }

// tombstone is a dedup_tombstones row as settleDedup reads it.
type tombstone struct {
	Key         string `db:"dedup_key"`
	Item        uint64 `db:"item_id"`
	WindowUntil int64  `db:"window_until"`
	HeldSince   int64  `db:"held_since"`
}

// takes reports whether the tombstone makes an item of an envelope
// enqueued at enqueuedAtUS a duplicate at nowUS: within the dedup window
// any is; after it, one enqueued before the item that held the key (a
// first attempt landing after its retry's item) or less than retry after
// it (a retry landing after the first attempt's item left; see
// shardmap.Namespace.RetryWindow). Both times of that test are routers'
// enqueue stamps, so the shard's clock does not enter it.
func (t tombstone) takes(enqueuedAtUS, nowUS int64, retry time.Duration) bool {
	return t.WindowUntil > nowUS || enqueuedAtUS < t.HeldSince+retry.Microseconds()
}

// settleDedup fills DuplicateOf for the fresh batches' items that carry a
// dedup key, after their rows were written:
//
//   - An item not inserted under its own key lost to the live item that
//     holds its dedup key.
//   - An item inserted whose key a gone item still holds (a tombstone within
//     the namespace's window) is deleted again and reported as a duplicate of
//     that item; so is one that lost its insert to such an item of the
//     same group (two retries of a key), not the undone item.
//
// The tombstones are read after the insert and with a locking read, which
// is what closes the race with a concurrent ack: the ack deletes the live
// item and writes its tombstone in one transaction, so the insert of a new
// item with the same key waits on the dedup index entry until the ack
// commits, and the locking read that follows sees the ack's tombstone. A
// plain read before the insert could miss it.
func settleDedup(ctx context.Context, tx *sqlx.Tx, batches []*peerv1.EnqueueBatch, fresh []int, out []*peerv1.EnqueueCommitted, refused map[uint64]bool, nowUS int64, retry func(string) time.Duration) error {
	byTopic := map[[2]string][]string{}
	var keys []uint64
	for _, i := range fresh {
		b := batches[i]
		for _, it := range b.Items {
			if it.DedupKey != "" && !refused[it.Key] {
				k := [2]string{b.Namespace, b.Topic}
				byTopic[k] = append(byTopic[k], it.DedupKey)
				keys = append(keys, it.Key)
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	present, err := presentKeys(ctx, tx, keys)
	if err != nil {
		return err
	}
	tombs, err := readTombstones(ctx, tx, byTopic, nowUS)
	if err != nil {
		return err
	}
	var undo []uint64
	undoneTo := map[uint64]uint64{} // an undone item -> the gone item it duplicates
	for _, i := range fresh {
		b := batches[i]
		for j, it := range b.Items {
			if it.DedupKey == "" || refused[it.Key] {
				continue
			}
			t, ok := tombs[tombKey{b.Namespace, b.Topic, it.DedupKey}]
			tomb := ok && t.takes(b.EnqueuedAtUs, nowUS, retryWindow(retry, b.Namespace))
			orig := t.Item
			switch {
			case present[it.Key] && tomb:
				undo = append(undo, it.Key)
				undoneTo[it.Key] = orig
				out[i].DuplicateOf[j] = orig // its key's item is gone but still within the window
			case present[it.Key]:
			default:
				var live uint64
				// A locking read: it sees the latest committed holder, where a
				// snapshot read could predate the insert this one lost to.
				err := tx.GetContext(ctx, &live, itemDedupHolderSQL,
					b.Namespace, b.Topic, it.DedupKey)
				if err != nil && !errors.Is(err, sql.ErrNoRows) {
					return fmt.Errorf("dedup lookup: %w", err)
				}
				if live == 0 && tomb {
					live = orig
				}
				out[i].DuplicateOf[j] = live
			}
		}
	}
	// An item that lost its insert to one this transaction undoes (two
	// retries of a key in one group) duplicates what that one does.
	for _, i := range fresh {
		for j, d := range out[i].DuplicateOf {
			if to, ok := undoneTo[d]; ok {
				out[i].DuplicateOf[j] = to
			}
		}
	}
	for start := 0; start < len(undo); start += maxRowsPerInsert {
		k, args := schema.Keys("items", "i", undo[start:min(start+maxRowsPerInsert, len(undo))])
		if _, err := tx.ExecContext(ctx, itemDeleteKeysSQL(k, ""), args...); err != nil {
			return fmt.Errorf("undo tombstoned inserts: %w", err)
		}
	}
	return nil
}

// presentKeys says which of the item keys are stored.
func presentKeys(ctx context.Context, tx *sqlx.Tx, keys []uint64) (map[uint64]bool, error) {
	present := map[uint64]bool{}
	for start := 0; start < len(keys); start += maxRowsPerInsert {
		chunk := keys[start:min(start+maxRowsPerInsert, len(keys))]
		k, args := schema.Keys("items", "i", chunk)
		var got []uint64
		if err := tx.SelectContext(ctx, &got, itemPresentSQL(k), args...); err != nil {
			return nil, err
		}
		for _, id := range got {
			present[id] = true
		}
	}
	return present, nil
}

// readTombstones reads, with a locking read, the tombstones of the dedup
// keys by namespace and topic.
func readTombstones(ctx context.Context, tx *sqlx.Tx, byTopic map[[2]string][]string, nowUS int64) (map[tombKey]tombstone, error) {
	tombs := map[tombKey]tombstone{}
	for k, dkeys := range byTopic {
		for start := 0; start < len(dkeys); start += maxRowsPerInsert {
			chunk := dkeys[start:min(start+maxRowsPerInsert, len(dkeys))]
			q, args, err := sqlx.In(tombstoneCheckSQL, k[0], k[1], chunk, nowUS)
			if err != nil {
				return nil, err
			}
			var rows []tombstone
			if err := tx.SelectContext(ctx, &rows, q, args...); err != nil {
				return nil, fmt.Errorf("dedup tombstones: %w", err)
			}
			for _, r := range rows {
				tombs[tombKey{k[0], k[1], r.Key}] = r
			}
		}
	}
	return tombs, nil
}

// IsPermanent reports whether err is MySQL refusing the data itself (bad
// value, too long, NULL where not allowed): retrying the same batch can
// never succeed, unlike a lost connection, a deadlock or a fenced primary.
func IsPermanent(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1048, // column cannot be null
		1292, // incorrect value
		1264, // out of range
		1366, // incorrect string value
		1406, // data too long
		1153: // packet bigger than max_allowed_packet
		return true
	}
	return false
}

// batchPruneSQL deletes old enqueue_batches rows through the applied
// index, a bounded number per statement.
const batchPruneSQL = "DELETE FROM enqueue_batches WHERE applied_at < ? ORDER BY applied_at LIMIT ?"

// EnqueueBatchPruneParams: see EnqueueBatchPrune.
type EnqueueBatchPruneParams struct {
	BeforeUS int64
	// Limit: rows per statement.
	Limit int
}

// EnqueueBatchPrune deletes enqueue_batches rows applied before BeforeUS,
// at most Limit rows per statement, until none is left, and returns how
// many it deleted. A row only matters while JetStream may still redeliver
// its batch.
func (s Store) EnqueueBatchPrune(ctx context.Context, p EnqueueBatchPruneParams) (int64, error) {
	var total int64
	for {
		res, err := s.db.ExecContext(ctx, batchPruneSQL, p.BeforeUS, p.Limit)
		if err != nil {
			return total, fmt.Errorf("prune enqueue batches: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < int64(p.Limit) {
			return total, nil
		}
	}
}
