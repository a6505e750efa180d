// Package wan puts a simulated wide-area network between the regions of a
// bed: every cross-region connection (replication, a node's access to
// another region's MariaDB, NATS cluster routes) goes through a TCP proxy
// that adds one-way latency in each direction. It has two forms:
//
//   - Net, for the process bed (deploy/bed): in-process links, one per
//     (region, server) pair, that a drill cuts and heals by stopping them.
//   - Gateway, for the docker-compose bed (deploy/compose): one proxy per
//     region in a container of its own (`triage-bed wan`), the only container
//     of the region on the network between regions. A partition there is a
//     real network cut (docker network disconnect of the gateway), not
//     something the proxy does.
//
// # Gateways
//
// Every server that other regions reach is an Endpoint with a port of its
// own, on which every gateway listens. A process of region A dials A's
// gateway on that port; A's gateway waits one round trip (the handshake a
// real WAN costs), dials the server's region's gateway on the same port
// over the network between regions and delays every byte, both ways, by
// the one-way latency (default 20 ms, so 40 ms a round trip); that gateway
// relays to the server on its region's network without delay. Configs
// name remote servers by the local gateway's address
// (node.Config.MySQL.DialVia, ReplicationVia, NATS routes).
//
// A cut drops packets silently, as a real one does. The gateways set
// keepalives and TCP_USER_TIMEOUT on their connections between regions,
// so both sides notice within about five seconds and close the connection
// they relay for: a process sees its cross-region connection closed, as
// behind a firewall that drops the flow, and new dials closed at once
// while the other region's gateway cannot be reached. (The gateway is a
// small relay of its own rather than a toxiproxy proxy because it needs
// those socket options on the connections it dials; toxiproxy dials with
// net.Dial.)
//
// # Links (the process bed)
//
// The proxies are toxiproxy's (github.com/Shopify/toxiproxy/v2), used as a
// library rather than as a separate server: the bed owns them, bed.json
// lists them, and nothing else has to be installed or started.
//
// A link ([Net.Link]) is directed by who dials: "the eu-west view of us-east's
// mariadbd" is a link from eu-west to us-east, listening on a free loopback
// port in front of the real server. Bytes are delayed in both directions,
// so one request and its answer cost twice the one-way latency, as on a
// real WAN; a new TCP connection costs more (handshakes are round trips
// too). Delays are applied per chunk from the moment the proxy read it, so
// a busy link keeps its throughput: latency, not bandwidth.
//
// # Partitions of the process bed
//
// [Net.Cut] disables every link that touches a region: the proxies stop
// listening and close the connections they carry, so a peer sees its
// connections reset and new dials refused, the way a region that vanished
// behind a firewall rejecting traffic looks. [Net.Heal] starts them again on
// the same ports, so configured addresses stay valid. A partition where
// packets silently vanish (connections hang until a timeout) is not
// simulated here; the compose bed's cuts are of that kind.
//
// [Net.SetLatency] changes the latency of every link at once, including
// connections already open. [Net.Spike] adds latency to the links of one
// region (the nemesis's wan-spike); [Gateway.Spike] does the same on the
// compose bed, where `triage-bed wan` starts a spike on SIGUSR1 and ends
// it on SIGUSR2.
//
// # Why a custom latency toxic
//
// toxiproxy updates a toxic's settings by decoding JSON into the object its
// connection goroutines are reading, which the race detector rightly
// flags. Each link here carries its latency in an atomic that the link's
// toxic reads per chunk; the toxic is installed before the proxy accepts
// its first connection and never replaced.
package wan
