package shardmap

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/triage-queue/triage/schema"
)

// ErrNoAppUser is what NewAppPool's pool answers when its credentials name
// no user: the application account is never assumed to be root, which can
// write through the read_only fence.
var ErrNoAppUser = errors.New("no user for the application account: name the account with SELECT, INSERT, UPDATE " +
	"and DELETE on the shard database that the router, enqueuer and dequeuer log in as (provision.EnsureAccounts creates it)")

// NewAppPool returns an empty pool for the application account, the one
// the router, enqueuer and dequeuer write the queue through. Unlike
// NewPool's, it assumes no user (ErrNoAppUser), and it holds its sessions
// to the server-side bounds of schema.LockWaitTimeout and
// schema.StatementTimeout, below the driver's schema.ReadTimeout, so that
// a statement the process gave up on fails on the server too. Every
// connection it opens is checked (schema.CheckGrants) before it is used:
// an account that can write through read_only, such as root, gets
// schema.ErrPrivilegedAccount instead of a session, since the fence of a
// deposed primary would not stop its writes. A session's global
// privileges and roles are fixed when it logs in, so checking each new
// connection checks every session the pool writes through.
func NewAppPool(cred Credentials) *Pool {
	p := newPool(cred)
	p.app = &appSessions{lockWait: schema.LockWaitTimeout, statement: schema.StatementTimeout, read: schema.ReadTimeout}
	return p
}

// appSessions is how an application pool sets up its sessions.
type appSessions struct {
	// lockWait and statement are the server's bounds on a statement
	// (innodb_lock_wait_timeout, max_statement_time), read the driver's;
	// tests shorten them.
	lockWait, statement, read time.Duration
}

// apply sets the session variables and the driver's timeouts in c.
// innodb_lock_wait_timeout takes whole seconds, at least 1.
func (a *appSessions) apply(c *mysql.Config) {
	c.ReadTimeout, c.WriteTimeout = a.read, a.read
	c.Params["innodb_lock_wait_timeout"] = strconv.Itoa(max(1, int(a.lockWait/time.Second)))
	c.Params["max_statement_time"] = strconv.FormatFloat(a.statement.Seconds(), 'f', -1, 64)
}

// checkedConnector opens the driver's connections and refuses each one
// whose account can write through read_only.
type checkedConnector struct {
	driver.Connector
	addr string
}

// Connect implements driver.Connector.
func (c checkedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	grants, err := showGrants(ctx, conn)
	if err == nil {
		err = schema.CheckGrants(grants)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("shard primary %s: application account: %w", c.addr, err)
	}
	return conn, nil
}

// showGrants runs schema.ShowGrants on a connection database/sql has not
// seen yet.
func showGrants(ctx context.Context, conn driver.Conn) ([]string, error) {
	q, ok := conn.(driver.QueryerContext)
	if !ok {
		return nil, errors.New("read the account's grants: the driver's connection cannot query")
	}
	rows, err := q.QueryContext(ctx, schema.ShowGrants, nil)
	if err != nil {
		return nil, fmt.Errorf("read the account's grants: %w", err)
	}
	defer rows.Close()
	var grants []string
	dest := make([]driver.Value, len(rows.Columns()))
	for {
		switch err := rows.Next(dest); {
		case errors.Is(err, io.EOF):
			return grants, nil
		case err != nil:
			return nil, fmt.Errorf("read the account's grants: %w", err)
		}
		switch v := dest[0].(type) {
		case []byte:
			grants = append(grants, string(v))
		case string:
			grants = append(grants, v)
		}
	}
}
