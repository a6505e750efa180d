package replication

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"
)

// Admin runs replication admin statements on one server (root connection).
// All admin statements that must not replicate run with SET SESSION
// sql_log_bin=0 (GTID strict mode otherwise breaks replication): a CREATE
// USER on a replica would get a GTID of the replica's own server id, and the
// next transaction from the primary with the same sequence number would
// stop the replica's SQL thread (error 1950), while on a primary it would
// replay on replicas that already ran it.
//
// An Admin is safe for concurrent use, but the controller must not run two
// role changes (Promote, ReplicateFrom, RejoinAsReplica) on one server at
// once: each is a sequence of statements, not a transaction.
type Admin struct {
	db     *sql.DB
	addr   string
	flavor Flavor
	owned  bool // Close closes db
	// multi: db's connections take several statements per call (Open
	// sets it), so exec sends a step's statements in one round trip: a
	// promotion across the WAN spent ~40 ms per statement.
	multi bool
}

// New wraps db, a connection pool to one server as an account with SUPER
// (or at least REPLICATION SLAVE ADMIN, BINLOG ADMIN, CREATE USER,
// READ ONLY ADMIN and the grants it hands out). addr is host:port at which
// the other servers of the shard reach this one, which may differ from the
// address db dials (a proxy, another region's view). Close leaves db open.
func New(db *sql.DB, addr string, flavor Flavor) (*Admin, error) {
	if db == nil {
		return nil, errors.New("replication: New: db is nil")
	}
	if flavor == nil {
		return nil, errors.New("replication: New: flavor is nil; use MariaDB or DetectFlavor")
	}
	if _, _, err := splitAddr(addr); err != nil {
		return nil, err
	}
	return &Admin{db: db, addr: addr, flavor: flavor}, nil
}

// Open connects to the server of a go-sql-driver/mysql DSN (TCP) with the
// MariaDB flavor; the DSN's address is also the address others reach it
// by. Like sql.Open it does not dial yet; the first call does. Use
// DetectFlavor and New to check the flavor or to give another address.
func Open(dsn string) (*Admin, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("replication: Open: %w", err)
	}
	if cfg.Net != "tcp" {
		return nil, fmt.Errorf("replication: Open: DSN network is %q; replicas need a TCP address (use New to give one)", cfg.Net)
	}
	cfg.MultiStatements = true
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("replication: Open: %w", err)
	}
	a, err := New(sql.OpenDB(connector), cfg.Addr, MariaDB)
	if err != nil {
		return nil, err
	}
	a.owned, a.multi = true, true
	return a, nil
}

// Close releases the connection pool if Open created it.
func (a *Admin) Close() error {
	if !a.owned {
		return nil
	}
	return a.db.Close()
}

// DB is the connection pool the Admin runs its statements on, for a
// statement of the caller's on the same server that should not pay for a
// connection of its own (a failover's first commit on the new primary:
// a new connection across the WAN is three round trips before it).
func (a *Admin) DB() *sql.DB { return a.db }

// Addr is the address other servers reach this one at.
func (a *Admin) Addr() string { return a.addr }

// Flavor is the statement set this Admin uses.
func (a *Admin) Flavor() Flavor { return a.flavor }

// Credentials name a MariaDB account.
type Credentials struct {
	// User is the account name; required, at most 80 characters.
	User string
	// Password is required: these accounts are reachable from the network.
	Password string
	// Host is the account's host part. Default "%" (any host), because
	// replicas and application hosts live in other regions.
	Host string
	// Database is, for the application account only, the database it may
	// read and change. Default "triage". Ignored for the replication
	// account, whose privilege is server-wide.
	Database string
	// RequireSSL makes EnsureUsers create the account REQUIRE SSL, so the
	// server refuses its login over plain TCP. Default false, which leaves
	// an existing account's requirement as it is.
	RequireSSL bool
	// TLS, for the replication account only, makes ReplicateFrom and
	// RejoinAsReplica point replicas at their primary over TLS. Default
	// nil: plain TCP.
	TLS *TLS
}

var (
	validHost     = regexp.MustCompile(`^[A-Za-z0-9._%:-]{1,255}$`)
	validDatabase = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)
)

func (c Credentials) host() string     { return cmp.Or(c.Host, "%") }
func (c Credentials) database() string { return cmp.Or(c.Database, "triage") }

// validate rejects what cannot be quoted the same way under every sql_mode,
// so that no value is ever spliced into a statement unchecked.
func (c Credentials) validate(role string) error {
	switch {
	case c.User == "" || utf8.RuneCountInString(c.User) > 80:
		return fmt.Errorf("replication: %s user %q: want 1 to 80 characters", role, c.User)
	case c.Password == "":
		return fmt.Errorf("replication: %s user %q: a password is required", role, c.User)
	case !plain(c.User) || !plain(c.Password):
		return fmt.Errorf("replication: %s user %q: user and password must be valid UTF-8 without backslashes or control characters", role, c.User)
	case !validHost.MatchString(c.host()):
		return fmt.Errorf("replication: %s user %q: host %q: want 1-255 of letters, digits, '.', '_', '%%', ':', '-'", role, c.User, c.Host)
	case !validDatabase.MatchString(c.database()):
		return fmt.Errorf("replication: %s user %q: database %q: want 1-64 of letters, digits, '_'", role, c.User, c.Database)
	case c.TLS != nil:
		return c.TLS.Validate()
	}
	return nil
}

func plain(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return false
		}
	}
	return true
}

// EnsureUsers creates, or brings up to date, the replication account
// (REPLICATION SLAVE) and the application account (SELECT, INSERT, UPDATE,
// DELETE on its database). The application account is stripped of SUPER
// and READ ONLY ADMIN, because either lets it write through read_only and
// read_only is the whole fence of a deposed primary or a replica. Run it on
// every server of a shard: it runs with sql_log_bin=0, so it never
// replicates and never creates a GTID. Passwords of existing accounts are
// reset to the given ones, so that a replica can always log in with repl.
func (a *Admin) EnsureUsers(ctx context.Context, repl, app Credentials) error {
	if err := repl.validate("replication"); err != nil {
		return err
	}
	if err := app.validate("application"); err != nil {
		return err
	}
	if repl.User == app.User && repl.host() == app.host() {
		return fmt.Errorf("replication: the replication and application accounts must differ (both %q@%q)", repl.User, repl.host())
	}
	return a.session(ctx, func(c *sql.Conn) error {
		// Statements carry passwords, so errors name the accounts instead.
		return a.exec(ctx, c, fmt.Sprintf("ensure users %q and %q", repl.User, app.User), a.flavor.Users(repl, app)...)
	})
}

// SetReadOnly fences (on) or unfences the server. read_only stops every
// account without READ ONLY ADMIN (the application's) from writing, and
// lets replication and root through: MariaDB has no super_read_only.
func (a *Admin) SetReadOnly(ctx context.Context, on bool) error {
	return a.session(ctx, func(c *sql.Conn) error {
		if on {
			return a.fence(ctx, c)
		}
		return a.exec(ctx, c, "set read_only "+onOff(on), a.flavor.SetReadOnly(on))
	})
}

// fenceLockWait bounds how long read_only=1 waits for the commits in
// progress (lock_wait_timeout, in seconds).
const fenceLockWait = 2

// fence sets read_only=1 on c's server within fenceLockWait. read_only
// waits for the commits in progress, and on a deposed primary woken
// after its failover (paused, or cut off and back) a commit may be
// waiting for a semi-sync acknowledgement that no replica will ever
// send: without a bound the statement would hang past the driver's read
// timeout, again on every attempt, each leaving a server thread behind.
// Such a server cannot commit anything (no replica receives from it), and
// its waiting transactions are prepared, not committed: a restart with
// RejoinArgs rolls them back, after which it is fenced from the start and
// rejoins. Ending the waiters instead would commit them there and fork
// the shard's history, so ErrCommitsWaiting says to restart it.
func (a *Admin) fence(ctx context.Context, c *sql.Conn) error {
	if _, err := c.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", fenceLockWait)); err != nil {
		return fmt.Errorf("replication: fence %s: %w", a.addr, err)
	}
	err := a.exec(ctx, c, "fence (read_only=1)", a.flavor.SetReadOnly(true))
	if _, rerr := c.ExecContext(ctx, "SET SESSION lock_wait_timeout = DEFAULT"); rerr != nil && err == nil {
		err = fmt.Errorf("replication: fence %s: restore lock_wait_timeout: %w", a.addr, rerr)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1205 {
		return fmt.Errorf("%w: %s: read_only=1 waited %ds for commits in progress (%w)", ErrCommitsWaiting, a.addr, fenceLockWait, err)
	}
	return err
}

// SemiSync is a server's semi-synchronous replication state.
type SemiSync struct {
	// PrimaryEnabled and ReplicaEnabled are rpl_semi_sync_master_enabled
	// and rpl_semi_sync_slave_enabled.
	PrimaryEnabled, ReplicaEnabled bool
	// WaitPoint is AFTER_SYNC when configured by EnableSemiSync.
	WaitPoint string
	// Timeout is how long a commit waits for a replica's acknowledgement
	// before the primary falls back to asynchronous replication. NoFallback
	// (as EnableSemiSync sets it) means never.
	Timeout time.Duration
	// WaitNoReplica is rpl_semi_sync_master_wait_no_slave: commits keep
	// waiting while no replica is connected. ON with NoFallback, so a
	// primary that lost every replica commits nothing.
	WaitNoReplica bool
	// Active is Rpl_semi_sync_master_status: whether commits currently wait
	// for acknowledgements. It turns OFF silently after a timeout and back
	// ON once a semi-sync replica has caught up.
	Active bool
	// Clients is the number of connected semi-sync replicas.
	Clients int
	// WaitSessions is Rpl_semi_sync_master_wait_sessions: commits waiting
	// for an acknowledgement right now.
	WaitSessions int
	// YesTx and NoTx count commits acknowledged by a replica and commits
	// that gave up waiting (acknowledged to the client with no replica
	// having them) since the server started.
	YesTx, NoTx uint64
	// ReplicaActive is Rpl_semi_sync_slave_status: this server's IO thread
	// is connected as a semi-sync replica and sends acknowledgements.
	ReplicaActive bool
}

// FellBack reports what the alarm watches: semi-sync is enabled on this
// primary but inactive, so commits are being acknowledged to clients
// without any replica having them, and a failover now can lose them.
func (s SemiSync) FellBack() bool { return s.PrimaryEnabled && !s.Active }

// Blocked reports what the other alarm watches: a semi-sync primary with no
// replica connected. With NoFallback its commits wait until a replica comes
// back (callers see their own deadline expire, never OK), which is the
// price of never acknowledging a write that only this server has.
func (s SemiSync) Blocked() bool { return s.PrimaryEnabled && s.Clients == 0 }

// NoFallback is the semi-sync timeout EnableSemiSync uses: a century, so
// a primary never falls back to asynchronous replication and never
// acknowledges a commit that no replica has. MariaDB has no "off" value
// for the fallback; a timeout nobody lives to see is the same.
const NoFallback = 100 * 365 * 24 * time.Hour

// EnableSemiSync configures semi-synchronous replication for the server's
// role: the primary waits, after syncing its binary log and before
// committing in InnoDB (AFTER_SYNC, so no other session sees a transaction
// a failover could lose), for one replica's acknowledgement; a replica
// acknowledges. The primary never falls back to asynchronous replication:
// the timeout is NoFallback and rpl_semi_sync_master_wait_no_slave is ON,
// so a primary cut off from every replica completes no commit (its
// clients time out; nothing is acknowledged that a failover could lose).
// Both roles get the same settings, so a promoted replica needs only
// EnableSemiSync(ctx, true).
//
// A replica's setting takes effect when its IO thread connects, so a
// running IO thread is restarted here. It is not restarted when the SQL
// thread is stopped, because starting a thread of a fully stopped replica
// discards its relay log; the setting then applies at the next START SLAVE.
func (a *Admin) EnableSemiSync(ctx context.Context, primary bool) error {
	return a.session(ctx, func(c *sql.Conn) error {
		if err := a.exec(ctx, c, "configure semi-sync", a.flavor.SemiSync(primary, NoFallback)...); err != nil {
			return err
		}
		if primary {
			return nil
		}
		st, err := a.status(ctx, c)
		if err != nil {
			return err
		}
		ss, err := a.semiSync(ctx, c)
		if err != nil {
			return err
		}
		if st.Role != RoleReplica || !st.IOThreadRunning() || !st.SQLRunning || ss.ReplicaActive {
			return nil
		}
		return a.exec(ctx, c, "restart IO thread for semi-sync", a.flavor.StopReplicaIO(), a.flavor.StartReplicaIO())
	})
}

// SemiSyncStatus reads the server's semi-sync settings and counters.
func (a *Admin) SemiSyncStatus(ctx context.Context) (SemiSync, error) {
	return a.semiSync(ctx, a.db)
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (a *Admin) semiSync(ctx context.Context, q queryer) (SemiSync, error) {
	vars, err := a.nameValues(ctx, q, a.flavor.SemiSyncVariables())
	if err != nil {
		return SemiSync{}, err
	}
	status, err := a.nameValues(ctx, q, a.flavor.SemiSyncStatus())
	if err != nil {
		return SemiSync{}, err
	}
	n := a.flavor.Names()
	var s SemiSync
	var errs []error
	num := func(m map[string]string, name string) uint64 {
		v, err := strconv.ParseUint(m[name], 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s = %q: %w", name, m[name], err))
		}
		return v
	}
	s.PrimaryEnabled = vars[n.SemiSyncPrimaryEnabled] == "ON"
	s.ReplicaEnabled = vars[n.SemiSyncReplicaEnabled] == "ON"
	s.WaitPoint = vars[n.SemiSyncWaitPoint]
	s.WaitNoReplica = vars[n.SemiSyncWaitNoReplica] == "ON"
	s.Timeout = time.Duration(num(vars, n.SemiSyncTimeout)) * time.Millisecond
	s.Active = status[n.SemiSyncActive] == "ON"
	s.Clients = int(num(status, n.SemiSyncClients))
	s.WaitSessions = int(num(status, n.SemiSyncWaitSessions))
	s.YesTx = num(status, n.SemiSyncYesTx)
	s.NoTx = num(status, n.SemiSyncNoTx)
	s.ReplicaActive = status[n.SemiSyncReplicaActive] == "ON"
	if err := errors.Join(errs...); err != nil {
		return SemiSync{}, fmt.Errorf("replication: semi-sync status of %s: %w", a.addr, err)
	}
	return s, nil
}

func (a *Admin) nameValues(ctx context.Context, q queryer, query string) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("replication: %s on %s: %w", query, a.addr, err)
	}
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("replication: %s on %s: %w", query, a.addr, err)
		}
		m[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("replication: %s on %s: %w", query, a.addr, err)
	}
	return m, nil
}

// session runs fn on one connection whose statements stay out of the
// binary log. The connection goes back to the pool with sql_log_bin
// restored, or is discarded, so that no later user of a shared pool writes
// unlogged (and thus unreplicated) rows.
func (a *Admin) session(ctx context.Context, fn func(*sql.Conn) error) (err error) {
	c, err := a.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("replication: connect to %s: %w", a.addr, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, rerr := c.ExecContext(rctx, "SET SESSION sql_log_bin = 1"); rerr != nil {
			_ = c.Raw(func(any) error { return driver.ErrBadConn }) // discard it
		}
		_ = c.Close()
	}()
	if _, err := c.ExecContext(ctx, "SET SESSION sql_log_bin = 0"); err != nil {
		return fmt.Errorf("replication: SET sql_log_bin = 0 on %s: %w", a.addr, err)
	}
	return fn(c)
}

// exec runs stmts in order. Errors name what was being done, never the
// statement, which may hold a password.
func (a *Admin) exec(ctx context.Context, c *sql.Conn, what string, stmts ...string) error {
	if a.multi && len(stmts) > 1 {
		stmts = []string{strings.Join(stmts, ";\n")}
	}
	for _, s := range stmts {
		if _, err := c.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("replication: %s on %s: %w", what, a.addr, err)
		}
	}
	return nil
}

// splitAddr parses "host:port".
func splitAddr(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("replication: address %q: want host:port: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("replication: address %q: port must be 1-65535", addr)
	}
	if !validHost.MatchString(host) || strings.Contains(host, "%") {
		return "", 0, fmt.Errorf("replication: address %q: host must be a name or IP address", addr)
	}
	return host, port, nil
}
