package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/triage-queue/triage/deploy/aptget"
	"github.com/triage-queue/triage/deploy/freeport"
)

const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 20 * time.Second
	// account runs the server when the caller is root: Debian's package
	// creates it, and Start creates it when it is missing.
	account = "postgres"
)

// Config describes one server. The zero value of every field except Dir is
// usable.
type Config struct {
	// Dir holds everything the server writes: Dir/data (the data
	// directory) and Dir/postgres.log. Required; created if missing, and
	// handed to the server's account when the caller is root, in which
	// case its parent directories must let that account through (a
	// directory of its own in /tmp does; t.TempDir's private parent does
	// not).
	Dir string
	// Port is the TCP port on 127.0.0.1. Default 0 picks a free port.
	Port int
	// Settings are further `-c name=value` settings, which override the
	// defaults set here. Default none.
	Settings []string
	// Logger receives progress lines. Default discards them.
	Logger *slog.Logger
}

// Server is a running postgres child process. Its methods are safe for
// concurrent use.
type Server struct {
	cfg  Config
	port int
	cred *syscall.Credential // nil: runs as the caller
	cmd  *exec.Cmd
	done chan struct{}

	mu      sync.Mutex // serialises Stop
	stopped bool
}

// Start initialises Config.Dir/data if it is new, starts postgres and
// returns once it answers a query over TCP. ctx bounds only the start-up;
// the server runs until Stop. An error wrapping ErrNotInstalled means the
// binaries are missing (see EnsureInstalled).
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("postgres: Config.Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	cfg.Dir = dir
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, port: cfg.Port, done: make(chan struct{})}
	if s.cred, err = runAs(ctx); err != nil {
		return nil, err
	}
	if err := s.initDataDir(ctx, bins.initdb); err != nil {
		return nil, err
	}
	if s.port == 0 {
		if s.port, err = freeport.Pick(); err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
	}
	if err := s.spawn(bins.server); err != nil {
		return nil, err
	}
	cfg.Logger.Info("postgres: started", "pid", s.PID(), "addr", s.Addr(), "dir", cfg.Dir)
	if err := s.waitReady(ctx); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// runAs returns the credential the server runs with: none (the caller's)
// unless the caller is root, which postgres refuses to run as; then the
// postgres account's, created as a system account when missing.
func runAs(ctx context.Context) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(account)
	if err != nil {
		out, aerr := exec.CommandContext(ctx, "useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", account).CombinedOutput()
		if aerr != nil {
			return nil, fmt.Errorf("postgres: running as root and no account %q to run the server as: useradd: %w: %s", account, aerr, aptget.Tail(out))
		}
		if u, err = user.Lookup(account); err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("postgres: account %s: %w", account, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// command runs name as the server's account, in Dir (the account may not
// be able to enter the caller's working directory).
func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = s.cfg.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	return cmd
}

// initDataDir runs initdb unless Dir/data already holds a cluster, so that
// a restart keeps its data. The cluster's files need not reach the disk
// before the server starts (initdb -N): the server syncs what it writes.
func (s *Server) initDataDir(ctx context.Context, initdb string) error {
	data := filepath.Join(s.cfg.Dir, "data")
	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(s.cfg.Dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		return nil
	}
	s.cfg.Logger.Info("postgres: initdb", "dir", data)
	out, err := s.command(ctx, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "-N").CombinedOutput()
	if err != nil {
		return fmt.Errorf("postgres: initdb: %w\n%s", err, aptget.Tail(out))
	}
	return nil
}

// args is the server's command line: durable commits, TCP on loopback
// only, the bed's MariaDB memory sizes, then Config.Settings.
func (s *Server) args() []string {
	set := []string{
		"listen_addresses=127.0.0.1", "port=" + strconv.Itoa(s.port), "unix_socket_directories=",
		"fsync=on", "synchronous_commit=on", "full_page_writes=on",
		"shared_buffers=256MB", "max_connections=200", "logging_collector=off",
	}
	args := []string{"-D", filepath.Join(s.cfg.Dir, "data")}
	for _, kv := range append(set, s.cfg.Settings...) {
		args = append(args, "-c", kv)
	}
	return args
}

// spawn starts postgres and reaps it in the background, closing s.done
// once it has exited. Linux sends the parent-death signal when the thread
// that forked the child exits, and Go may end threads, so the fork happens
// on a goroutine locked to its thread until the server has been reaped.
func (s *Server) spawn(server string) error {
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	s.cmd = s.command(context.Background(), server, s.args()...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logf.Close()
		if err := s.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = s.cmd.Wait()
		close(s.done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("postgres: start postgres: %w", err)
	}
	return nil
}

// waitReady polls SELECT 1 until it succeeds, the server exits, or the
// start-up deadline passes.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("postgres: server exited during start-up (%v):\n%s", s.cmd.ProcessState, s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("postgres: server on %s not ready: %w (last error: %v):\n%s", s.Addr(), ctx.Err(), err, s.logTail())
		case <-tick.C:
		}
	}
}

func (s *Server) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// PID returns the postmaster's process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// PIDs returns the postmaster's and its children's (the backends' and the
// background workers') process ids: where the server's CPU goes.
func (s *Server) PIDs() []int {
	pids := []int{s.PID()}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && parentOf(b) == s.PID() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// parentOf returns the parent pid in a /proc/<pid>/stat line: the second
// field after the command name, which is in parentheses and may hold
// spaces.
func parentOf(stat []byte) int {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// Port returns the TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// DSN returns a pgx connection string for database as the superuser.
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.Addr(), database)
}

// Stop shuts the server down with SIGINT (postgres's fast shutdown: it
// ends the sessions and writes a checkpoint), waiting up to 20 s before
// SIGKILL, which it reports as an error. It returns once the process has
// been reaped; further calls return nil.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	// Signalling through cmd.Process is safe against PID reuse: it fails
	// with os.ErrProcessDone once the child has been reaped.
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("postgres: signal %d: %w", s.PID(), err)
	}
	select {
	case <-s.done:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	return fmt.Errorf("postgres: pid %d did not shut down in %v, killed:\n%s", s.PID(), stopTimeout, s.logTail())
}

// Wait returns a channel closed when the process has exited and been reaped.
func (s *Server) Wait() <-chan struct{} { return s.done }

func (s *Server) logPath() string { return filepath.Join(s.cfg.Dir, "postgres.log") }

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logPath())
	return aptget.Tail(b)
}
