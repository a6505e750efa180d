package shardmap

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// Pool keeps one connection pool per shard primary. When the map moves a
// shard to a new primary, the next call opens a pool to it; the pool to
// the former primary is closed by Prune once it has been idle for a
// while, and every pool with the Pool.
type Pool struct {
	cred Credentials
	// app, for NewAppPool's pools, sets up the application account's
	// sessions; nil for NewPool's.
	app *appSessions

	mu  sync.Mutex
	dbs map[string]*poolEntry // by DSN
	// servers names the server (host:port) of each open pool.
	servers map[*sqlx.DB]string
	epochs  map[epochKey]time.Time
	// dsns caches DSN by what it depends on besides cred: every write
	// asks (Writer), and formatting one (mysql.Config.FormatDSN and its
	// parameter map) costs more than a map lookup.
	dsns   map[dsnKey]string
	closed bool
}

// poolEntry is one primary's pool and whether it was handed out since
// the last Prune.
type poolEntry struct {
	db   *sqlx.DB
	used bool
}

// dsnKey is what a shard's DSN depends on besides the pool's credentials.
type dsnKey struct{ primary, database string }

// ErrPoolClosed is what a Pool answers once closed. Without it, a
// goroutine still winding down when its node stopped (a node's Stop
// cancels the run context and closes the pools without waiting for every
// loop) opened a fresh pool to the shard that nobody closed: the client
// package's leak check found two left behind.
var ErrPoolClosed = errors.New("shardmap: connection pool closed")

// epochKey is a (primary, epoch) pair whose fence check passed, and when.
type epochKey struct {
	dsn   string
	epoch uint64
}

// EpochRecheck is how long a passed epoch check of a (primary, map epoch)
// pair stands before Writer reads shard_meta again. The check is for a
// process that missed a failover; the map's own freshness (MaxStaleness)
// and the deposed primary's read_only and semi-sync do the rest.
const EpochRecheck = time.Second

// NewPool returns an empty pool for an account that may hold more than
// the application account: the admin account, which runs migrations, or a
// test's. The user defaults to root. The pool of the router, enqueuer and
// dequeuer is NewAppPool's. cred should have been resolved
// (Credentials.Resolve) when it names a password file or variable.
func NewPool(cred Credentials) *Pool {
	if cred.User == "" {
		cred.User = "root"
	}
	return newPool(cred)
}

func newPool(cred Credentials) *Pool {
	return &Pool{cred: cred, dbs: map[string]*poolEntry{}, servers: map[*sqlx.DB]string{}, epochs: map[epochKey]time.Time{}, dsns: map[dsnKey]string{}}
}

// DSN returns the data source name for a shard's primary. Queue
// transactions run at READ COMMITTED: gap locks of REPEATABLE READ only add
// deadlocks on a queue table.
func (p *Pool) DSN(s Shard) string {
	k := dsnKey{primary: s.Primary, database: s.Database}
	p.mu.Lock()
	dsn, ok := p.dsns[k]
	p.mu.Unlock()
	if ok {
		return dsn
	}
	dsn = p.formatDSN(s)
	p.mu.Lock()
	p.dsns[k] = dsn
	p.mu.Unlock()
	return dsn
}

func (p *Pool) formatDSN(s Shard) string {
	c := mysql.NewConfig()
	p.cred.Apply(c)
	c.Net = "tcp"
	c.Addr = p.Addr(s.Primary)
	c.DBName = s.Database
	c.InterpolateParams = true
	c.MultiStatements = true
	c.Timeout = 2 * time.Second
	c.ReadTimeout = schema.ReadTimeout
	c.WriteTimeout = schema.ReadTimeout
	// MariaDB 10.x names it tx_isolation (MySQL 8: transaction_isolation).
	c.Params = map[string]string{"tx_isolation": "'READ-COMMITTED'"}
	if p.app != nil {
		p.app.apply(c)
	}
	return c.FormatDSN()
}

// Addr returns the address to dial for addr (see DialVia).
func (p *Pool) Addr(addr string) string {
	if via, ok := p.cred.DialVia[addr]; ok {
		return via
	}
	return addr
}

// Primary returns the pool for shard id's current primary in m.
func (p *Pool) Primary(m *Map, id uint32) (*sqlx.DB, Shard, error) {
	db, s, _, err := p.primary(m, id)
	return db, s, err
}

// primary is Primary, and the pool's DSN.
func (p *Pool) primary(m *Map, id uint32) (*sqlx.DB, Shard, string, error) {
	s, ok := m.Shard(id)
	if !ok {
		return nil, Shard{}, "", fmt.Errorf("shard %d is not in shard map version %d", id, m.Version)
	}
	dsn := p.DSN(s)
	db, err := p.open(dsn)
	return db, s, dsn, err
}

// Writer returns the pool for shard id's current primary after checking
// that the shard may be written now (Source.Writable) and that the primary
// is not at a later failover epoch than the map (see CheckEpoch): every
// write path goes through it, so a fenced or possibly deposed primary gets
// no writes, and neither does a primary from a process that missed a
// failover.
func (p *Pool) Writer(src Source, id uint32) (*sqlx.DB, error) {
	if err := src.Writable(id); err != nil {
		return nil, err
	}
	db, s, dsn, err := p.primary(src.Current(), id)
	if err != nil {
		return nil, err
	}
	if err := p.checkEpoch(db, s, dsn); err != nil {
		return nil, err
	}
	return db, nil
}

// The fence table, written by the failover controller (StoreEpoch) and
// read by every writer; its DDL is migration 0006.
const (
	epochQuery = "SELECT epoch FROM shard_meta WHERE id = 1"
	epochStore = "INSERT INTO `%s`.shard_meta (id, epoch) VALUES (1, ?) ON DUPLICATE KEY UPDATE epoch = GREATEST(epoch, VALUES(epoch))"
)

var plainDatabase = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// errNoSuchTable is ER_NO_SUCH_TABLE: a shard not migrated to 0006 yet.
const errNoSuchTable = 1146

// checkEpoch compares the epoch stored on the primary (shard_meta) with the
// map's. A primary ahead of the map was promoted by a failover this process
// has not seen: its map is stale, whatever address it names. No row means
// epoch 0 (never failed over). A passed check of a (primary, epoch) pair
// stands for EpochRecheck. A failed read refuses the write too: a primary
// that cannot answer one indexed read would not take the write either.
func (p *Pool) checkEpoch(db *sqlx.DB, s Shard, dsn string) error {
	key := epochKey{dsn: dsn, epoch: s.Epoch}
	p.mu.Lock()
	at, ok := p.epochs[key]
	p.mu.Unlock()
	if ok && time.Since(at) < EpochRecheck {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), EpochRecheck)
	defer cancel()
	var stored uint64
	err := db.QueryRowContext(ctx, epochQuery).Scan(&stored)
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, sql.ErrNoRows), errors.As(err, &me) && me.Number == errNoSuchTable:
		stored = 0
	case err != nil:
		return fmt.Errorf("%w: shard %d: read the failover epoch of %s: %v", ErrNotWritable, s.ID, s.Primary, err)
	}
	if stored > s.Epoch {
		return fmt.Errorf("%w: shard %d's primary %s is at failover epoch %d, this process's shard map at epoch %d: the map is stale",
			ErrNotWritable, s.ID, s.Primary, stored, s.Epoch)
	}
	p.mu.Lock()
	p.epochs[key] = time.Now()
	p.mu.Unlock()
	return nil
}

// StoreEpoch records on a newly promoted primary (db: a root connection,
// database: the shard's schema) that it serves the shard from epoch on.
// The failover controller calls it before publishing the map that names
// the primary, so that no writer with an older map writes there. It never
// lowers a stored epoch. The row replicates to the replicas.
func StoreEpoch(ctx context.Context, db *sql.DB, database string, epoch uint64) error {
	if !plainDatabase.MatchString(database) {
		return fmt.Errorf("store failover epoch: database %q: want 1-64 of letters, digits, '_'", database)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(epochStore, database), epoch); err != nil {
		return fmt.Errorf("store failover epoch %d in %s.shard_meta: %w", epoch, database, err)
	}
	return nil
}

func (p *Pool) open(dsn string) (*sqlx.DB, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrPoolClosed
	}
	if e, ok := p.dbs[dsn]; ok {
		e.used = true
		return e.db, nil
	}
	db, err := p.openDB(dsn)
	if err != nil {
		return nil, err
	}
	n := p.cred.MaxOpenConns
	if n == 0 {
		n = 64
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	db.SetConnMaxIdleTime(5 * time.Minute)
	p.dbs[dsn] = &poolEntry{db: db, used: true}
	if cfg, err := mysql.ParseDSN(dsn); err == nil {
		p.servers[db] = cfg.Addr
	}
	return db, nil
}

// ServerOf names the server (host:port) behind a pool the Pool handed
// out, or "" for one it did not or closed since. Clock.Server takes it,
// so that the pools of one server's shard databases share its clock.
func (p *Pool) ServerOf(db *sqlx.DB) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.servers[db]
}

// openDB opens dsn's connection pool; an application pool's checks every
// connection's account (checkedConnector).
func (p *Pool) openDB(dsn string) (*sqlx.DB, error) {
	if p.app == nil {
		return sqlx.Open("mysql", dsn)
	}
	if p.cred.User == "" {
		return nil, ErrNoAppUser
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sqlx.NewDb(sql.OpenDB(checkedConnector{Connector: conn, addr: cfg.Addr}), "mysql"), nil
}

// Prune closes the pools of servers that are no shard's primary in m and
// were not handed out since the last Prune, and forgets what the Pool
// kept for them (DSNs, epoch checks). The node calls it every
// PruneEvery, so the pool of a former primary goes one to two periods
// after the last write there, and a long-lived node that saw many
// failovers does not keep every pool it ever opened. The period is the
// grace for work
// that took a pool just before the map moved (a serve or ack batch in
// flight): it finishes on the pool it has. A pool handed out after it was
// closed answers "sql: database is closed", as one to an unreachable
// server would fail, and the next call opens a new pool. It returns how
// many pools it closed.
func (p *Pool) Prune(m *Map) int {
	current := map[string]bool{}
	for _, s := range m.Shards {
		current[p.DSN(s)] = true
	}
	var idle []*sqlx.DB
	defer func() {
		// Outside the lock: Close waits for the queries in flight.
		for _, db := range idle {
			db.Close()
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	for dsn, e := range p.dbs {
		if current[dsn] {
			continue
		}
		if e.used {
			e.used = false
			continue
		}
		idle = append(idle, e.db)
		delete(p.dbs, dsn)
		delete(p.servers, e.db)
	}
	for k := range p.epochs {
		if _, ok := p.dbs[k.dsn]; !ok {
			delete(p.epochs, k)
		}
	}
	for k, dsn := range p.dsns {
		if _, ok := p.dbs[dsn]; !ok && !current[dsn] {
			delete(p.dsns, k)
		}
	}
	return len(idle)
}

// PruneEvery is how often a node prunes its pools (Prune).
const PruneEvery = time.Minute

// Close closes every pool; later calls get ErrPoolClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for k, e := range p.dbs {
		e.db.Close()
		delete(p.dbs, k)
	}
	clear(p.servers)
	return nil
}
