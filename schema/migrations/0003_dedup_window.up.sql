-- Dedup keys stay taken for the namespace's dedup_window after their item
-- is gone (acked, deleted, dead-lettered), so a producer that retries an
-- enqueue after a timeout never creates a second item (seed 004). While
-- the item lives, the items.dedup unique index does this job.
CREATE TABLE IF NOT EXISTS dedup_tombstones (
  namespace   VARBINARY(128)  NOT NULL,
  topic       VARBINARY(128)  NOT NULL,
  dedup_key   VARBINARY(255)  NOT NULL,
  item_id     BIGINT UNSIGNED NOT NULL,  -- the item that held the key
  expires_at  BIGINT          NOT NULL,
  -- The enqueue path looks keys up by this prefix.
  PRIMARY KEY (namespace, topic, dedup_key),
  -- The sweep deletes expired tombstones through this index only.
  KEY expires (expires_at)
) ENGINE=InnoDB;
