-- ready_since keeps the ready time of a row a dequeuer prefetched. The
-- prefetch lease moves deliver_after to the lease's expiry (so the ready
-- index skips buffered rows), which would otherwise lose when the item
-- became ready: GetTopicStats' and the metrics' oldest ready age would leave
-- buffered items out, and an item handed back would queue behind newer ones
-- of its priority. NULL on rows that are not prefetched. A trailing NULL
-- column: MariaDB adds it instantly, without copying the table.
ALTER TABLE items ADD COLUMN IF NOT EXISTS ready_since BIGINT NULL;
