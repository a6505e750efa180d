package replication

import "errors"

// Sentinel errors. Operations wrap them with the server's address and the
// positions involved, so test them with errors.Is.
var (
	// ErrNotSupported: the server's flavor (today: MySQL 8) has no
	// implementation yet.
	ErrNotSupported = errors.New("replication: not supported yet")

	// ErrNotReplica: Promote was called on a server that replicates from
	// nobody. Promote does not unfence such a server, because it may be a
	// deposed primary; use SetReadOnly(false) if that is really meant.
	ErrNotReplica = errors.New("replication: server is not a replica")

	// ErrLocalTransactions: ReplicateFrom was called on a server whose binary
	// log holds transactions it did not receive as a replica (its
	// gtid_binlog_pos is not covered by its gtid_slave_pos). That is a
	// deposed primary: bring it back with RejoinAsReplica, which demotes its
	// position, after a restart with RejoinArgs.
	ErrLocalTransactions = errors.New("replication: server has transactions it did not replicate")

	// ErrDiverged: replica positions cannot be ranked, because each one has
	// transactions the other lacks. Promoting either loses data; a human
	// must decide.
	ErrDiverged = errors.New("replication: positions diverged")

	// ErrRelayLogNotApplied: Promote cannot apply every transaction the
	// replica received. Either the SQL thread stopped on an error, the
	// relay log did not drain within the timeout, or both replication
	// threads were already stopped, in which case MariaDB discards the relay
	// log as soon as any replication thread starts again (GTID mode).
	ErrRelayLogNotApplied = errors.New("replication: received transactions cannot be applied")

	// ErrCommitsWaiting: read_only=1 could not be set because commits in
	// progress hold it off, on a deposed primary most likely a commit
	// waiting for a semi-sync acknowledgement that will never come.
	// Restart the server with RejoinArgs (which rolls those transactions
	// back) and it rejoins.
	ErrCommitsWaiting = errors.New("replication: commits in progress hold off the fence; restart the server with RejoinArgs")
)
