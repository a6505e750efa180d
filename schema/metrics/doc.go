// Package metrics holds Triage's Prometheus metrics: one Set per node,
// registered on the node's own registry (never the global default one, so
// tests can run several nodes in one process), passed to each role, and
// the collectors that read depth from the shards and state from the shard
// map when scraped.
//
// It lives under schema/ because every role already imports schema/store
// and what it counts is the queue's items and their tables; roles never
// import each other, so the metrics they share cannot live in one of
// them.
//
// # Names and labels
//
// Metric names, labels and what they mean are listed in README.md
// ("Observability"). Label sets are bounded: namespaces are configured;
// topics are capped per namespace (Options.MaxTopics, default 100: the
// first topics a node sees keep their own label, later ones add up under
// the topic label "_other"); priorities fall into five bands "0" (0 and
// below), "1", "2", "3", "4+"; shards are configured. Latency histograms
// carry the namespace only, not the topic, since each adds a dozen series.
//
// # Hot paths
//
// A role gets a topic's, namespace's or shard's metrics once per request
// (Topic, Namespace, Shard: a read-locked map lookup, no allocation once
// the metrics exist) and increments curried counters; no label string is
// built per request.
//
// # Depth
//
// RegisterDepth adds a collector that counts, when scraped and at most
// every DepthConfig.MinInterval (default 5 s), the items of the region's
// shards by namespace, topic, band and state, the oldest ready age and the
// dead letters, with one GROUP BY per table per shard
// (store.ItemDepth). That reads every row, so its cost grows with the
// backlog; max_statement_time bounds it, and a shard over budget shows in
// triage_depth_collect_errors_total instead of stalling the scrape.
// Exact per-topic depth on demand stays GetTopicStats.
//
// # Throughput
//
// The counters of enqueued, delivered, acked and dead-lettered items
// also count into a ring per namespace of 10-second intervals over the
// last hour (Throughput), which GetThroughput serves to the console's
// chart: an operator sees the last hour's rates without a Prometheus.
// The ring is the node's own memory, so it starts empty with the node and
// counts only what this node's router and dequeuer did. A namespace's
// ring holds only its own counts, so one tenant's chart never shows
// another's traffic.
package metrics
