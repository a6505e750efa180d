package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// Store runs the statements on one shard's queue tables. It holds nothing
// but the shard's database, which the caller picks (shardmap.Pool.Writer
// for writes, Pool.Primary for reads), so making one per call is free:
//
//	store.New(db).ItemAck(ctx, store.ItemAckParams{...})
type Store struct {
	db *sqlx.DB
}

// New returns the store of the shard behind db.
func New(db *sqlx.DB) Store { return Store{db: db} }

// inTx runs fn in a transaction and commits it, and runs it all again
// (fn included, up to five times: schema.Retry) when the transaction is
// rolled back by an InnoDB deadlock or lock wait timeout. fn must
// therefore start from scratch each time: reset what it fills in, and
// keep no state from an attempt that failed. It is the only place a
// transaction on the queue tables begins.
//
// A COMMIT that was sent and not answered returns ErrOutcomeUnknown
// (wrapping the driver's error): the transaction may have committed. An
// error before the COMMIT leaves nothing behind, since the server rolls
// back an open transaction when its connection goes.
func inTx(ctx context.Context, db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	return schema.Retry(ctx, func() error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fn(tx); err != nil {
			return err
		}
		return commitErr(tx.Commit())
	})
}

// commitErr is sentErr for database/sql's Tx.Commit, whose context error
// means the COMMIT was never sent: database/sql checks the transaction's
// context before it sends one, and go-sql-driver's COMMIT does not watch
// the context.
func commitErr(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return sentErr(err)
}

// sentErr marks err, the error of a statement that commits (a COMMIT, or
// a query whose transaction ends in one), as ErrOutcomeUnknown unless it
// shows the statement had no effect: the server answered with an error
// (*mysql.MySQLError), or nothing was sent (driver.ErrBadConn, which
// go-sql-driver returns only when it wrote nothing; database/sql's
// sql.ErrTxDone and sql.ErrConnDone). Everything else (mysql.ErrInvalidConn
// after a lost connection or a read timeout, a context that ended while
// the query ran) came after the statement was sent, with no answer.
func sentErr(err error) error {
	var me *mysql.MySQLError
	switch {
	case err == nil, errors.As(err, &me), errors.Is(err, driver.ErrBadConn),
		errors.Is(err, sql.ErrTxDone), errors.Is(err, sql.ErrConnDone):
		return err
	}
	return fmt.Errorf("%w: the write was sent to the shard and its answer was lost (%w)", ErrOutcomeUnknown, err)
}

// retryExec runs one statement outside a transaction, retried like inTx
// (a single statement is a transaction of its own), and returns the rows
// it affected.
func retryExec(ctx context.Context, db *sqlx.DB, q string, args []any) (int64, error) {
	var affected int64
	err := schema.Retry(ctx, func() error {
		res, err := db.ExecContext(ctx, q, args...)
		if err != nil {
			return err
		}
		affected, err = res.RowsAffected()
		return err
	})
	return affected, err
}

// NewToken returns a random non-zero lease token: a delivery's own (the
// receipt handle).
func NewToken() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if t := binary.LittleEndian.Uint64(b[:]); t != 0 {
			return t
		}
	}
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// stmt builds a statement whose size depends on a batch: per-row values as
// "CASE id WHEN ? THEN ? ... END" and an "IN (...)" list, with its
// arguments in order. One UPDATE sets a different value on each row of a
// batch this way, which MariaDB (no UPDATE ... FROM VALUES) cannot
// otherwise do in one round trip.
type stmt struct {
	sql  strings.Builder
	args []any
}

// add appends SQL text and its arguments.
func (q *stmt) add(sql string, args ...any) *stmt {
	q.sql.WriteString(sql)
	q.args = append(q.args, args...)
	return q
}

// caseByID appends "CASE id WHEN ids[i] THEN vals[i] ... ELSE def END".
func (q *stmt) caseByID(ids []uint64, vals []any, def string) *stmt {
	q.sql.WriteString("CASE id")
	for i, id := range ids {
		q.sql.WriteString(" WHEN ? THEN ?")
		q.args = append(q.args, id, vals[i])
	}
	q.sql.WriteString(" ELSE " + def + " END")
	return q
}

// in appends " IN (?, ...)" over ids.
func (q *stmt) in(ids []uint64) *stmt {
	q.sql.WriteString(" IN (")
	for i, id := range ids {
		if i > 0 {
			q.sql.WriteByte(',')
		}
		q.sql.WriteByte('?')
		q.args = append(q.args, id)
	}
	q.sql.WriteByte(')')
	return q
}
