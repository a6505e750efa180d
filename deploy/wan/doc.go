// Package wan puts a simulated wide-area network between the regions of the
// local bed: every cross-region connection (replication, a node's access to
// another region's MariaDB, NATS cluster routes) goes through an in-process
// TCP proxy that adds one-way latency in each direction, and that a drill
// can cut and heal.
//
// The proxies are toxiproxy's (github.com/Shopify/toxiproxy/v2), used as a
// library rather than as a separate server: the bed owns them, bed.json
// lists them, and nothing else has to be installed or started.
//
// # Links
//
// A link ([Net.Link]) is directed by who dials: "the eu-west view of us-east's
// mariadbd" is a link from eu-west to us-east, listening on a free loopback
// port in front of the real server. Bytes are delayed in both directions,
// so one request and its answer cost twice the one-way latency, as on a
// real WAN; a new TCP connection costs more (handshakes are round trips
// too). Delays are applied per chunk from the moment the proxy read it, so
// a busy link keeps its throughput: latency, not bandwidth.
//
// # Partitions
//
// [Net.Cut] disables every link that touches a region: the proxies stop
// listening and close the connections they carry, so a peer sees its
// connections reset and new dials refused, the way a region that vanished
// behind a firewall rejecting traffic looks. [Net.Heal] starts them again on
// the same ports, so configured addresses stay valid. A partition where
// packets silently vanish (connections hang until a timeout) is not
// simulated; use tc netem in a network namespace for that.
//
// [Net.SetLatency] changes the latency of every link at once, including
// connections already open.
//
// # Why a custom latency toxic
//
// toxiproxy updates a toxic's settings by decoding JSON into the object its
// connection goroutines are reading, which the race detector rightly
// flags. Each link here carries its latency in an atomic that the link's
// toxic reads per chunk; the toxic is installed before the proxy accepts
// its first connection and never replaced.
package wan
