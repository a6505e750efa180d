// Package shardmaptest holds test helpers for code that follows the shard
// map. It exists so that the dequeuer's and the enqueuer's tests of their
// map-following loops share one way to make a map change land in the
// middle of a round (LandsDuringRead), rather than each keeping a copy,
// and the shard map's and the controller's tests one way to make a read of
// the map bucket lag behind it (LaggingKV).
package shardmaptest
