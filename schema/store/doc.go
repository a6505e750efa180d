// Package store owns every statement on a shard's queue tables: items,
// dead_letters and dedup_tombstones, and the enqueue bookkeeping written
// in the same transactions (enqueue_batches, refused_items). Routing,
// dequeuer and enqueuer call it; none of them spells SQL on those tables
// (TestStoreOwnsQueueTables fails the build of a change that does).
//
// # The seam
//
// Modelled on River's driver: a Store wraps the shard's *sqlx.DB, which
// the caller picks (shardmap.Pool.Writer for writes, whose fencing checks
// stay with the caller, Pool.Primary for reads), and each method is named
// NounVerb and takes (ctx, params): ItemReadHead, ItemServe, ItemAck,
// DeadLetterRedrive, ... Methods carry the statements and the decisions
// that must be made under the statements' row locks (a lease token check,
// out of attempts, a dedup tombstone); what a caller keeps in memory
// (prefetch buffers, merge order, shard ownership, request validation,
// the API's view of a row) stays with the caller. Where a caller decides
// how a locked row changes (UpdateItem), it passes a callback
// (ItemUpdateParams.Update).
//
// The SQL is in named constants next to the method that runs it, one
// place per statement; statements whose size depends on a batch are built
// from fixed text by one function each (stmt, caseByID, schema.Keys, and
// schema.KeyValues where each row gets values of its own: the serve). An
// enqueue's rows are the one place values go into the text as literals
// (sqlValues: numbers, and hex strings no byte can break out of), since
// the driver's interpolation and MariaDB's unescaping of its strings cost
// more than the rows themselves (literal.go).
//
// # Rows
//
// Item is the one type a row of items is read into, whatever columns a
// statement reads (the others stay zero); DeadLetter is dead_letters'.
// Item also carries the ready index's order (Compare, Less), which the
// dequeuer's buffers merge by, and Prefetched, the one definition of a
// row under an older version's prefetch lease (lease_token set,
// leased_until NULL). UpdatedAt is each row's version: every UPDATE moves
// it forward (bumpUpdatedAt, never back whatever the writer's clock), and
// ItemServe leases only rows still at the version read.
//
// # Transactions
//
// Every transaction begins in inTx, which commits fn's work and runs all
// of it again, up to five times (schema.Retry), when InnoDB rolls it back
// for a deadlock (1213) or a lock wait timeout (1205): leasing, acking and
// deleting concurrently on one table produce them, and a rolled-back
// transaction is safe to repeat. A statement outside a transaction is
// retried the same way (retryExec). fn must therefore start over each
// time; methods reset what they collect at the top of fn.
//
// A COMMIT that was sent and not answered (the connection broke, the
// driver's read timeout fired during a semi-sync wait) is
// ErrOutcomeUnknown, told from a failure before anything was sent
// (sentErr). Ack, nack, extend, update and delete settle it before they
// answer, by doing the write again under row locks on a fresh connection
// (settle.go): the lost transaction changed all its rows or none, so the
// state the repeat finds says which.
//
// The one exception is the common enqueue (insertAtOnce): a group of
// batches without dedup keys, small enough for one packet, goes as one
// multi-statement query (START TRANSACTION, the batch records, the items,
// COMMIT), one round trip instead of five. Its batch records go first
// without an outcome, so a batch recorded before fails the query on the
// primary key and the group takes the long way, which reads the records.
// A failed statement stops the query with its transaction open on that
// connection, so it is rolled back there before the connection is reused
// (or discarded): the next query's START TRANSACTION would otherwise
// commit a batch record whose items were refused, and its redelivery
// would be answered as applied (TestInsertAtOnceRollsBackARefusedGroup).
// Every insert reports the version its rows were stored at
// (EnqueueCommitted.version_us), which lets the announcer hand the rows to
// their dequeuer (see package dequeuer, "Prefetch").
//
// # Batching
//
// Batcher coalesces what concurrent callers do on one shard, acks and
// serves, into one transaction sent as one multi-statement query
// (writeAtOnce): per namespace and dedup window a DELETE of the acked rows
// (with the dedup tombstones of the rows it removes), kept only when every
// ref held (a savepoint takes it back otherwise and the transactional
// ItemAck answers), and one ItemServe UPDATE whose deliveries each name the
// version their row was read at. A caller waits for the
// statement in flight and then for its own; the one in flight never waits
// for more, so a lone call costs one statement. Nacks are not batched yet:
// each may dead-letter, merge metadata or back off, which a single
// statement does not express.
//
// # Index and lock rules
//
// These are why the statements look the way they do; keep them when
// changing one (TestByIDStatementsLockOnlyTheirRows and schema's
// TestKeysPlan hold them):
//
//   - A statement that addresses rows by id and locks or deletes them goes
//     through schema.Keys: a table of the sorted ids (JSON_TABLE) joined
//     STRAIGHT_JOIN to the table with FORCE INDEX (PRIMARY), so it locks,
//     and waits for, its own rows only, in one order. "WHERE id IN (...)"
//     lets MariaDB scan a small table and wait for every row another
//     consumer holds (schema/keys.go tells the drill that saw it).
//   - The ack (ItemAckDelete) is no single-table DELETE ... RETURNING,
//     though that would answer in one statement: the single-table form
//     takes no index hint in MariaDB 10.11, and an ack naming more ids
//     than the optimizer thinks the table holds (steady state) scanned the
//     table, waited for rows being served and deadlocked with serves.
//     Its DELETE goes through schema.Keys, and the count it deleted decides
//     in the same round trip whether the transaction is kept
//     (TestAckOfMoreRowsThanTheTableHoldsLocksOnlyItsRows).
//   - Single-table UPDATEs by id carry FORCE INDEX (PRIMARY) for the same
//     reason; they are conditional (token, deliver_after) so a row that
//     changed since it was read is left alone and reported missing (the
//     serve compares updated_at, the row's version).
//   - The ready head and aging read through FORCE INDEX (ready), whose
//     order (namespace, topic, priority, deliver_after, id) is the
//     delivery order; the head read takes no locks and writes nothing,
//     since only the shard's owner reads it and the serve's compare-and-set
//     on each row's version settles races.
//   - The TTL and tombstone sweeps delete through their expiry indexes,
//     bounded per statement, so their cost follows what expired, not the
//     backlog.
//   - Dedup tombstones are written in the transaction that removes the
//     item (ack, delete, dead-lettering, expiry) and read with a locking
//     read after an enqueue's insert, which is what closes the race
//     between an ack and an enqueue of the same key. Every item with a
//     dedup key leaves one, whatever the namespace's dedup window: within
//     the window it takes the key from any enqueue, and for KeyMemory it
//     takes it from envelopes enqueued before the item that held it (a
//     first attempt that lands after its retry's item was acked).
//
// # Errors
//
// errors.go defines the sentinels callers test with errors.Is
// (ErrNotFound, ErrStaleLease, ErrMetadataTooLarge); dequeuer's errors of
// those names are the same values. Methods return them bare or wrapped
// with %w under the same prefixes as before the store existed ("ack: ",
// "nack: "), because routing sends err.Error() to API clients.
//
// # Changing shards
//
// DedupHolder (the lookup of a dedup key on the drained shard its slot
// moved from) and ShardContentsCount (what RetireShard must see empty)
// are in shard.go; neither takes locks, because both run on a shard that
// nothing can insert into any more.
package store
