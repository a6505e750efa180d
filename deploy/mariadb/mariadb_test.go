package mariadb_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb"
)

// orphanHelperDir, when set in the environment, makes the test binary a
// helper for TestServerDiesWithItsParent: it starts a server there,
// writes its PID to Dir/helper.pid and waits to be killed.
const orphanHelperDir = "MARIADB_TEST_ORPHAN_HELPER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(orphanHelperDir); dir != "" {
		s, err := mariadb.Start(context.Background(), mariadb.Config{Dir: dir})
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		if err := os.WriteFile(filepath.Join(dir, "helper.pid"), []byte(strconv.Itoa(s.PID())), 0o600); err != nil {
			os.Exit(1)
		}
		select {}
	}
	if err := mariadb.EnsureInstalled(context.Background(), nil); err != nil {
		// Fail, never skip: a missing server must not turn into green tests.
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func start(t *testing.T, dir string) *mariadb.Server {
	t.Helper()
	s, err := mariadb.Start(t.Context(), mariadb.Config{Dir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })
	t.Cleanup(func() { require.NoError(t, s.Stop()) })
	return s
}

func connect(t *testing.T, dsn string) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Connect("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

func TestStartConfigAndStop(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := mariadb.Start(t.Context(), mariadb.Config{Dir: dir, ServerID: 7})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() }) // in case an assertion fails first
	require.Equal(t, "127.0.0.1:"+strconv.Itoa(s.Port()), s.Addr())

	db := connect(t, s.DSN(""))
	vars := map[string]string{}
	rows, err := db.Queryx(`SHOW GLOBAL VARIABLES WHERE Variable_name IN
		('server_id','log_bin','sync_binlog','innodb_flush_log_at_trx_commit','binlog_format',
		 'gtid_strict_mode','log_slave_updates','bind_address','skip_name_resolve','rpl_semi_sync_master_enabled')`)
	require.NoError(t, err)
	for rows.Next() {
		var k, v string
		require.NoError(t, rows.Scan(&k, &v))
		vars[k] = v
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{
		"server_id": "7", "log_bin": "ON", "sync_binlog": "1", "innodb_flush_log_at_trx_commit": "1",
		"binlog_format": "ROW", "gtid_strict_mode": "ON", "log_slave_updates": "ON",
		"bind_address": "127.0.0.1", "skip_name_resolve": "ON", "rpl_semi_sync_master_enabled": "OFF",
	}, vars)
	// Semi-sync is built in and must be switchable at runtime.
	_, err = db.Exec("SET GLOBAL rpl_semi_sync_master_enabled = ON")
	require.NoError(t, err)
	db.Close()

	pgid, err := syscall.Getpgid(s.PID())
	require.NoError(t, err)
	require.Equal(t, s.PID(), pgid, "own process group, so terminal Ctrl-C does not reach it")

	pid := s.PID()
	require.NoError(t, s.Stop())
	require.NoError(t, s.Stop(), "Stop is idempotent")
	require.NoError(t, s.Kill(), "Kill after Stop is a no-op")
	select {
	case <-s.Wait():
	default:
		t.Fatal("Wait channel not closed after Stop")
	}
	require.True(t, errors.Is(syscall.Kill(pid, 0), syscall.ESRCH), "pid %d still exists", pid)
	require.FileExists(t, filepath.Join(dir, "mariadbd.err"))
}

func TestCreateDropDatabase(t *testing.T) {
	t.Parallel()
	s := start(t, t.TempDir())
	ctx := t.Context()

	require.NoError(t, s.CreateDatabase(ctx, "app_1"))
	require.NoError(t, s.CreateDatabase(ctx, "app_1"), "IF NOT EXISTS")
	db := connect(t, s.DSN("app_1"))
	_, err := db.Exec("CREATE TABLE t (id INT PRIMARY KEY); INSERT INTO t VALUES (1)")
	require.NoError(t, err, "multiStatements enabled")
	var ts time.Time
	require.NoError(t, db.Get(&ts, "SELECT NOW()"), "parseTime enabled")

	require.NoError(t, s.DropDatabase(ctx, "app_1"))
	require.NoError(t, s.DropDatabase(ctx, "app_1"), "IF EXISTS")
	var n int
	require.NoError(t, db.Get(&n, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = 'app_1'"))
	require.Zero(t, n)

	for _, bad := range []string{"", "a-b", "x`; DROP DATABASE mysql; --", string(make([]byte, 65))} {
		require.Error(t, s.CreateDatabase(ctx, bad), "%q", bad)
		require.Error(t, s.DropDatabase(ctx, bad), "%q", bad)
	}
}

func TestRestartKeepsData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := mariadb.Start(t.Context(), mariadb.Config{Dir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })
	require.NoError(t, s.CreateDatabase(t.Context(), "d"))
	db := connect(t, s.DSN("d"))
	_, err = db.Exec("CREATE TABLE t (v VARCHAR(10)); INSERT INTO t VALUES ('kept')")
	require.NoError(t, err)
	db.Close()
	require.NoError(t, s.Stop())

	s2 := start(t, dir)
	var v string
	require.NoError(t, connect(t, s2.DSN("d")).Get(&v, "SELECT v FROM t"))
	require.Equal(t, "kept", v)
}

func TestKillRecoversCommittedRow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := mariadb.Start(t.Context(), mariadb.Config{Dir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })
	require.NoError(t, s.CreateDatabase(t.Context(), "d"))
	db := connect(t, s.DSN("d"))
	_, err = db.Exec("CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB")
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO t VALUES (42)") // autocommit: durable once Exec returns
	require.NoError(t, err)

	pid := s.PID()
	require.NoError(t, s.Kill())
	<-s.Wait()
	require.True(t, errors.Is(syscall.Kill(pid, 0), syscall.ESRCH), "pid %d still exists", pid)
	require.NoError(t, s.Stop(), "Stop after Kill is a no-op")

	// Restart from Config(): same data and same port, as a real shard would.
	s2, err := mariadb.Start(t.Context(), s.Config())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s2.Stop()) })
	require.Equal(t, s.Port(), s2.Port())
	var id int
	require.NoError(t, connect(t, s2.DSN("d")).Get(&id, "SELECT id FROM t"))
	require.Equal(t, 42, id)
}

func TestStartFailureQuotesErrorLog(t *testing.T) {
	t.Parallel()
	_, err := mariadb.Start(t.Context(), mariadb.Config{Dir: t.TempDir(), ExtraArgs: []string{"--no-such-option"}})
	require.ErrorContains(t, err, "exited during start-up")
	require.ErrorContains(t, err, "no-such-option")
}

func TestStartRequiresDir(t *testing.T) {
	t.Parallel()
	_, err := mariadb.Start(t.Context(), mariadb.Config{})
	require.ErrorContains(t, err, "Dir is required")
}

func TestLongDirSocketFallback(t *testing.T) {
	t.Parallel()
	// Beyond the 108-byte Unix socket path limit.
	s := start(t, filepath.Join(t.TempDir(), strings.Repeat("d", 120)))
	var one int
	require.NoError(t, connect(t, s.DSN("")).Get(&one, "SELECT 1"))
}

func TestStartReusesEmptyDataDirButRefusesForeignOne(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o750))
	start(t, dir) // empty data dir: initialised

	foreign := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(foreign, "data", "precious"), 0o750))
	_, err := mariadb.Start(t.Context(), mariadb.Config{Dir: foreign})
	require.ErrorContains(t, err, "refusing")
	require.DirExists(t, filepath.Join(foreign, "data", "precious"))
}

// TestServerDiesWithItsParent: a process that started a server and is
// killed with -9 (a test binary at its -timeout, a bed) leaves no mariadbd
// behind.
func TestServerDiesWithItsParent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), orphanHelperDir+"="+dir)
	helper.Stderr = os.Stderr
	require.NoError(t, helper.Start())
	t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait() })

	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "helper.pid"))
		if err != nil || len(b) == 0 {
			return false
		}
		pid, err = strconv.Atoi(string(b))
		return err == nil
	}, 60*time.Second, 50*time.Millisecond, "the helper started a server")
	// The server is not this test's child: signal 0 only checks it exists.
	require.NoError(t, syscall.Kill(pid, 0), "mariadbd %d runs", pid)
	t.Cleanup(func() {
		if syscall.Kill(pid, 0) == nil { // the assertion below failed: do not leave it
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})

	require.NoError(t, helper.Process.Kill())
	_ = helper.Wait()
	require.Eventually(t, func() bool {
		// Once reparented and exited, mariadbd is reaped by init; until
		// then it is a zombie, which counts as gone.
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err != nil || strings.Contains(string(b), ") Z ")
	}, 30*time.Second, 100*time.Millisecond, "mariadbd %d outlived the process that started it", pid)
}
