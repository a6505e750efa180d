-- Error texts come from clients (nack) and from the database (refused
-- enqueues) and may hold any Unicode, 4-byte characters included: store
-- them as utf8mb4 whatever the server's default character set is.
ALTER TABLE items
  MODIFY last_error TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;

-- An item the items table refused after its enqueue was acknowledged is
-- moved here with the database's reason (package enqueuer). MEDIUMBLOB
-- metadata takes any metadata a router can buffer, including metadata
-- the items table's BLOB refused.
ALTER TABLE dead_letters
  MODIFY last_error TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  MODIFY metadata   MEDIUMBLOB NULL;

-- content_hash tells a redelivery of a batch (same hash) from another batch
-- that carries the same ID (a node-number collision): only the first is
-- reported as applied. outcome is the EnqueueCommitted the batch got the
-- first time (duplicates, refusals; NULL: every item inserted under its own
-- ID), so a redelivery answers the waiting router the same.
ALTER TABLE enqueue_batches
  ADD COLUMN IF NOT EXISTS content_hash BINARY(32) NULL,
  ADD COLUMN IF NOT EXISTS outcome      BLOB       NULL;

-- Last resort for an acknowledged item that neither items nor dead_letters
-- can hold (a name longer than its column, which routers never send): the
-- encoded batch with just that item, and why. Operators read it with SQL;
-- nothing acknowledged is dropped. Keyed by a sequence, since what lands
-- here may repeat an ID that is taken elsewhere.
CREATE TABLE IF NOT EXISTS refused_items (
  seq         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  item_id     BIGINT UNSIGNED NOT NULL,
  batch_id    BIGINT UNSIGNED NOT NULL,
  batch       LONGBLOB        NOT NULL,  -- triage.peer.v1.EnqueueBatch with the one item
  reason      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  refused_at  BIGINT          NOT NULL,
  PRIMARY KEY (seq),
  KEY item (item_id)
) ENGINE=InnoDB;
