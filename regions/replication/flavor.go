package replication

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Flavor holds the statement texts of one server family, so that the
// procedure in Admin is written once and MariaDB-vs-MySQL syntax lives
// behind this seam. Statements that take values get them already validated
// (see Credentials); the Flavor only quotes them.
//
// MariaDB is the only implementation today. MySQL8 returns ErrNotSupported;
// doc.go lists what its implementation must change.
type Flavor interface {
	// Name is "mariadb", for errors and logs.
	Name() string

	// Users returns the statements that create the replication and
	// application accounts or bring existing ones to the intended password
	// and privileges, REQUIRE SSL for those whose RequireSSL is set.
	Users(repl, app Credentials) []string
	// SetReadOnly fences (on) or unfences the server for accounts without
	// the privilege to bypass read_only.
	SetReadOnly(on bool) string
	// SemiSync returns the statements that configure semi-synchronous
	// replication for a server in the given role, with the primary's wait
	// for an acknowledgement bounded by timeout and kept up with no
	// replica connected (never a fallback to asynchronous replication when
	// timeout is NoFallback).
	SemiSync(primary bool, timeout time.Duration) []string
	// SemiSyncVariables and SemiSyncStatus are queries returning
	// (name, value) rows, read by Names.
	SemiSyncVariables() string
	SemiSyncStatus() string

	// ChangePrimary points the (stopped) replica at host:port, resuming from
	// its replica GTID position, over TLS when repl.TLS says so. demote
	// first merges the server's own binary log position into that position
	// (a deposed primary rejoining).
	ChangePrimary(host string, port int, repl Credentials, demote bool) string
	// StartReplica and the others below start, stop or forget replication
	// (both threads, or the SQL or IO thread alone).
	StartReplica() string
	StartReplicaSQL() string
	StartReplicaIO() string
	StopReplica() string
	StopReplicaIO() string
	ResetReplicaAll() string
	// ReplicaStatus returns zero rows on a server that replicates from
	// nobody, else one row whose columns Names lists.
	ReplicaStatus() string
	// Positions returns one row: server id, read_only, and the current,
	// binary log and replica GTID positions.
	Positions() string
	// WaitForPosition takes (position, timeout in seconds) and returns 0
	// once the replica has applied position, -1 on timeout.
	WaitForPosition() string

	// Names gives the column and variable names the queries above return.
	Names() Names
}

// Names are the flavor's names for the values Admin reads.
type Names struct {
	// Columns of ReplicaStatus.
	IORunning, SQLRunning, IOPos, SecondsBehind          string
	LastIOErrno, LastIOError, LastSQLErrno, LastSQLError string
	PrimaryHost, PrimaryPort                             string
	// PrimaryTLS is the column saying whether the replica connects to
	// its primary over TLS (MASTER_SSL).
	PrimaryTLS string
	// Variables from SemiSyncVariables.
	SemiSyncPrimaryEnabled, SemiSyncReplicaEnabled, SemiSyncWaitPoint, SemiSyncTimeout string
	SemiSyncWaitNoReplica                                                              string
	// Status counters from SemiSyncStatus.
	SemiSyncActive, SemiSyncClients, SemiSyncYesTx, SemiSyncNoTx, SemiSyncReplicaActive string
	SemiSyncWaitSessions                                                                string
}

// MariaDB is the flavor of MariaDB 10.11 and later (MASTER_DEMOTE_TO_SLAVE
// needs 10.10; --init-rpl-role recovery needs 10.11.9).
var MariaDB Flavor = mariaDB{}

// MySQL8 would return the MySQL 8.0/8.4 flavor. It is a TODO: it always
// returns ErrNotSupported, so that a MySQL server is refused up front rather
// than fed MariaDB syntax.
func MySQL8() (Flavor, error) {
	return nil, fmt.Errorf("%w: the MySQL 8 flavor (CHANGE REPLICATION SOURCE TO ... SOURCE_AUTO_POSITION=1, "+
		"WAIT_FOR_EXECUTED_GTID_SET, UUID:interval GTID sets, super_read_only, semisync_source plugin) "+
		"is not implemented; see package doc", ErrNotSupported)
}

// DetectFlavor asks the server what it is: MariaDB gets MariaDB, anything
// else gets MySQL8's "not supported yet" error. Nodes do not call it: they
// use MariaDB, and schema.CheckServer refuses any other shard server (and
// a MariaDB older than 10.11) before a node starts on it or AddShard adds
// it, since the queue's own statements are MariaDB's too.
func DetectFlavor(ctx context.Context, db *sql.DB) (Flavor, error) {
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return nil, fmt.Errorf("replication: detect flavor: %w", err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return MariaDB, nil
	}
	_, err := MySQL8()
	return nil, fmt.Errorf("%w (server version %s)", err, version)
}

type mariaDB struct{}

func (mariaDB) Name() string { return "mariadb" }

func (mariaDB) Users(repl, app Credentials) []string {
	r, a := account(repl), account(app)
	return []string{
		"CREATE USER IF NOT EXISTS " + r + " IDENTIFIED BY " + quote(repl.Password) + requireSSL(repl),
		"ALTER USER " + r + " IDENTIFIED BY " + quote(repl.Password) + requireSSL(repl),
		"GRANT REPLICATION SLAVE ON *.* TO " + r,
		"CREATE USER IF NOT EXISTS " + a + " IDENTIFIED BY " + quote(app.Password) + requireSSL(app),
		"ALTER USER " + a + " IDENTIFIED BY " + quote(app.Password) + requireSSL(app),
		// Either privilege lets an account write through read_only (SUPER
		// did until 10.11), which would defeat the fence. Revoking a
		// privilege the account lacks is not an error in MariaDB.
		"REVOKE SUPER, READ ONLY ADMIN ON *.* FROM " + a,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + app.database() + "`.* TO " + a,
	}
}

func (mariaDB) SetReadOnly(on bool) string {
	if on {
		return "SET GLOBAL read_only = ON"
	}
	return "SET GLOBAL read_only = OFF"
}

func (mariaDB) SemiSync(primary bool, timeout time.Duration) []string {
	// Both roles get the wait point and timeout so that a replica is ready
	// the moment it is promoted; the wait point is set before enabling.
	// wait_no_slave=ON keeps commits waiting when no replica is connected
	// at all, instead of turning semi-sync off at once.
	return []string{
		"SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'",
		"SET GLOBAL rpl_semi_sync_master_timeout = " + strconv.FormatInt(timeout.Milliseconds(), 10),
		"SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON",
		"SET GLOBAL rpl_semi_sync_master_enabled = " + onOff(primary),
		"SET GLOBAL rpl_semi_sync_slave_enabled = " + onOff(!primary),
	}
}

func (mariaDB) SemiSyncVariables() string { return "SHOW GLOBAL VARIABLES LIKE 'rpl_semi_sync_%'" }
func (mariaDB) SemiSyncStatus() string    { return "SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_%'" }

func (mariaDB) ChangePrimary(host string, port int, repl Credentials, demote bool) string {
	stmt := "CHANGE MASTER TO MASTER_HOST = " + quote(host) +
		", MASTER_PORT = " + strconv.Itoa(port) +
		", MASTER_USER = " + quote(repl.User) +
		", MASTER_PASSWORD = " + quote(repl.Password) +
		// slave_pos, not current_pos: the replica resumes from what it
		// applied as a replica, so a local transaction never silently moves
		// its starting point.
		", MASTER_USE_GTID = slave_pos" +
		// Retry a lost primary every second instead of the default 60 s,
		// so a repointed replica attaches as soon as its primary is up.
		", MASTER_CONNECT_RETRY = 1" +
		// The primary's dump thread only notices a dead replica when it
		// next writes to it; a heartbeat every second (default 30 s) keeps
		// Rpl_semi_sync_master_clients, which the alarm reads, current.
		", MASTER_HEARTBEAT_PERIOD = 1" +
		repl.TLS.changeOptions()
	if demote {
		stmt += ", MASTER_DEMOTE_TO_SLAVE = 1"
	}
	return stmt
}

func (mariaDB) StartReplica() string    { return "START SLAVE" }
func (mariaDB) StartReplicaSQL() string { return "START SLAVE SQL_THREAD" }
func (mariaDB) StartReplicaIO() string  { return "START SLAVE IO_THREAD" }
func (mariaDB) StopReplica() string     { return "STOP SLAVE" }
func (mariaDB) StopReplicaIO() string   { return "STOP SLAVE IO_THREAD" }
func (mariaDB) ResetReplicaAll() string { return "RESET SLAVE ALL" }
func (mariaDB) ReplicaStatus() string   { return "SHOW SLAVE STATUS" }

func (mariaDB) Positions() string {
	return "SELECT @@server_id, @@read_only, @@gtid_current_pos, @@gtid_binlog_pos, @@gtid_slave_pos"
}

func (mariaDB) WaitForPosition() string { return "SELECT MASTER_GTID_WAIT(?, ?)" }

func (mariaDB) Names() Names {
	return Names{
		IORunning: "Slave_IO_Running", SQLRunning: "Slave_SQL_Running", IOPos: "Gtid_IO_Pos",
		SecondsBehind: "Seconds_Behind_Master",
		LastIOErrno:   "Last_IO_Errno", LastIOError: "Last_IO_Error",
		LastSQLErrno: "Last_SQL_Errno", LastSQLError: "Last_SQL_Error",
		PrimaryHost: "Master_Host", PrimaryPort: "Master_Port", PrimaryTLS: "Master_SSL_Allowed",
		SemiSyncPrimaryEnabled: "rpl_semi_sync_master_enabled",
		SemiSyncReplicaEnabled: "rpl_semi_sync_slave_enabled",
		SemiSyncWaitPoint:      "rpl_semi_sync_master_wait_point",
		SemiSyncTimeout:        "rpl_semi_sync_master_timeout",
		SemiSyncWaitNoReplica:  "rpl_semi_sync_master_wait_no_slave",
		SemiSyncWaitSessions:   "Rpl_semi_sync_master_wait_sessions",
		SemiSyncActive:         "Rpl_semi_sync_master_status",
		SemiSyncClients:        "Rpl_semi_sync_master_clients",
		SemiSyncYesTx:          "Rpl_semi_sync_master_yes_tx",
		SemiSyncNoTx:           "Rpl_semi_sync_master_no_tx",
		SemiSyncReplicaActive:  "Rpl_semi_sync_slave_status",
	}
}

func onOff(b bool) string {
	if b {
		return "ON"
	}
	return "OFF"
}

// quote makes a SQL string literal. Credentials.validate has already
// rejected backslashes and control characters, whose meaning depends on
// sql_mode (NO_BACKSLASH_ESCAPES), so doubling quotes is enough in every
// mode.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func account(c Credentials) string { return quote(c.User) + "@" + quote(c.host()) }

// requireSSL is the clause of CREATE and ALTER USER that makes the server
// refuse c's login over plain TCP, empty when c does not ask for it.
func requireSSL(c Credentials) string {
	if c.RequireSSL {
		return " REQUIRE SSL"
	}
	return ""
}
