package cli

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the build's module version, VCS revision and time.",
		Args:  NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			info, _ := debug.ReadBuildInfo()
			_, err := fmt.Fprint(c.OutOrStdout(), Version(c.Root().Name(), info))
			return err
		},
	}
}

// Version describes the build of the binary name from its build info:
// the main module's version (a tag or pseudo-version when built from a
// clone, "(devel)" otherwise), the VCS revision and commit time, whether
// the tree had uncommitted changes, and the Go version. A build without
// VCS stamping (-buildvcs=false, or not from a git clone) says so.
func Version(name string, info *debug.BuildInfo) string {
	if info == nil {
		return name + " (no build information)\n"
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", name, cmp.Or(info.Main.Version, "(devel)"))
	if rev := settings["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "  revision %s\n", rev)
		if t := settings["vcs.time"]; t != "" {
			fmt.Fprintf(&b, "  time     %s\n", t)
		}
		if settings["vcs.modified"] == "true" {
			fmt.Fprintf(&b, "  modified true (uncommitted changes)\n")
		} else {
			fmt.Fprintf(&b, "  modified false\n")
		}
	} else {
		fmt.Fprintf(&b, "  revision unknown (built without VCS stamping)\n")
	}
	fmt.Fprintf(&b, "  go       %s\n", info.GoVersion)
	return b.String()
}
