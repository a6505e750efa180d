package bench

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/itemid"
)

// openRaw connects to database on s as the service does: READ COMMITTED,
// many connections.
func openRaw(s *mariadb.Server, database string) (*sql.DB, error) {
	c, err := mysql.ParseDSN(s.DSN(database))
	if err != nil {
		return nil, err
	}
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["tx_isolation"] = "'READ-COMMITTED'"
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(256)
	db.SetMaxIdleConns(256)
	return db, nil
}

// freshDB creates database on s with Triage's schema (dropping an older one
// of that name first) and connects to it.
func freshDB(ctx context.Context, s *mariadb.Server, database string) (*sql.DB, error) {
	if err := s.DropDatabase(ctx, database); err != nil {
		return nil, err
	}
	if err := s.CreateDatabase(ctx, database); err != nil {
		return nil, err
	}
	db, err := openRaw(s, database)
	if err != nil {
		return nil, err
	}
	if _, err := schema.Migrate(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", database, err)
	}
	return db, nil
}

// rowWriter builds INSERT statements with literal values, rows shaped
// exactly as the enqueuer writes them (enqueuer/store.go): no TTL, no dedup
// key, no metadata, the namespace's 30 s lease, ready at once. Literal SQL
// keeps the load generator's CPU, which shares the box with MariaDB, low.
type rowWriter struct {
	ns, topic  string // valid names ([A-Za-z0-9_.-]), so no quoting is needed
	payloadLit string // X'…'
	ids        *itemid.Generator
	rnd        *rand.Rand
}

const insertPrefix = "INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms, " +
	"expires_at, dedup_key, payload, metadata, updated_at, attempts) VALUES "

// leaseMS is the default namespace's lease, as the router stamps it.
const leaseMS = 30_000

func newRowWriter(topic string, payload []byte, ids *itemid.Generator, seed uint64) *rowWriter {
	return &rowWriter{
		ns:         namespace,
		topic:      topic,
		payloadLit: "X'" + hex.EncodeToString(payload) + "'",
		ids:        ids,
		rnd:        rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

// insert returns an INSERT of n new items with priorities 0..9, ready now.
func (w *rowWriter) insert(buf []byte, n int) []byte {
	now := strconv.FormatInt(time.Now().UnixMicro(), 10)
	buf = append(buf[:0], insertPrefix...)
	for i := range n {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, '(')
		buf = strconv.AppendUint(buf, w.ids.Next(), 10)
		buf = append(buf, ",'"...)
		buf = append(buf, w.ns...)
		buf = append(buf, "','"...)
		buf = append(buf, w.topic...)
		buf = append(buf, "',"...)
		buf = strconv.AppendInt(buf, int64(w.rnd.IntN(10)), 10)
		buf = append(buf, ',')
		buf = append(buf, now...)
		buf = append(buf, ',')
		buf = append(buf, now...)
		buf = append(buf, ","+strconv.Itoa(leaseMS)+",NULL,NULL,"...)
		buf = append(buf, w.payloadLit...)
		buf = append(buf, ",NULL,"...)
		buf = append(buf, now...)
		buf = append(buf, ",0)"...)
	}
	return buf
}

// fill inserts n ready items into topic, spread evenly over dbs, with
// batches of 1000 rows from two writers per database.
func (r *runner) fill(ctx context.Context, dbs []*sql.DB, topic string, n int, label string) error {
	if n <= 0 {
		return nil
	}
	const batch, writersPerDB = 1000, 2
	start := time.Now()
	var done atomic.Int64
	stop := make(chan struct{})
	var pwg sync.WaitGroup
	if label != "" {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			t := time.NewTicker(r.p.progressEvery)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					d := done.Load()
					fmt.Fprintf(r.out, "%s: filling %s: %s/%s rows (%s rows/s)\n", label, topic, human(float64(d)), human(float64(n)),
						human(float64(d)/time.Since(start).Seconds()))
				}
			}
		}()
	}
	defer func() {
		close(stop)
		pwg.Wait()
	}()
	var wg sync.WaitGroup
	errs := make(chan error, len(dbs)*writersPerDB)
	for i, db := range dbs {
		share := n / len(dbs)
		if i == 0 {
			share += n % len(dbs)
		}
		var left atomic.Int64
		left.Store(int64(share))
		for j := range writersPerDB {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := newRowWriter(topic, r.payload, r.ids, uint64(i*writersPerDB+j+1))
				var buf []byte
				for ctx.Err() == nil {
					k := min(int64(batch), left.Add(-batch)+batch)
					if k <= 0 {
						return
					}
					buf = w.insert(buf, int(k))
					if _, err := db.ExecContext(ctx, string(buf)); err != nil {
						errs <- fmt.Errorf("fill %s: %w", topic, err)
						return
					}
					done.Add(k)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// settle waits, up to settleWait, until the InnoDB buffer pool of every db
// holds at most 10% dirty pages, and says how long it waited. A bulk fill
// leaves the page cleaner flushing for a while (at innodb_io_capacity, 200
// pages/s by default); a backlog that built up over time would not, so a
// latency measured right after a fill would partly measure the fill.
func (r *runner) settle(ctx context.Context, dbs []*sql.DB, label string) {
	t0 := time.Now()
	r.waitClean(ctx, dbs)
	if d := time.Since(t0); d > time.Second {
		fmt.Fprintf(r.out, "%s: waited %.1fs for InnoDB to flush the fill's dirty pages\n", label, d.Seconds())
	}
}

func (r *runner) waitClean(ctx context.Context, dbs []*sql.DB) {
	deadline := time.Now().Add(r.p.settleWait)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		settled := true
		for _, db := range dbs {
			var dirty, total float64
			rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_buffer_pool_pages_dirty', 'Innodb_buffer_pool_pages_total')")
			if err != nil {
				return
			}
			for rows.Next() {
				var k string
				var v float64
				if rows.Scan(&k, &v) == nil {
					if k == "Innodb_buffer_pool_pages_dirty" {
						dirty = v
					} else {
						total = v
					}
				}
			}
			rows.Close()
			if total > 0 && dirty > total/10 {
				settled = false
			}
		}
		if settled {
			return
		}
		schema.Sleep(ctx, 250*time.Millisecond)
	}
}

// inList appends ids as a comma-separated list.
func inList(buf []byte, ids []uint64) []byte {
	for i, id := range ids {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendUint(buf, id, 10)
	}
	return buf
}
