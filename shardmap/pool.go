package shardmap

import (
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
)

// Credentials are the MySQL user a process connects to shards as.
type Credentials struct {
	User     string `json:"user"`
	Password string `json:"password,omitempty"`
	// MaxOpenConns per shard primary. Default 64.
	MaxOpenConns int `json:"max_open_conns,omitempty"`
	// DialVia maps a server's address as the shard map names it to the
	// address this process must dial instead (a local proxy in front of a
	// remote region, as the local bed sets up to inject WAN latency).
	DialVia map[string]string `json:"dial_via,omitempty"`
}

// Pool keeps one connection pool per shard primary. When the map moves a
// shard to a new primary, the next call opens a pool to it; pools to
// addresses no longer in use are closed by Prune.
type Pool struct {
	cred Credentials

	mu  sync.Mutex
	dbs map[string]*sqlx.DB // by DSN
}

// NewPool returns an empty pool.
func NewPool(cred Credentials) *Pool {
	if cred.User == "" {
		cred.User = "root"
	}
	return &Pool{cred: cred, dbs: map[string]*sqlx.DB{}}
}

// DSN returns the data source name for a shard's primary. Queue
// transactions run at READ COMMITTED: gap locks of REPEATABLE READ only add
// deadlocks on a queue table.
func (p *Pool) DSN(s Shard) string {
	c := mysql.NewConfig()
	c.User = p.cred.User
	c.Passwd = p.cred.Password
	c.Net = "tcp"
	c.Addr = p.Addr(s.Primary)
	c.DBName = s.Database
	c.InterpolateParams = true
	c.MultiStatements = true
	c.Timeout = 2 * time.Second
	c.ReadTimeout = 30 * time.Second
	c.WriteTimeout = 30 * time.Second
	// MariaDB 10.x names it tx_isolation (MySQL 8: transaction_isolation).
	c.Params = map[string]string{"tx_isolation": "'READ-COMMITTED'"}
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
	s, ok := m.Shard(id)
	if !ok {
		return nil, Shard{}, fmt.Errorf("shard %d is not in shard map version %d", id, m.Version)
	}
	db, err := p.open(p.DSN(s))
	return db, s, err
}

// Writer returns the pool for shard id's current primary after checking
// that the shard may be written now (Source.Writable): every write path
// goes through it, so a fenced or possibly deposed primary gets no writes.
func (p *Pool) Writer(src Source, id uint32) (*sqlx.DB, error) {
	if err := src.Writable(id); err != nil {
		return nil, err
	}
	db, _, err := p.Primary(src.Current(), id)
	return db, err
}

func (p *Pool) open(dsn string) (*sqlx.DB, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if db, ok := p.dbs[dsn]; ok {
		return db, nil
	}
	db, err := sqlx.Open("mysql", dsn)
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
	p.dbs[dsn] = db
	return db, nil
}

// Close closes every pool.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, db := range p.dbs {
		db.Close()
		delete(p.dbs, k)
	}
	return nil
}
