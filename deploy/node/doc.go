// Package node assembles Triage's roles (router, enqueuer, dequeuer) into
// one process from a config file. `triage serve` runs one node; the local
// bed runs one per region; e2e tests start nodes as separate processes to
// kill them.
package node
