// Package shardmaptest holds test helpers for code that follows the shard
// map. It exists so that the dequeuer's and the enqueuer's tests of their
// map-following loops share one way to make a map change land in the
// middle of a round (LandsDuringRead), rather than each keeping a copy.
package shardmaptest
