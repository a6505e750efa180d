package main

import (
	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
)

func main() { cli.Main(newRoot()) }

// Command groups of the root's help.
const (
	groupBed   = "bed"
	groupDrill = "drill"
)

// newRoot builds the triage-bed command tree.
func newRoot() *cobra.Command {
	root := cli.NewRoot("triage-bed", "triage-bed — Triage's local bed, failover drills and benchmarks (development and tests)")
	root.AddGroup(
		&cobra.Group{ID: groupBed, Title: "Local bed (real MariaDB, embedded NATS, a node per region, in this process):"},
		&cobra.Group{ID: groupDrill, Title: "Against a bed:"},
	)
	root.AddCommand(upCommand(), downCommand(), scaleCommand(), drillCommand(), nemesisCommand(), benchCommand(), wanCommand())
	return root
}
