-- Items of every namespace and topic on this shard.
--
-- Times are BIGINT microseconds since the Unix epoch: exact, compact, free of
-- time-zone conversion, and compared as integers on the hot paths.
--
-- deliver_after is the item's visibility time, as in SQS: an item is ready
-- when deliver_after <= now. Leasing an item moves deliver_after to the
-- lease's expiry, so an expired lease makes the item ready again without any
-- sweep, and the ready index below serves both new and redelivered items.
CREATE TABLE IF NOT EXISTS items (
  id               BIGINT UNSIGNED NOT NULL,  -- snowflake key from the router (routing/itemid)
  namespace        VARBINARY(128)  NOT NULL,
  topic            VARBINARY(128)  NOT NULL,
  priority         INT             NOT NULL,  -- lower is more urgent
  deliver_after    BIGINT          NOT NULL,  -- visibility time (see above)
  enqueued_at      BIGINT          NOT NULL,
  lease_ms         INT UNSIGNED    NOT NULL,  -- the item's own lease duration
  expires_at       BIGINT          NULL,      -- TTL; NULL = never
  attempts         INT             NOT NULL DEFAULT 0,
  lease_token      BIGINT UNSIGNED NOT NULL DEFAULT 0, -- 0 = no lease; random per lease batch
  leased_until     BIGINT          NULL,      -- set while leased (for GetItem and stats)
  dedup_key        VARBINARY(255)  NULL,
  payload          MEDIUMBLOB      NOT NULL,
  metadata         BLOB            NULL,      -- JSON object of strings
  last_error       TEXT            NULL,
  updated_at       BIGINT          NOT NULL,
  PRIMARY KEY (id),
  -- The dequeue path: the head of a topic's ready set in delivery order.
  -- Equality on (namespace, topic) then the index order *is* the delivery
  -- order (priority, deliver_after, id), so "ready head LIMIT n" reads n
  -- entries plus the not-yet-ready ones of each priority it passes (leased
  -- items sort after the ready ones of their priority, since their
  -- deliver_after is in the future).
  KEY ready (namespace, topic, priority, deliver_after, id),
  -- TTL sweep: DELETE ... WHERE expires_at <= now ORDER BY expires_at LIMIT n
  -- touches only expired rows, so the sweep stays bounded on any backlog.
  KEY ttl (expires_at),
  -- Dedup: one live item per (namespace, topic, dedup_key). NULL keys do
  -- not collide, so items without a key cost nothing here.
  UNIQUE KEY dedup (namespace, topic, dedup_key)
) ENGINE=InnoDB;

-- Items that used up their attempts. Same shape as items plus why and when.
CREATE TABLE IF NOT EXISTS dead_letters (
  id               BIGINT UNSIGNED NOT NULL,
  namespace        VARBINARY(128)  NOT NULL,
  topic            VARBINARY(128)  NOT NULL,
  priority         INT             NOT NULL,
  enqueued_at      BIGINT          NOT NULL,
  lease_ms         INT UNSIGNED    NOT NULL,
  attempts         INT             NOT NULL,
  dedup_key        VARBINARY(255)  NULL,
  payload          MEDIUMBLOB      NOT NULL,
  metadata         BLOB            NULL,
  last_error       TEXT            NULL,
  died_at          BIGINT          NOT NULL,
  PRIMARY KEY (id),
  -- Listing a topic's dead letters oldest first, paged by id.
  KEY topic_died (namespace, topic, died_at, id)
) ENGINE=InnoDB;

-- Enqueue batches already inserted, keyed by the batch's first item ID.
-- Checked in the insert's transaction, so a JetStream redelivery of a batch
-- whose items were inserted and since acked (deleted) is not inserted again.
CREATE TABLE IF NOT EXISTS enqueue_batches (
  batch_id         BIGINT UNSIGNED NOT NULL,
  applied_at       BIGINT          NOT NULL,
  PRIMARY KEY (batch_id),
  -- Pruning old batches by age without a scan.
  KEY applied (applied_at)
) ENGINE=InnoDB;
