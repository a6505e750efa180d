package mariadb

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver used for readiness and DDL

	"github.com/triage-queue/triage/deploy/aptget"
	"github.com/triage-queue/triage/deploy/freeport"
)

const (
	readyTimeout = 30 * time.Second
	pollInterval = 50 * time.Millisecond
	stopTimeout  = 20 * time.Second
	// maxSocketPath stays under the 108-byte sun_path limit; deeper Dirs
	// (long t.TempDir names) get their socket in a short temp directory.
	maxSocketPath = 100
)

// Config describes one server. The zero value of every field except Dir is
// usable.
type Config struct {
	// Dir holds everything the server writes: Dir/data (the datadir),
	// Dir/tmp, Dir/mariadbd.sock (in a short temp dir instead if the path
	// is too long for a socket), Dir/mariadbd.pid and Dir/mariadbd.err.
	// Required; created if missing. Reusing a Dir reuses its data.
	Dir string
	// Port is the TCP port on 127.0.0.1. Default 0 picks a free port.
	Port int
	// ServerID is mariadbd's server_id, which must differ between servers
	// that replicate to each other. Default 1.
	ServerID int
	// ExtraArgs are appended to mariadbd's command line, so they override
	// the defaults set here. Default none.
	ExtraArgs []string
	// Logger receives progress lines. Default discards them.
	Logger *slog.Logger
}

// Server is a running mariadbd child process. Its methods are safe for
// concurrent use.
type Server struct {
	cfg     Config
	port    int
	cmd     *exec.Cmd
	stderr  bytes.Buffer // read only after done is closed
	done    chan struct{}
	db      *sql.DB // admin connection for CreateDatabase and DropDatabase
	sockDir string  // short temp dir holding the socket, removed on exit; "" if in Dir
	// logOffset is the error log's size before this run, so that error
	// messages quote only this run's lines.
	logOffset int64

	mu      sync.Mutex // serialises Stop and Kill
	stopped bool
}

var validName = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// Start initialises cfg.Dir/data if it is new, starts mariadbd and returns
// once it answers SELECT 1 over TCP as root. ctx bounds only the start-up;
// the server keeps running until Stop or Kill.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("mariadb: Config.Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("mariadb: %w", err)
	}
	cfg.Dir = dir
	if cfg.ServerID == 0 {
		cfg.ServerID = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	if err := initDataDir(ctx, cfg, bins.installDB); err != nil {
		return nil, err
	}
	// A port freeport picked can still be taken before mariadbd binds it
	// (by another process choosing ports explicitly); retry with a fresh
	// one in that case.
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, cfg, bins.server)
		if err == nil || cfg.Port != 0 || attempt == 3 || !strings.Contains(err.Error(), "already in use") {
			return s, err
		}
	}
}

// initDataDir runs mariadb-install-db unless Dir/data already holds the
// system tables, so that restarts keep their data.
func initDataDir(ctx context.Context, cfg Config, installDB string) error {
	data := filepath.Join(cfg.Dir, "data")
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "tmp"), 0o750); err != nil {
		return fmt.Errorf("mariadb: %w", err)
	}
	if _, err := os.Stat(filepath.Join(data, "mysql")); err == nil {
		return nil
	}
	if entries, _ := os.ReadDir(data); len(entries) > 0 {
		return fmt.Errorf("mariadb: %s is neither empty nor an initialised datadir; refusing to touch it", data)
	}
	// Initialise beside the final path and rename, so that an interrupted
	// mariadb-install-db never leaves a half-made datadir that looks reusable.
	staging := data + ".init"
	if err := os.RemoveAll(staging); err != nil {
		return fmt.Errorf("mariadb: %w", err)
	}
	cfg.Logger.Info("mariadb: initialising datadir", "dir", data)
	out, err := exec.CommandContext(ctx, installDB, "--no-defaults", "--datadir="+staging, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db", tmpdirArg(cfg)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mariadb: mariadb-install-db: %w\n%s", err, aptget.Tail(out))
	}
	if err := os.Remove(data); err != nil && !errors.Is(err, os.ErrNotExist) { // empty, checked above
		return fmt.Errorf("mariadb: %w", err)
	}
	if err := os.Rename(staging, data); err != nil {
		return fmt.Errorf("mariadb: %w", err)
	}
	return nil
}

// start makes one attempt at Start: it picks the port (a free one unless
// cfg.Port says), puts the socket where its path fits, runs mariadbd and
// waits until it answers. A server that never becomes ready is killed.
func start(ctx context.Context, cfg Config, mariadbd string) (*Server, error) {
	s := &Server{cfg: cfg, port: cfg.Port, done: make(chan struct{})}
	if s.port == 0 {
		var err error
		if s.port, err = freeport.Pick(); err != nil {
			return nil, fmt.Errorf("mariadb: %w", err)
		}
	}
	sock := filepath.Join(cfg.Dir, "mariadbd.sock")
	if len(sock) > maxSocketPath {
		var err error
		if s.sockDir, err = os.MkdirTemp("", "mdb"); err != nil {
			return nil, fmt.Errorf("mariadb: %w", err)
		}
		sock = filepath.Join(s.sockDir, "mariadbd.sock")
	}
	if fi, err := os.Stat(s.errLog()); err == nil {
		s.logOffset = fi.Size()
	}
	if err := s.spawn(mariadbd, s.args(sock)); err != nil {
		return nil, err
	}
	cfg.Logger.Info("mariadb: started mariadbd", "pid", s.PID(), "addr", s.Addr(), "dir", cfg.Dir)
	if err := s.waitReady(ctx); err != nil {
		_ = s.Kill()
		return nil, err
	}
	return s, nil
}

// args is mariadbd's command line for s with its socket at sock: the
// paths under Dir, durability and replication settings of a production
// shard, tuning for a small box, then Config.ExtraArgs, which override
// them.
func (s *Server) args(sock string) []string {
	cfg := s.cfg
	data := filepath.Join(cfg.Dir, "data")
	return append([]string{
		"--no-defaults", // must come first
		"--datadir=" + data,
		"--port=" + strconv.Itoa(s.port),
		"--bind-address=127.0.0.1",
		"--socket=" + sock,
		"--pid-file=" + filepath.Join(cfg.Dir, "mariadbd.pid"),
		"--user=root",
		"--log-error=" + s.errLog(),
		tmpdirArg(cfg),
		"--server-id=" + strconv.Itoa(cfg.ServerID),
		// Durability of a production shard.
		"--innodb-flush-log-at-trx-commit=1",
		"--sync-binlog=1",
		"--log-bin=" + filepath.Join(data, "binlog"),
		"--relay-log=" + filepath.Join(data, "relay-bin"), // hostname-independent, for replication
		"--binlog-format=ROW",
		"--gtid-strict-mode=ON",
		"--log-slave-updates=ON",
		// Small-box tuning.
		"--innodb-buffer-pool-size=256M",
		"--innodb-log-file-size=256M",
		"--max-connections=1000",
		// One multi-row INSERT of an enqueue group carries up to 8 MiB of
		// payloads plus one item of up to 8 MiB.
		"--max-allowed-packet=64M",
		"--skip-name-resolve",
	}, cfg.ExtraArgs...)
}

// spawn starts mariadbd with args and reaps it in the background, closing
// s.done once it has exited. mariadbd dies with the process that started
// it (SIGTERM: a clean shutdown), so a test binary killed at its timeout
// or a bed killed with -9 leaves no server behind. Linux sends Pdeathsig
// when the *thread* that forked the child exits, and Go may end threads,
// so the fork happens on a goroutine locked to its thread until mariadbd
// has been reaped.
func (s *Server) spawn(mariadbd string, args []string) error {
	s.cmd = exec.Command(mariadbd, args...)
	s.cmd.Stderr = &s.stderr // option errors can precede --log-error taking effect
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := s.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = s.cmd.Wait()
		s.cleanup()
		close(s.done)
	}()
	if err := <-started; err != nil {
		s.cleanup()
		return fmt.Errorf("mariadb: start mariadbd: %w", err)
	}
	return nil
}

// waitReady polls SELECT 1 until it succeeds, mariadbd exits, or the
// start-up deadline passes.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	db, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		return fmt.Errorf("mariadb: %w", err)
	}
	db.SetMaxOpenConns(4)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, time.Second)
		var one int
		err = db.QueryRowContext(attempt, "SELECT 1").Scan(&one)
		cancelAttempt()
		if err == nil {
			s.db = db
			return nil
		}
		select {
		case <-s.done:
			db.Close()
			return fmt.Errorf("mariadb: mariadbd exited during start-up (%v):\n%s", s.cmd.ProcessState, s.logTail())
		case <-ctx.Done():
			db.Close()
			return fmt.Errorf("mariadb: mariadbd on %s not ready: %w (last error: %v):\n%s", s.Addr(), ctx.Err(), err, s.logTail())
		case <-tick.C:
		}
	}
}

// Config returns the effective configuration, with defaults filled in and
// Port set to the actual port, so that Start(ctx, s.Config()) restarts the
// server on the same data and address after Stop or Kill.
func (s *Server) Config() Config {
	cfg := s.cfg
	cfg.Port = s.port
	cfg.ExtraArgs = slices.Clone(cfg.ExtraArgs)
	return cfg
}

// Port returns the TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// PID returns the mariadbd process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// DSN returns a go-sql-driver/mysql DSN for database ("" for none) as the
// password-less root user. Times are parsed into UTC time.Time values, and
// multiStatements allows schema files to be applied in one Exec.
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("root@tcp(%s)/%s?parseTime=true&loc=UTC&interpolateParams=true&multiStatements=true",
		s.Addr(), database)
}

// CreateDatabase creates database name if it does not exist. Names are
// restricted to [A-Za-z0-9_] so they never need escaping.
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	return s.ddl(ctx, "CREATE DATABASE IF NOT EXISTS", name)
}

// DropDatabase drops database name if it exists.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	return s.ddl(ctx, "DROP DATABASE IF EXISTS", name)
}

func (s *Server) ddl(ctx context.Context, stmt, name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("mariadb: invalid database name %q: want 1-64 of [A-Za-z0-9_]", name)
	}
	if _, err := s.db.ExecContext(ctx, stmt+" `"+name+"`"); err != nil {
		return fmt.Errorf("mariadb: %s %s: %w", stmt, name, err)
	}
	return nil
}

// Stop shuts the server down cleanly with SIGTERM, waiting up to 20 s before
// resorting to SIGKILL (which it reports as an error). It returns once the
// process has been reaped; further calls return nil.
func (s *Server) Stop() error { return s.signal(syscall.SIGTERM, stopTimeout) }

// Kill sends SIGKILL immediately, as a crash drill, and returns once the
// process has been reaped.
func (s *Server) Kill() error { return s.signal(syscall.SIGKILL, 0) }

// Wait returns a channel closed when the process has exited and been reaped.
func (s *Server) Wait() <-chan struct{} { return s.done }

func (s *Server) signal(sig syscall.Signal, grace time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	if s.db != nil {
		s.db.Close()
	}
	// Signalling through cmd.Process is safe against PID reuse: it fails
	// with os.ErrProcessDone once the Wait goroutine has reaped the child.
	if err := s.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("mariadb: signal %d: %w", s.PID(), err)
	}
	if grace > 0 {
		select {
		case <-s.done:
			return nil
		case <-time.After(grace):
		}
		_ = s.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("mariadb: pid %d ignored SIGTERM for %v, killed:\n%s", s.PID(), grace, s.logTail())
	}
	<-s.done
	return nil
}

// tmpdirArg gives each server a private tmpdir: mariadbd deletes every
// #sql* file in its tmpdir at start-up, including other servers' live
// temporary tables if they share /tmp.
func tmpdirArg(cfg Config) string { return "--tmpdir=" + filepath.Join(cfg.Dir, "tmp") }

func (s *Server) cleanup() {
	if s.sockDir != "" {
		_ = os.RemoveAll(s.sockDir)
	}
}

func (s *Server) errLog() string { return filepath.Join(s.cfg.Dir, "mariadbd.err") }

// logTail returns the end of what this run wrote to the error log, plus
// mariadbd's stderr once it has exited (reading it earlier would race).
func (s *Server) logTail() string {
	log, _ := os.ReadFile(s.errLog())
	log = log[min(s.logOffset, int64(len(log))):]
	select {
	case <-s.done:
		log = append(log, s.stderr.Bytes()...)
	default:
	}
	return aptget.Tail(log)
}
