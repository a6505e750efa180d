package store

import (
	"strconv"
	"unsafe"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

// Enqueue rows as literal SQL. An insert's rows are written into the
// statement text as literals (numbers in decimal, names, keys and small
// payloads as hex strings) rather than as placeholders the driver fills
// in: the driver's interpolation converted, escaped and copied every
// value (a seventh of the Triage process's CPU in make bench's batch-100
// enqueue), and MariaDB lexes a hex string without unescaping it or
// converting its character set (the statement's parse was a quarter of
// mariadbd's CPU on that path). A hex literal holds only [0-9a-f], so no
// value can end it early, whatever bytes it carries.
//
// A value longer than maxHexLiteral stays a placeholder (sqlValues.args),
// which the driver sends escaped: hex doubles a value's bytes on the wire,
// and an 8 MiB payload in hex would not fit MariaDB's default 16 MiB
// max_allowed_packet. The text holds no '?' of its own, so the driver's
// interpolation finds only those placeholders.
const maxHexLiteral = 16 << 10

// sqlValues is a statement being built around the VALUES lists of
// multi-row INSERTs: its text, the arguments of the placeholders in it,
// the rows of the list being written and the values of the row being
// written (cols, for the commas), and a bound on the bytes the
// placeholders' values send (wire), to keep a statement under the packet
// limit.
type sqlValues struct {
	text []byte
	args []any
	rows int
	cols int
	wire int
}

// raw appends SQL text.
func (v *sqlValues) raw(s string) { v.text = append(v.text, s...) }

// begin starts a VALUES list after SQL text s (an INSERT's head).
func (v *sqlValues) begin(s string) {
	v.raw(s)
	v.rows = 0
}

// String is the text built, without a copy (an at-once insert's query
// is up to 8 MiB): v must not be written to while the string is in use.
func (v *sqlValues) String() string { return unsafe.String(unsafe.SliceData(v.text), len(v.text)) }

func (v *sqlValues) reset() {
	v.text, v.args, v.rows, v.wire = v.text[:0], v.args[:0], 0, 0
}

// size is a bound on the bytes the statement's values take on the wire.
func (v *sqlValues) size() int { return len(v.text) + v.wire }

// row starts a row, after a "," when it is not the list's first; end
// closes it.
func (v *sqlValues) row() {
	if v.rows > 0 {
		v.text = append(v.text, ',')
	}
	v.text = append(v.text, '(')
	v.rows++
	v.cols = 0
}

func (v *sqlValues) end() { v.text = append(v.text, ')') }

// next starts a value of the row, after a "," when it is not the first.
func (v *sqlValues) next() {
	if v.cols > 0 {
		v.text = append(v.text, ',')
	}
	v.cols++
}

func (v *sqlValues) int(n int64) {
	v.next()
	v.text = strconv.AppendInt(v.text, n, 10)
}

func (v *sqlValues) uint(n uint64) {
	v.next()
	v.text = strconv.AppendUint(v.text, n, 10)
}

func (v *sqlValues) null() {
	v.next()
	v.text = append(v.text, "NULL"...)
}

// intOrNull writes n, or NULL for 0.
func (v *sqlValues) intOrNull(n int64) {
	if n == 0 {
		v.null()
		return
	}
	v.int(n)
}

// bytes writes b as X'…'; nil is an empty string, not NULL.
func (v *sqlValues) bytes(b []byte) { hexValue(v, b) }

// str writes s as bytes does (names, keys and trace contexts: their
// columns are binary or ASCII, so MariaDB stores the bytes as given).
func (v *sqlValues) str(s string) { hexValue(v, s) }

// bytesOrNull and strOrNull write NULL for an empty value.
func (v *sqlValues) bytesOrNull(b []byte) {
	if len(b) == 0 {
		v.null()
		return
	}
	v.bytes(b)
}

func (v *sqlValues) strOrNull(s string) {
	if s == "" {
		v.null()
		return
	}
	v.str(s)
}

const hexDigits = "0123456789abcdef"

// hexValue writes s as X'…', or as a placeholder when it is longer than
// maxHexLiteral.
func hexValue[T string | []byte](v *sqlValues, s T) {
	v.next()
	if len(s) > maxHexLiteral {
		v.text = append(v.text, '?')
		v.args = append(v.args, []byte(s))
		v.wire += 2 * len(s) // escaped, at most
		return
	}
	v.text = append(v.text, "X'"...)
	for i := 0; i < len(s); i++ {
		v.text = append(v.text, hexDigits[s[i]>>4], hexDigits[s[i]&0x0f])
	}
	v.text = append(v.text, '\'')
}

// item appends one row of insertItemsPrefix's VALUES: (id, namespace,
// topic, priority, deliver_after, enqueued_at, lease_ms, expires_at,
// dedup_key, payload, metadata, updated_at, traceparent, attempts). No TTL,
// dedup key, metadata or trace context is NULL; an empty payload is not.
func (v *sqlValues) item(b *peerv1.EnqueueBatch, it *peerv1.BufferedItem, nowUS int64, traceparent string) {
	v.row()
	v.uint(it.Key)
	v.str(b.Namespace)
	v.str(b.Topic)
	v.int(int64(it.Priority))
	v.int(it.DeliverAfterUs)
	v.int(b.EnqueuedAtUs)
	v.uint(uint64(it.LeaseMs))
	v.intOrNull(it.ExpiresAtUs)
	v.strOrNull(it.DedupKey)
	v.bytes(it.Payload)
	v.bytesOrNull(it.Metadata)
	v.int(nowUS)
	v.strOrNull(traceparent)
	v.int(0) // attempts
	v.end()
}

// batchRecord appends one row of batchRecordPrefix's VALUES: (batch_id,
// applied_at, content_hash, outcome), no outcome being NULL.
func (v *sqlValues) batchRecord(id uint64, nowUS int64, hash, outcome []byte) {
	v.row()
	v.uint(id)
	v.int(nowUS)
	v.bytes(hash)
	v.bytesOrNull(outcome)
	v.end()
}

// batchRecordWire bounds the bytes sqlValues.batchRecord adds without an
// outcome: two numbers and a SHA-256 in hex.
const batchRecordWire = 2*20 + 2*32 + 16

// itemWire bounds the bytes sqlValues.item adds for it.
func itemWire(b *peerv1.EnqueueBatch, it *peerv1.BufferedItem) int {
	return 2*(len(b.Namespace)+len(b.Topic)+len(it.DedupKey)+len(it.Payload)+len(it.Metadata)) + 512
}
