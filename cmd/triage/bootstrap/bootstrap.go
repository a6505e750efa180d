package bootstrap

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/dequeuer"
	"github.com/triage-queue/triage/enqueuer"
	"github.com/triage-queue/triage/regions"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/routing"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/shardmap"
)

// Config is the bootstrap's config file (JSON), /etc/triage/bootstrap.json
// in the compose bed.
type Config struct {
	// ShardMapFile is the bed's shard map: regions, namespaces, and every
	// shard's home region, primary and replicas (with their regions) by the
	// addresses other containers dial. Required.
	ShardMapFile string `json:"shard_map_file"`
	// Admin is the account with every privilege on each MariaDB server
	// (root@'%' in the bed), its password best from password_file or
	// password_env. Default root, no password.
	Admin shardmap.Credentials `json:"admin"`
	// MySQL is the application account the bootstrap creates on every
	// server, with SELECT, INSERT, UPDATE and DELETE on the shard database
	// only (provision.EnsureAccounts), as the nodes' node.Config.MySQL
	// names it: {"user", "password_file" | "password_env" | "password"}.
	// User default "triage". A password_file that does not exist yet is
	// created (0600) with a random password, for the nodes to read from
	// the same file; a later run reads it, so the password stays. There is
	// no default password: without one the bootstrap refuses to run, as
	// a fixed one would be known to everyone.
	MySQL shardmap.Account `json:"mysql"`
	// Replication is the replication account the bootstrap creates on
	// every server and points the replicas with, as the controllers'
	// node.Config.Replication names it, its password given like MySQL's
	// (a missing password_file is created with a random one). User
	// default "repl"; no default password.
	Replication shardmap.Account `json:"replication"`
	// MySQLRequireSSL creates the application account REQUIRE SSL, so
	// that the servers refuse its login over plain TCP: set it when every
	// node's mysql.tls names a CA. Default false (an existing account's
	// requirement is left as it is).
	MySQLRequireSSL bool `json:"mysql_require_ssl,omitempty"`
	// ReplicationTLS points the replicas at their primaries over TLS
	// (CHANGE MASTER TO ... MASTER_SSL=1), as the controllers'
	// node.Config.ReplicationTLS, and creates the replication account
	// REQUIRE SSL: {"ca_file", "cert_file", "key_file",
	// "verify_server_cert"}, paths as the replicas' mariadbd see them.
	// Default none: plain TCP.
	ReplicationTLS *replication.TLS `json:"replication_tls,omitempty"`
	// NATS are the client URLs of the NATS servers, one per region. The
	// buckets and streams are created through the first. Required.
	NATS []string `json:"nats"`
	// NATSAuth is the Triage login of the NATS servers, as the nodes'
	// node.Config.NATSAuth. Default none.
	NATSAuth *shardmap.NATSLogin `json:"nats_auth,omitempty"`
	// NATSTLS is how to reach NATS servers that require TLS, as the
	// nodes' node.Config.NATSTLS. Default plain TCP.
	NATSTLS *shardmap.NATSTLS `json:"nats_tls,omitempty"`
	// ReplicationVia[region][addr] is the address a server in region
	// dials to reach addr (its region's WAN gateway), as the controllers'
	// node.Config.ReplicationVia gives it. Missing: addr itself.
	ReplicationVia map[string]map[string]string `json:"replication_via,omitempty"`
	// KVReplicas and StreamReplicas are the copies of the control-plane
	// buckets and of each region's enqueue stream, as the nodes' configs
	// give them (node.Config). Default: one per NATS server, at most 3.
	KVReplicas     int `json:"kv_replicas,omitempty"`
	StreamReplicas int `json:"stream_replicas,omitempty"`
	// OwnerTTL is the dequeuers' ownership TTL; it must equal the nodes'
	// owner_ttl, since whoever opens the bucket last sets it. Default 10s.
	OwnerTTL shardmap.Duration `json:"owner_ttl,omitempty"`
	// Wait bounds the wait for MariaDB and NATS to answer. Default 3m.
	Wait shardmap.Duration `json:"wait,omitempty"`
	// SpareShards are provisioned like the map's shards (accounts, their
	// database and schema, replication) but left out of the map: servers
	// ready for `triage shard add` to publish (the compose bed's
	// docker-compose.spare.yml). Their schema is migrated here because
	// the routers that serve the add hold only the application account,
	// which may not run DDL. Their IDs must not be the map's.
	SpareShards []shardmap.Shard `json:"spare_shards,omitempty"`
}

func (c *Config) Fill() error {
	if c.ShardMapFile == "" || len(c.NATS) == 0 {
		return errors.New("bootstrap config: shard_map_file and nats are required")
	}
	c.Admin.User = cmp.Or(c.Admin.User, "root")
	c.MySQL.User = cmp.Or(c.MySQL.User, "triage")
	c.Replication.User = cmp.Or(c.Replication.User, "repl")
	c.KVReplicas = cmp.Or(c.KVReplicas, min(len(c.NATS), 3))
	c.StreamReplicas = cmp.Or(c.StreamReplicas, min(len(c.NATS), 3))
	c.OwnerTTL = cmp.Or(c.OwnerTTL, shardmap.Duration(dequeuer.DefaultOwnerTTL))
	c.Wait = cmp.Or(c.Wait, shardmap.Duration(3*time.Minute))
	return nil
}

// Bootstrap brings a freshly started bed to the state its Triage
// containers start from, with the functions the local bed (deploy/bed)
// uses too (cmd/triage/provision):
//
//  1. reads the application and replication accounts' passwords, writing
//     a random one into a password_file that does not exist yet (see
//     Config.MySQL); waits until every MariaDB server of the shard map and
//     of the spare shards answers (as Admin, over TLS when admin.tls says
//     so), creates the accounts on each (provision.EnsureAccounts,
//     unlogged; REQUIRE SSL as MySQLRequireSSL and ReplicationTLS say)
//     and the shard database on each primary;
//  2. migrates the schema on each primary of the map and of the spare
//     shards (schema.Migrate), once, before a dozen role containers would
//     race to; a router, which has no admin account here, then finds a
//     spare's schema current when `triage shard add` publishes it;
//  3. replicates every shard, spares included, to its replicas with
//     semi-sync (provision.Replicate: GTID, AFTER_SYNC, one
//     acknowledgement, no fallback), over TLS with ReplicationTLS;
//  4. waits for JetStream's meta leader (provision.WaitJetStream), then creates,
//     one after the other, every bucket and stream the nodes open, and
//     publishes the shard map (shardmap.Bootstrap: a map already stored is
//     kept, so a second run never rolls a failover back).
//
// Step 4 is serial because nats-server wedges a replicated stream that
// several clients create at once; the nodes then only open what exists.
// Every step is idempotent, so running it again on a bed that is up is
// harmless.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Fill(); err != nil {
		return err
	}
	accounts, err := cfg.accounts(log)
	if err != nil {
		return err
	}
	natsOpts, err := shardmap.NATSOptions(cfg.NATSAuth, cfg.NATSTLS)
	if err != nil {
		return fmt.Errorf("bootstrap config %w", err)
	}
	data, err := os.ReadFile(cfg.ShardMapFile)
	if err != nil {
		return err
	}
	m, err := shardmap.Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.ShardMapFile, err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(cfg.Wait))
	defer cancel()
	start := time.Now()
	progress := func(format string, args ...any) {
		log.Info(fmt.Sprintf("[%5.1fs] ", time.Since(start).Seconds()) + fmt.Sprintf(format, args...))
	}

	shards, servers, err := plan(m, cfg.SpareShards)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.ShardMapFile, err)
	}
	progress("waiting for %d MariaDB servers; accounts %q and %q on each", len(servers), accounts.App.User, accounts.Repl.User)
	if err := provision.Parallel(len(servers), func(i int) error {
		return cfg.prepareServer(ctx, servers[i], accounts, progress)
	}); err != nil {
		return err
	}

	progress("replicating %d shard(s) (GTID, semi-sync AFTER_SYNC, one acknowledgement, no async fallback)", len(shards))
	if err := provision.Parallel(len(shards), func(i int) error {
		return cfg.replicate(ctx, shards[i], accounts.Repl, progress)
	}); err != nil {
		return err
	}
	return cfg.storeControlPlane(ctx, m, natsOpts, progress)
}

// progressFunc logs a step of the bootstrap, with the time since it
// began.
type progressFunc = func(format string, args ...any)

// accounts resolves the admin account and returns the application and
// replication accounts to create on every server, with their passwords.
func (c *Config) accounts(log *slog.Logger) (provision.Accounts, error) {
	var err error
	if c.Admin, err = c.Admin.Resolve(); err != nil {
		return provision.Accounts{}, fmt.Errorf("bootstrap config admin: %w", err)
	}
	if c.ReplicationTLS != nil {
		if err := c.ReplicationTLS.Validate(); err != nil {
			return provision.Accounts{}, fmt.Errorf("bootstrap config replication_tls: %w", err)
		}
	}
	accounts := provision.Accounts{
		App:  replication.Credentials{User: c.MySQL.User, RequireSSL: c.MySQLRequireSSL},
		Repl: replication.Credentials{User: c.Replication.User, RequireSSL: c.ReplicationTLS != nil, TLS: c.ReplicationTLS},
	}
	if accounts.App.Password, err = password(c.MySQL, "mysql", log); err != nil {
		return provision.Accounts{}, err
	}
	if accounts.Repl.Password, err = password(c.Replication, "replication", log); err != nil {
		return provision.Accounts{}, err
	}
	return accounts, nil
}

// prepareServer waits for one MariaDB server and creates the accounts on
// it; on a shard's primary it also creates the shard's database and
// migrates it.
func (c *Config) prepareServer(ctx context.Context, sv server, accounts provision.Accounts, progress progressFunc) error {
	dsn := c.dsn(sv.addr, "")
	if err := waitSQL(ctx, dsn); err != nil {
		return fmt.Errorf("shard %d server %s: %w", sv.shard.ID, sv.addr, err)
	}
	acc := accounts
	acc.App.Database = sv.shard.Database // the grants' database
	if err := provision.EnsureAccounts(ctx, dsn, acc); err != nil {
		return fmt.Errorf("shard %d server %s: %w", sv.shard.ID, sv.addr, err)
	}
	if !sv.primary {
		return nil
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+sv.shard.Database+"`"); err != nil {
		return fmt.Errorf("shard %d primary %s: %w", sv.shard.ID, sv.addr, err)
	}
	sdb, err := sql.Open("mysql", c.dsn(sv.addr, sv.shard.Database))
	if err != nil {
		return err
	}
	defer sdb.Close()
	n, err := schema.Migrate(ctx, sdb)
	if err != nil {
		return fmt.Errorf("shard %d primary %s: migrate: %w", sv.shard.ID, sv.addr, err)
	}
	spare := ""
	if sv.spare {
		spare = " (spare: not in the map)"
	}
	progress("  shard %d primary %s: database %s, %d migration(s) applied%s", sv.shard.ID, sv.addr, sv.shard.Database, n, spare)
	return nil
}

// replicate makes a shard's replicas replicate from its primary, each
// through the address its region reaches the primary by
// (ReplicationVia).
func (c *Config) replicate(ctx context.Context, s shardmap.Shard, repl replication.Credentials, progress progressFunc) error {
	var replicas []provision.Replica
	for k, r := range s.Replicas {
		region := ""
		if k < len(s.ReplicaRegions) {
			region = s.ReplicaRegions[k]
		}
		via := s.Primary
		if v, ok := c.ReplicationVia[region][s.Primary]; ok {
			via = v
		}
		replicas = append(replicas, provision.Replica{DSN: c.dsn(r, ""), Region: region, PrimaryVia: via})
	}
	return provision.Replicate(ctx, s.ID, c.dsn(s.Primary, ""), repl, replicas, progress)
}

// storeControlPlane waits for JetStream, stores the shard map unless one
// is stored, and creates the buckets and streams the nodes use.
func (c *Config) storeControlPlane(ctx context.Context, m *shardmap.Map, natsOpts []nats.Option, progress progressFunc) error {
	progress("waiting for JetStream (%d servers, R%d)", len(c.NATS), c.KVReplicas)
	if err := provision.WaitJetStream(ctx, c.NATS, c.KVReplicas, time.Until(deadline(ctx)), natsOpts...); err != nil {
		return err
	}
	nc, err := nats.Connect(c.NATS[0], append(natsOpts, nats.Name("triage-bootstrap"))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	kv, err := shardmap.OpenBucket(ctx, js, c.KVReplicas)
	if err != nil {
		return err
	}
	stored, err := shardmap.Bootstrap(ctx, kv, m)
	if err != nil {
		return err
	}
	progress("shard map version %d in %s (%d shards, regions %v)", stored.Version, shardmap.Bucket, len(stored.Shards), stored.Regions)
	if err := c.createBuckets(ctx, js); err != nil {
		return err
	}
	for _, r := range m.Regions {
		if _, err := enqueuer.EnsureStream(ctx, js, r, enqueuer.StreamConfig{Replicas: c.StreamReplicas}); err != nil {
			return err
		}
	}
	progress("buckets and %d enqueue streams created (R%d); bootstrap done", len(m.Regions), c.StreamReplicas)
	return nil
}

// createBuckets creates the control plane's KV buckets and streams
// besides the map's, and proves node claims work with one of its own.
func (c *Config) createBuckets(ctx context.Context, js jetstream.JetStream) error {
	if _, err := regions.OpenHealth(ctx, js, c.KVReplicas); err != nil {
		return err
	}
	if _, err := regions.OpenControl(ctx, js, c.KVReplicas); err != nil {
		return err
	}
	if _, err := regions.OpenHistory(ctx, js, c.KVReplicas); err != nil {
		return fmt.Errorf("open stream %s: %w", regions.HistoryStream, err)
	}
	if _, err := dequeuer.OpenOwners(ctx, js, time.Duration(c.OwnerTTL), c.KVReplicas); err != nil {
		return err
	}
	if _, err := dequeuer.OpenClaims(ctx, js, c.KVReplicas); err != nil {
		return err
	}
	if _, err := routing.OpenDrills(ctx, js, c.KVReplicas); err != nil {
		return err
	}
	claim, err := routing.ClaimNode(ctx, js, "bootstrap", c.KVReplicas, func(error) {})
	if err != nil {
		return err
	}
	claim.Release(ctx)
	return nil
}

// password returns the password of account a (the config's field named
// field): from where a says it is, or, when a names a password_file that
// does not exist, a random one written there first (0600), so the nodes
// that read the same file log in with it. It refuses an account with no
// password or an empty one: either is known to everyone.
func password(a shardmap.Account, field string, log *slog.Logger) (string, error) {
	if a.Password == "" && a.PasswordFile == "" && a.PasswordEnv == "" {
		return "", fmt.Errorf("bootstrap config %s: no password for mysql user %q: give password_file (created with a random password when it does not exist, for the nodes' config to name too), password_env or password", field, a.User)
	}
	if a.PasswordFile != "" && a.Password == "" && a.PasswordEnv == "" {
		created, err := createSecret(a.PasswordFile)
		if err != nil {
			return "", fmt.Errorf("bootstrap config %s: password_file: %w", field, err)
		}
		if created {
			log.Info("wrote a random password", "user", a.User, "password_file", a.PasswordFile)
		}
	}
	pw, err := a.Secret("mysql user")
	if err != nil {
		return "", fmt.Errorf("bootstrap config %s: %w", field, err)
	}
	if pw == "" {
		return "", fmt.Errorf("bootstrap config %s: mysql user %q: the password is empty", field, a.User)
	}
	return pw, nil
}

// createSecret writes a random password into path (0600) unless the file
// exists, and reports whether it did.
func createSecret(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = f.WriteString(rand.Text() + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path) // a half-written file would be read as the password
		return false, err
	}
	return true, nil
}

// dsn is the admin DSN of the server at addr.
func (c *Config) dsn(addr, database string) string {
	mc := mysql.NewConfig()
	c.Admin.Apply(mc)
	mc.Net, mc.Addr, mc.DBName = "tcp", addr, database
	mc.Timeout = 5 * time.Second
	mc.MultiStatements = true
	mc.ParseTime = true
	return mc.FormatDSN()
}

// waitSQL polls the server of dsn until it answers SELECT 1 or ctx ends.
func waitSQL(ctx context.Context, dsn string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := provision.Poll(ctx, 250*time.Millisecond, db.PingContext); err != nil {
		return fmt.Errorf("did not answer: %w", err)
	}
	return nil
}

func deadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Minute)
	}
	return d
}

// server is one MariaDB server the bootstrap provisions.
type server struct {
	shard   shardmap.Shard
	addr    string
	primary bool
	spare   bool // of a spare shard: provisioned and migrated, not published
}

// plan lists the shards to replicate (the map's, then the spares) and
// every server to provision. A spare whose ID or a server address the map
// (or another spare) already has is refused: provisioning it would write
// over a live shard's accounts and replication.
func plan(m *shardmap.Map, spares []shardmap.Shard) ([]shardmap.Shard, []server, error) {
	shards := slices.Clone(m.Shards)
	ids := map[uint32]bool{}
	addrs := map[string]bool{}
	for _, s := range m.Shards {
		ids[s.ID] = true
		for _, a := range append([]string{s.Primary}, s.Replicas...) {
			addrs[a] = true
		}
	}
	for _, s := range spares {
		switch {
		case s.ID == 0 || s.Primary == "":
			return nil, nil, fmt.Errorf("spare shard %d: id and primary are required", s.ID)
		case ids[s.ID]:
			return nil, nil, fmt.Errorf("spare shard %d: the map (or another spare) has that shard", s.ID)
		case len(s.ReplicaRegions) != len(s.Replicas):
			return nil, nil, fmt.Errorf("spare shard %d: %d replicas but %d replica regions", s.ID, len(s.Replicas), len(s.ReplicaRegions))
		}
		ids[s.ID] = true
		for _, a := range append([]string{s.Primary}, s.Replicas...) {
			if addrs[a] {
				return nil, nil, fmt.Errorf("spare shard %d: server %s is already another shard's", s.ID, a)
			}
			addrs[a] = true
		}
		s.Database = cmp.Or(s.Database, "triage")
		shards = append(shards, s)
	}
	var servers []server
	for i, s := range shards {
		spare := i >= len(m.Shards)
		servers = append(servers, server{s, s.Primary, true, spare})
		for _, r := range s.Replicas {
			servers = append(servers, server{s, r, false, spare})
		}
	}
	return shards, servers, nil
}
