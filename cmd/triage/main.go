package main

import (
	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
)

func main() { cli.Main(newRoot()) }

// Command groups of the root's help.
const (
	groupService = "service"
	groupCompose = "compose"
	groupClient  = "client"
)

// newRoot builds the triage command tree.
func newRoot() *cobra.Command {
	root := cli.NewRoot("triage", "triage — a multi-region priority queue on sharded MySQL")
	root.AddGroup(
		&cobra.Group{ID: groupService, Title: "Service:"},
		&cobra.Group{ID: groupCompose, Title: "Containers (the compose bed, deploy/compose):"},
		&cobra.Group{ID: groupClient, Title: "Client (talk to a router; --addr or TRIAGE_ADDR, default " + defaultRouterAddr + "):"},
	)
	root.AddCommand(serveCommand(), keyCommand())
	root.AddCommand(natsCommand(), bootstrapCommand(), probeCommand())
	root.AddCommand(clientCommands()...)
	return root
}
