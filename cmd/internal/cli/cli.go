package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// usageError is a mistake in the command line: exit status 2 and usage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// Usagef returns a usage error: Run prints it with the command's usage
// and exits with status 2.
func Usagef(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// IsUsage reports whether err is a usage error of Usagef.
func IsUsage(err error) bool {
	var ue *usageError
	return errors.As(err, &ue)
}

// exitError ends the run with a status and no message: the command has
// reported already.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Exit returns an error that makes Run return code without printing
// anything, for a command that has reported its failure itself.
func Exit(code int) error { return exitError(code) }

// NewRoot returns the root command of the binary name, with the shared
// conventions (see the package documentation) and the version command.
// about heads its help.
func NewRoot(name, about string) *cobra.Command {
	root := &cobra.Command{
		Use:           name,
		Long:          about,
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE:          runGroup,
		// Names one or two edits from a verb are suggested.
		SuggestionsMinimumDistance: 2,
	}
	root.SetHelpFunc(help)
	root.SetUsageFunc(func(c *cobra.Command) error { return usage(c.ErrOrStderr(), c) })
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: flagError(err)} })
	root.AddCommand(versionCommand())
	return root
}

// Group turns c into a command that only holds sub-commands: run alone or
// with an unknown one, it says so with its list of sub-commands.
func Group(c *cobra.Command) *cobra.Command {
	c.Args = cobra.ArbitraryArgs
	c.RunE = runGroup
	c.SuggestionsMinimumDistance = 2
	return c
}

// runGroup runs a command with sub-commands when cobra found none of them
// in the arguments: the binary alone prints its help; otherwise "help"
// asks for the list, and anything else is a usage error. After "--" even
// a sub-command's name is an argument, not a command.
func runGroup(c *cobra.Command, args []string) error {
	switch {
	case len(args) == 0 && !c.HasParent():
		help(c, args)
		return nil
	case len(args) == 0 || c.ArgsLenAtDash() == 0:
		return Usagef("missing command")
	case args[0] == "help":
		help(c, args)
		return nil
	}
	msg := fmt.Sprintf("unknown command %q", args[0])
	if s := c.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
	}
	return Usagef("%s", msg)
}

// NoArgs is the Args check of a verb that takes no positional
// arguments: any is a usage error.
func NoArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return Usagef("unexpected argument %q", args[0])
	}
	return nil
}

// ExactArgs is the Args check of a verb that takes n positional
// arguments, which its use line calls what.
func ExactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return Usagef("want %s, got %d argument(s)", what, len(args))
		}
		return nil
	}
}

// Main runs root with the process's arguments and streams, under a
// context that SIGINT and SIGTERM cancel, and exits with Run's status.
// The collector runs at GCPercent unless GOGC says otherwise.
func Main(root *cobra.Command) {
	setGCPercent(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, root, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run executes root with args and the given streams and returns the exit
// status: 0, 1 when the command failed, 2 for a usage error. It prints
// what went wrong to stderr.
func Run(ctx context.Context, root *cobra.Command, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if args == nil {
		args = []string{} // cobra reads os.Args for nil
	}
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	c, err := root.ExecuteContextC(ctx)
	var ue *usageError
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return int(ee)
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %s\n", c.CommandPath(), ue.msg)
		if !c.HasParent() {
			fmt.Fprintln(stderr)
		}
		_ = usage(stderr, c)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", c.CommandPath(), err)
		return 1
	}
}

// flagError words a flag parsing error as Go's flag package does.
func flagError(err error) string {
	var notExist *pflag.NotExistError
	var invalid *pflag.InvalidValueError
	switch {
	case errors.As(err, &notExist):
		name, group := notExist.GetSpecifiedName(), notExist.GetSpecifiedShortnames()
		switch {
		case group == "":
			return "flag provided but not defined: --" + name
		case group != name:
			return fmt.Sprintf("flag provided but not defined: -%s (in -%s)", name, group)
		}
		return "flag provided but not defined: -" + name
	case errors.As(err, &invalid):
		return fmt.Sprintf("invalid value %q for flag --%s: %v", invalid.GetValue(), invalid.GetFlag().Name, invalid.Unwrap())
	}
	return err.Error()
}

// Logger returns a text logger on w at level: debug, info, warn or error
// (anything else is info).
func Logger(w io.Writer, level string) *slog.Logger {
	l, _ := FormatLogger(w, level, "text")
	return l
}

// FormatLogger returns a logger on w at level (as Logger) in format: text
// (logfmt, for people) or json (one object per line, for log pipelines).
func FormatLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, Usagef("--log-format %q: allowed text or json", format)
}

// ReadJSON decodes the JSON config file into v, refusing unknown fields so
// that a misspelt key is an error rather than a silent default.
func ReadJSON(file string, v any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// ConfigFile holds --config, --log-level and --log-format, the flags of a
// verb that runs from a JSON config file (serve, bootstrap, wan).
type ConfigFile struct {
	path, level, format string
}

// AddConfigFlags registers --config (a file of what) and --log-level on
// cmd.
func AddConfigFlags(cmd *cobra.Command, what string) *ConfigFile {
	f := &ConfigFile{}
	cmd.Flags().StringVar(&f.path, "config", "", what+" config file (JSON; see "+what+")")
	cmd.Flags().StringVar(&f.level, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&f.format, "log-format", "text", "text or json (one object per line)")
	return f
}

// Load decodes the config file into v and returns the logger that
// --log-level and --log-format ask for, on c's stderr.
func (f *ConfigFile) Load(c *cobra.Command, v any) (*slog.Logger, error) {
	if f.path == "" {
		return nil, Usagef("--config is required")
	}
	if err := ReadJSON(f.path, v); err != nil {
		return nil, err
	}
	return FormatLogger(c.ErrOrStderr(), f.level, f.format)
}

// GCPercent is the collector's target (GOGC) of Triage's binaries when the
// environment sets none: a node's live heap is small (buffers of leased
// items and in-flight batches), and what costs is the garbage of every
// request, so the default 100 spends CPU that requests need. In
// triage-enqueue-batch1 (512 gRPC clients, bench and node in one
// process on 2 cores) background marking and assists took 13.5 % of the
// process at 100 and 3.0 % at 400; items/s over four alternating runs
// 8.9-10.3k at 100 against 9.9-13.0k at 400, with the same peak RSS
// (360 MB). GOGC and GOMEMLIMIT still apply as Go documents them.
const GCPercent = 400

// setGCPercent sets GCPercent unless getenv names a GOGC.
func setGCPercent(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
}
