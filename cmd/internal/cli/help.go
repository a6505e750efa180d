package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// help prints c's usage: the binary's to stdout, a verb's to stderr, as
// the flag package printed -h before.
func help(c *cobra.Command, _ []string) {
	w := c.ErrOrStderr()
	if !c.HasParent() {
		w = c.OutOrStdout()
	}
	_ = usage(w, c)
}

// usage prints c's usage: the list of sub-commands for a command that
// holds some, else its use line, summary and flags.
func usage(w io.Writer, c *cobra.Command) error {
	if c.HasAvailableSubCommands() {
		return groupUsage(w, c)
	}
	fmt.Fprintf(w, "usage: %s\n", c.UseLine())
	if about := strings.TrimSpace(c.Long); about != "" {
		fmt.Fprintf(w, "\n%s\n", about)
	} else if c.Short != "" {
		fmt.Fprintf(w, "\n%s\n", c.Short)
	}
	if c.HasAvailableFlags() {
		fmt.Fprintf(w, "\nflags:\n%s", c.Flags().FlagUsages())
	}
	return nil
}

// groupUsage lists c's sub-commands, under their group titles for the
// binary, with their arguments and summaries.
func groupUsage(w io.Writer, c *cobra.Command) error {
	subs := availableCommands(c)
	var names []string
	for _, sub := range subs {
		names = append(names, sub.Name())
	}
	if c.HasParent() {
		fmt.Fprintf(w, "usage: %s %s ...\n\n", c.CommandPath(), strings.Join(names, "|"))
	} else {
		fmt.Fprintf(w, "usage: %s COMMAND [flags] [ARGS]\n\n", c.Name())
		if about := strings.TrimSpace(c.Long); about != "" {
			fmt.Fprintf(w, "%s\n\n", about)
		}
	}
	// One column width for every group, so the lists line up.
	uses := make([]string, len(subs))
	width := 0
	for i, sub := range subs {
		uses[i] = strings.Replace(sub.UseLine(), " [flags]", "", 1)
		width = max(width, len(uses[i]))
	}
	list := func(group string) {
		for i, sub := range subs {
			if sub.GroupID == group {
				fmt.Fprintf(w, "  %-*s  %s\n", width, uses[i], sub.Short)
			}
		}
	}
	for _, g := range c.Groups() {
		fmt.Fprintln(w, g.Title)
		list(g.ID)
		fmt.Fprintln(w)
	}
	if len(c.Groups()) > 0 {
		fmt.Fprintln(w, "Other:")
	}
	list("")
	fmt.Fprintf(w, "\nRun \"%s COMMAND -h\" for a command's flags.\n", c.CommandPath())
	return nil
}

// availableCommands are c's sub-commands that help lists.
func availableCommands(c *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			out = append(out, sub)
		}
	}
	return out
}
