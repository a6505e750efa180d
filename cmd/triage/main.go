package main

import (
	"log/slog"

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
	root.AddCommand(serveCommand())
	root.AddCommand(natsCommand(), bootstrapCommand(), probeCommand())
	root.AddCommand(clientCommands()...)
	return root
}

// configFile holds --config and --log-level, the flags of a verb that runs
// from a JSON config file.
type configFile struct {
	path, level string
}

// addConfigFlags registers --config (a file of what) and --log-level on
// cmd.
func addConfigFlags(cmd *cobra.Command, what string) *configFile {
	f := &configFile{}
	cmd.Flags().StringVar(&f.path, "config", "", what+" config file (JSON; see "+what+")")
	cmd.Flags().StringVar(&f.level, "log-level", "info", "debug, info, warn or error")
	return f
}

// load decodes the config file into v and returns the logger that
// --log-level asks for, on c's stderr.
func (f *configFile) load(c *cobra.Command, v any) (*slog.Logger, error) {
	if f.path == "" {
		return nil, cli.Usagef("--config is required")
	}
	if err := cli.ReadJSON(f.path, v); err != nil {
		return nil, err
	}
	return cli.Logger(c.ErrOrStderr(), f.level), nil
}
