package schema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ErrUnsupportedServer is returned by CheckServer for a shard server
// Triage cannot run on.
var ErrUnsupportedServer = errors.New("unsupported database server")

// MinMariaDB is the oldest MariaDB a shard may run. The queue's statements
// use JSON_TABLE (10.6) and BEGIN NOT ATOMIC, and failover uses
// MASTER_DEMOTE_TO_SLAVE (10.10) and --init-rpl-role recovery (10.11.9;
// package regions/replication); 10.11 is the LTS release that has them
// all. MySQL has neither BEGIN NOT ATOMIC nor MariaDB's replication
// statements, and its flavor in package replication is a TODO.
var MinMariaDB = [2]int{10, 11}

// CheckServer asks db's server what it is and refuses, up front and saying
// what is needed, a server the queue's SQL would fail on later: MySQL, or
// a MariaDB older than MinMariaDB. Without it such a shard would be added
// and fail later, on the first statement it lacks (every ack batch uses
// BEGIN NOT ATOMIC).
func CheckServer(ctx context.Context, db *sql.DB) error {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return fmt.Errorf("read the server version: %w", err)
	}
	return checkVersion(v)
}

// checkVersion judges a VERSION() string, such as
// "10.11.19-MariaDB-0+deb12u1-log" or MySQL's "8.0.36".
func checkVersion(v string) error {
	need := fmt.Sprintf("Triage needs MariaDB %d.%d or later", MinMariaDB[0], MinMariaDB[1])
	if !strings.Contains(strings.ToLower(v), "mariadb") {
		return fmt.Errorf("%w: the server is MySQL %s (or another server that is not MariaDB); %s", ErrUnsupportedServer, v, need)
	}
	// Replication handshakes of old servers prefix "5.5.5-"; VERSION()
	// does not, but a proxy might.
	var got [2]int
	if _, err := fmt.Sscanf(strings.TrimPrefix(v, "5.5.5-"), "%d.%d", &got[0], &got[1]); err != nil {
		return fmt.Errorf("%w: cannot read the version of MariaDB %q; %s", ErrUnsupportedServer, v, need)
	}
	if got[0] < MinMariaDB[0] || got[0] == MinMariaDB[0] && got[1] < MinMariaDB[1] {
		return fmt.Errorf("%w: the server is MariaDB %s; %s", ErrUnsupportedServer, v, need)
	}
	return nil
}

// ErrPrivilegedAccount is returned by CheckGrants and CheckAccount for an
// account that can write through read_only, or turn it off.
var ErrPrivilegedAccount = errors.New("account can write through read_only")

// ShowGrants is the statement whose rows CheckGrants judges: the grants of
// the session's user and of its enabled roles (its default roles, and the
// roles granted to those), which are what the session may do. Other roles
// granted to the user hold only after SET ROLE, which Triage never runs.
const ShowGrants = "SHOW GRANTS"

// readOnlyBypass are the global privileges an application account must not
// hold. The failover controller fences a deposed primary with read_only,
// which MariaDB does not apply to an account with READ_ONLY ADMIN (or to
// ALL PRIVILEGES, which includes it); such an account may also turn
// read_only off. SUPER let an account through read_only before MariaDB
// 10.11 and still lets it turn semi-sync off, on which a failover's
// promise of losing no acknowledged commit rests.
var readOnlyBypass = []string{"ALL PRIVILEGES", "READ_ONLY ADMIN", "SUPER"}

// CheckAccount reads the grants of db's session (ShowGrants) and refuses,
// with ErrPrivilegedAccount, an account that can write through read_only
// (see CheckGrants).
func CheckAccount(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, ShowGrants)
	if err != nil {
		return fmt.Errorf("read the account's grants: %w", err)
	}
	defer rows.Close()
	var grants []string
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			return fmt.Errorf("read the account's grants: %w", err)
		}
		grants = append(grants, g)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the account's grants: %w", err)
	}
	return CheckGrants(grants)
}

// CheckGrants judges the rows of ShowGrants, such as
// "GRANT SELECT, INSERT ON `triage`.* TO `app`@`%`": a grant of SUPER,
// READ_ONLY ADMIN or ALL PRIVILEGES on *.*, to the user or to one of its
// enabled roles, is refused with ErrPrivilegedAccount, saying which. The
// error never quotes a row, which may carry the password's hash.
func CheckGrants(grants []string) error {
	for _, g := range grants {
		privs, grantee, ok := globalGrant(g)
		if !ok {
			continue
		}
		for _, p := range privs {
			if !slices.Contains(readOnlyBypass, p) {
				continue
			}
			via := ""
			if !strings.Contains(grantee, "@") {
				via = " through its role " + grantee
			}
			return fmt.Errorf("%w: the account holds %s on *.*%s, so the read_only that fences a deposed primary "+
				"does not stop its writes; the application account needs SELECT, INSERT, UPDATE and DELETE on the "+
				"shard database and nothing else (provision.EnsureAccounts creates it)", ErrPrivilegedAccount, p, via)
		}
	}
	return nil
}

// globalGrant returns the privileges and the grantee of a grant row on
// *.*, with the privileges' names as MariaDB 10.11 prints them
// ("READ_ONLY ADMIN"; "READ ONLY ADMIN" as GRANT also takes it). Other
// rows (grants on a database or table, roles granted, SET DEFAULT ROLE)
// give ok false.
func globalGrant(g string) (privs []string, grantee string, ok bool) {
	rest, found := strings.CutPrefix(g, "GRANT ")
	if !found || strings.HasPrefix(rest, "`") { // a role granted: GRANT `r` TO ...
		return nil, "", false
	}
	list, rest, found := strings.Cut(rest, " ON ")
	if !found {
		return nil, "", false
	}
	target, rest, found := strings.Cut(rest, " TO ")
	if !found || target != "*.*" {
		return nil, "", false
	}
	grantee, _, _ = strings.Cut(rest, " ")
	for p := range strings.SplitSeq(list, ",") {
		p = strings.ToUpper(strings.TrimSpace(p))
		if p == "READ ONLY ADMIN" {
			p = "READ_ONLY ADMIN"
		}
		privs = append(privs, p)
	}
	return privs, grantee, true
}

// The bounds on one statement of an application session, the server's
// below the client's, so that a statement the client gave up on has
// already failed on the server and committed nothing (see "Timeouts" in
// the package doc). The pool of the application account
// (shardmap.NewAppPool) sets the first two as session variables on every
// connection and the third as the driver's read and write timeout.
const (
	// LockWaitTimeout is innodb_lock_wait_timeout (whole seconds): a
	// statement waiting this long for a row lock fails with 1205.
	LockWaitTimeout = 10 * time.Second
	// StatementTimeout is max_statement_time: a statement that runs this
	// long, whether it reads or writes, fails with 1969 and its changes
	// are undone. It does not bound a commit's wait for a semi-sync
	// acknowledgement. A caller's context that bounds a statement must
	// outlast it.
	StatementTimeout = 20 * time.Second
	// ReadTimeout is the driver's timeout for one read, or write, of a
	// packet: what the client waits for a statement's answer.
	ReadTimeout = 30 * time.Second
)
