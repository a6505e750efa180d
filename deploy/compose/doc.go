// Package compose is the Go side of the multi-region docker-compose bed in
// this directory: Generate, which writes docker-compose.yml and config/
// from a Topology, and Bootstrap, which `triage bootstrap` runs in the
// bed's one-shot bootstrap container.
//
// # The bed
//
// docker-compose.yml runs the local bed's topology (deploy/bed) with each
// part in a container of its own: three regions (us-east, eu-west,
// ap-south), one Docker network per region and a "wan" network between
// them on which only the regions' WAN gateways sit (`triage-bed wan`,
// deploy/wan.Gateway: 20 ms one way, a real network cut when a gateway is
// disconnected); per region the primary of the region's shard and a
// replica of each other region's shard (MariaDB with GTID and semi-sync,
// AFTER_SYNC, no fallback to async), one NATS server of a three-node
// JetStream cluster (`triage nats`), and the router, enqueuer, dequeuer
// and controller roles (`triage serve --config /etc/triage/<role>.json`).
// Processes reach another region's servers only through their region's
// gateway.
//
// # Drills
//
// Bed drives a running bed for `triage-bed drill --bed compose` (a
// drill.Bed): primary-kill and region-down are docker kill, a partition is
// docker network disconnect of the region's gateway, and a heal starts and
// reconnects what they broke.
//
// # Generated files
//
// docker-compose.yml and config/ are committed, so the bed reads as plain
// files and runs with docker-compose alone, but written by Generate from
// DefaultTopology (`go generate ./deploy/compose`); a test fails when they
// differ from what it writes. docker-compose.spare.yml, an override, adds
// spare shards: provisioned by the bootstrap but outside the shard map, to
// add online with `triage shard add` (`make compose-up SPARE_SHARDS=1`).
//
// # Keys and TLS
//
// As on the process bed, the routers want an API key, and NATS wants TLS
// on every client connection and route, and a login. WriteBedDir makes
// them for each bed (up.sh runs it through ./beddir): a cluster-admin key
// and the routers' keys file, random NATS passwords, and a throwaway CA
// with the NATS servers' certificate, in a directory outside config/
// (TRIAGE_BED_DIR) that docker-compose.yml mounts, so nothing of it is
// committed. Open finds that directory from a router's mounts and gives
// its key to the drills.
//
// # Images without a registry
//
// build-images.sh makes every image locally and tags it by a content hash
// of its inputs, so a second build only rebuilds the Go binary: the MariaDB
// and Prometheus images from one Debian bookworm root file system
// (debootstrap minbase, docker import), the production image (deploy/image:
// FROM scratch, the static triage binary alone, run as uid 65532), which
// every Triage container runs, and on it a bed-tools image adding
// triage-bed, which only the WAN gateways run, so no bed code ships in the
// production image.
//
// # Prometheus
//
// One Prometheus on every region's network scrapes every role's metrics
// listener and evaluates deploy/prometheus/alerts.yml (prometheus.go), so
// the alert rules run against a live multi-region bed, not only promtool's
// unit tests.
//
// # Bootstrap
//
// The role containers start after the bootstrap container exited 0
// (depends_on: service_completed_successfully). It runs what the local bed
// runs too (package cmd/triage/provision): EnsureAccounts, Replicate and
// WaitJetStream, then
// creates every NATS bucket and stream the nodes open, one at a time, and
// publishes the shard map. See Bootstrap.
//
// README.md in this directory lists the containers, their configs and the
// make targets.
package compose
