package dequeuer

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// FormatToken returns a lease token's external form.
func FormatToken(t uint64) string { return fmt.Sprintf("%016x", t) }

// ParseToken reads a lease token's external form.
func ParseToken(s string) (uint64, error) {
	if len(s) != 16 {
		return 0, ErrBadToken
	}
	t, err := strconv.ParseUint(s, 16, 64)
	if err != nil || t == 0 {
		return 0, ErrBadToken
	}
	return t, nil
}

// LeaseRef names a leased item on one shard.
type LeaseRef struct {
	Key   uint64
	Token uint64
}

// Nack is one item handed back.
type Nack struct {
	LeaseRef
	// Delay before redelivery, unless Backoff.
	Delay time.Duration
	// Backoff: no delay was given; use Backoff(attempts).
	Backoff bool
	// Error is kept on the item as last_error.
	Error string
	// Metadata is merged into the item's; an empty value deletes a key.
	Metadata map[string]string
}

type leaseState struct {
	ID       uint64         `db:"id"`
	Topic    string         `db:"topic"`
	Attempts int            `db:"attempts"`
	Token    uint64         `db:"lease_token"`
	LeaseMS  uint32         `db:"lease_ms"`
	Metadata []byte         `db:"metadata"`
	DedupKey sql.NullString `db:"dedup_key"`
}

// lockLeases reads the lease state of keys under row locks in tx.
// Items of other namespaces are invisible, so an ID cannot reach across
// tenants.
func lockLeases(ctx context.Context, tx *sqlx.Tx, namespace string, keys []uint64) (map[uint64]leaseState, error) {
	k, args := schema.Keys("items", "i", keys)
	var rows []leaseState
	if err := tx.SelectContext(ctx, &rows, `SELECT i.id, i.topic, i.attempts, i.lease_token, i.lease_ms, i.metadata, i.dedup_key
		FROM `+k+` WHERE i.namespace = ? FOR UPDATE`, append(args, namespace)...); err != nil {
		return nil, err
	}
	out := make(map[uint64]leaseState, len(rows))
	for _, r := range rows {
		out[r.ID] = r
	}
	return out, nil
}

func check(st map[uint64]leaseState, ref LeaseRef) error {
	s, ok := st[ref.Key]
	switch {
	case !ok:
		return ErrNotFound
	case s.Token != ref.Token:
		return ErrStaleLease
	}
	return nil
}

// Ack deletes the items whose refs carry their current lease token, in one
// transaction, and returns a per-ref error (nil for acked). An ack after the
// lease expired still succeeds while nobody has leased the item again.
// Dedup keys of acked items stay taken for dedupWindow.
func Ack(ctx context.Context, db *sqlx.DB, namespace string, refs []LeaseRef, dedupWindow time.Duration) ([]error, error) {
	results := make([]error, len(refs))
	err := schema.Retry(ctx, func() error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		keys := make([]uint64, len(refs))
		for i, r := range refs {
			keys[i] = r.Key
		}
		st, err := lockLeases(ctx, tx, namespace, keys)
		if err != nil {
			return err
		}
		var del []uint64
		var gone []leaseState
		for i, r := range refs {
			results[i] = check(st, r)
			if results[i] == nil {
				del = append(del, r.Key)
				gone = append(gone, st[r.Key])
				delete(st, r.Key) // a second ref to the same item finds it gone
			}
		}
		if err := tombstone(ctx, tx, namespace, gone, dedupWindow); err != nil {
			return err
		}
		if len(del) > 0 {
			if _, err := deleteItems(ctx, tx, del, ""); err != nil {
				return err
			}
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	return results, nil
}

// NackItems returns items to the ready set after their delay, in one
// transaction, recording the error and merging metadata. An item that has
// been delivered maxAttempts times (0: no limit) goes to the dead-letter
// table instead, with the nack's error and metadata, its dedup key kept
// taken for dedupWindow.
//
// A merge whose result would exceed MaxMetadataBytes fails the whole
// batch with ErrMetadataTooLarge and changes nothing. readyNow lists, per
// nack, the topic of an item that is ready again at once (no delay), for
// the caller to announce to the shard's owner; "" otherwise.
func NackItems(ctx context.Context, db *sqlx.DB, namespace string, nacks []Nack, maxAttempts int, dedupWindow time.Duration, now time.Time) (results []error, readyNow []string, err error) {
	results = make([]error, len(nacks))
	readyNow = make([]string, len(nacks))
	nowUS := now.UnixMicro()
	err = schema.Retry(ctx, func() error {
		clear(readyNow)
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		keys := make([]uint64, len(nacks))
		for i, n := range nacks {
			keys[i] = n.Key
		}
		st, err := lockLeases(ctx, tx, namespace, keys)
		if err != nil {
			return err
		}
		for i, n := range nacks {
			if results[i] = check(st, n.LeaseRef); results[i] != nil {
				continue
			}
			// Merge first: an item that dead-letters keeps the nack's
			// metadata and error, as one that stays does.
			meta, err := MergeMetadata(st[n.Key].Metadata, n.Metadata)
			if err != nil {
				return err
			}
			var lastErr any
			if n.Error != "" {
				lastErr = n.Error
			}
			dead := maxAttempts > 0 && st[n.Key].Attempts >= maxAttempts
			delay := n.Delay
			if n.Backoff {
				delay = Backoff(st[n.Key].Attempts)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE items SET lease_token = 0, leased_until = NULL, deliver_after = ?,
				last_error = COALESCE(?, last_error), metadata = ?, updated_at = ? WHERE id = ?`,
				nowUS+delay.Microseconds(), lastErr, meta, nowUS, n.Key); err != nil {
				return err
			}
			if dead {
				reason := n.Error
				if reason == "" {
					reason = fmt.Sprintf("nacked after %d deliveries", st[n.Key].Attempts)
				}
				if _, err := moveToDeadLetters(ctx, tx, []uint64{n.Key}, "1 = 1", nil, reason, dedupWindow, nowUS); err != nil {
					return err
				}
			} else if delay <= 0 {
				readyNow[i] = st[n.Key].Topic
			}
			delete(st, n.Key)
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, nil, fmt.Errorf("nack: %w", err)
	}
	return results, readyNow, nil
}

// Backoff is the default nack delay after attempts deliveries: 1s doubling
// per attempt up to 15 minutes, times a random factor in [0.5, 1) so
// items that failed together do not come back together.
func Backoff(attempts int) time.Duration {
	d := 15 * time.Minute
	if attempts >= 1 && attempts <= 10 {
		d = min(d, time.Second<<(attempts-1))
	} else if attempts < 1 {
		d = time.Second
	}
	return time.Duration(float64(d) * (0.5 + rand.Float64()/2))
}

// Extend moves a lease's expiry to now + lease (the item's own lease
// duration when lease is 0) and returns the new expiry.
func Extend(ctx context.Context, db *sqlx.DB, namespace string, ref LeaseRef, lease time.Duration, now time.Time) (time.Time, error) {
	var until int64
	err := schema.Retry(ctx, func() error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		st, err := lockLeases(ctx, tx, namespace, []uint64{ref.Key})
		if err != nil {
			return err
		}
		if err := check(st, ref); err != nil {
			return err
		}
		if lease == 0 {
			lease = time.Duration(st[ref.Key].LeaseMS) * time.Millisecond
		}
		until = now.Add(lease).UnixMicro()
		if _, err := tx.ExecContext(ctx, "UPDATE items SET deliver_after = ?, leased_until = ?, updated_at = ? WHERE id = ?",
			until, until, now.UnixMicro(), ref.Key); err != nil {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(until), nil
}

// MaxMetadataBytes bounds an item's metadata as stored (the JSON object
// MarshalMetadata writes); the column is sized for it.
const MaxMetadataBytes = 16 << 10

// MarshalMetadata stores metadata as a JSON object of strings, without
// HTML escaping: json.Marshal would store '<', '>' and '&' as six bytes
// each, so a value would grow on every merge. Enqueue, update and nack all
// store through it, so validation measures exactly what is stored.
func MarshalMetadata(m map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// MergeMetadata applies patch to a stored JSON object of strings: an empty
// value deletes its key. It returns nil for an empty result, and
// ErrMetadataTooLarge when the result would not fit MaxMetadataBytes
// (validating the patch alone does not bound the merge).
func MergeMetadata(stored []byte, patch map[string]string) ([]byte, error) {
	m := map[string]string{}
	if len(stored) > 0 {
		if err := json.Unmarshal(stored, &m); err != nil {
			return nil, fmt.Errorf("stored metadata is not a JSON object of strings: %w", err)
		}
	}
	if len(patch) == 0 {
		return stored, nil
	}
	for k, v := range patch {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	if len(m) == 0 {
		return nil, nil
	}
	out, err := MarshalMetadata(m)
	if err != nil {
		return nil, err
	}
	if len(out) > MaxMetadataBytes {
		return nil, fmt.Errorf("%w: merged with the item's metadata it would be %d bytes stored as a JSON object; at most %d allowed (delete keys with empty values to make room)",
			ErrMetadataTooLarge, len(out), MaxMetadataBytes)
	}
	return out, nil
}

// Tombstone keeps the dedup keys of items that are going away taken until
// now + window, in tx. A window of 0 keeps nothing.
func Tombstone(ctx context.Context, tx *sqlx.Tx, namespace, topic, dedupKey string, item uint64, window time.Duration) error {
	if window <= 0 || dedupKey == "" {
		return nil
	}
	return tombstoneAt(ctx, tx, namespace, topic, dedupKey, item, time.Now().Add(window).UnixMicro(), window)
}

func tombstoneAt(ctx context.Context, tx *sqlx.Tx, namespace, topic, dedupKey string, item uint64, expiresUS int64, window time.Duration) error {
	if window <= 0 || dedupKey == "" {
		return nil
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO dedup_tombstones (namespace, topic, dedup_key, item_id, expires_at) VALUES (?, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE item_id = VALUES(item_id), expires_at = GREATEST(expires_at, VALUES(expires_at))`,
		namespace, topic, dedupKey, item, expiresUS)
	return err
}

func tombstone(ctx context.Context, tx *sqlx.Tx, namespace string, gone []leaseState, window time.Duration) error {
	for _, g := range gone {
		if err := Tombstone(ctx, tx, namespace, g.Topic, g.DedupKey.String, g.ID, window); err != nil {
			return fmt.Errorf("dedup tombstone: %w", err)
		}
	}
	return nil
}
