// Package handback returns served items that never reached a consumer to
// their ready set, and keeps trying until it has.
//
// A served item nobody receives (a dequeue reply that could not be sent,
// a caller that had gone, the surplus of a merged reply, a serve whose
// answer was lost) is leased to nobody with an attempt counted. Left
// alone it comes back only when its lease lapses, and if that repeats it
// can reach max_attempts without ever reaching a consumer.
// store.ItemUnserve takes it back by its lease token, which makes every
// retry safe: it changes only rows still under that token, so an item
// acked, nacked, updated or served again since is left alone. The first
// try runs at once; while the shard's primary cannot be written (a
// failover, a fence, a partition) the try repeats in the background with
// a growing pause until it succeeds, the Returner stops, or the leases
// lapsed Grace ago. Past the lapse the item is ready again anyway, but the
// unserve still takes its attempt back while nobody has leased it since,
// so it keeps trying a while.
package handback
