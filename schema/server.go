package schema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
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
// a MariaDB older than MinMariaDB. Without it such a shard was added and
// failed later, on the first statement it lacks (every ack batch uses
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
