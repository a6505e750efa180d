-- A tombstone keeps a dedup key for two reasons. Until window_until (the
-- namespace's dedup window after the item left) any enqueue of the key
-- is a duplicate. Until expires_at (at least store.KeyMemory after the
-- item left) an envelope enqueued before held_since, the enqueued_at of
-- the item that held the key, is one too: it is an earlier attempt of an
-- enqueue that was retried (its first answer was not ok) and whose retry
-- was inserted first, delivered and acked. Trailing columns with
-- defaults: MariaDB adds them instantly.
ALTER TABLE dedup_tombstones
  ADD COLUMN IF NOT EXISTS window_until BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS held_since   BIGINT NOT NULL DEFAULT 0;
UPDATE dedup_tombstones SET window_until = expires_at WHERE window_until = 0;
