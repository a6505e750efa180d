// Package bootstrap is `triage bootstrap`: the one-shot container of the
// compose bed (and of any multi-host deployment laid out like it) that
// sets up accounts, schema, replication, the NATS buckets and streams and
// the shard map before the role containers start. It lives beside the
// production binary rather than in deploy/compose, because that package
// also drives the bed for drills (docker, deploy/drill, the simulated
// WAN), which the production binary must not link.
package bootstrap
