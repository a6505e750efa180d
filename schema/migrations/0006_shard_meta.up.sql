-- The shard's failover epoch as its primary knows it: one row (id = 1).
-- The failover controller writes it on a newly promoted primary before it
-- publishes the shard map that names that primary (and it replicates to
-- the replicas from there). Every writer checks it against the epoch of
-- its own map before it writes (shardmap.Pool.Writer): a process whose map
-- is older than the database's epoch has missed a failover and must not
-- write, even if its stale map happens to name a server that is a primary
-- again. No row means the shard never failed over (epoch 0).
CREATE TABLE IF NOT EXISTS shard_meta (
  id     TINYINT UNSIGNED NOT NULL PRIMARY KEY,  -- always 1
  epoch  BIGINT UNSIGNED  NOT NULL
) ENGINE=InnoDB;
