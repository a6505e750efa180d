package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
)

type result struct {
	code           int
	stdout, stderr string
}

// setup builds a binary "demo" with a leaf verb "greet NAME", a verb that
// fails, a verb that reports its own failure and a group "things" of two
// verbs.
func setup(t *testing.T) func(args ...string) result {
	t.Helper()
	return func(args ...string) result {
		root := NewRoot("demo", "demo — a test binary")
		root.AddGroup(&cobra.Group{ID: "main", Title: "Main:"})
		var loud bool
		var times int
		greet := &cobra.Command{Use: "greet [flags] NAME", GroupID: "main", Short: "Greet someone.",
			RunE: func(c *cobra.Command, args []string) error {
				if len(args) != 1 {
					return Usagef("want one NAME")
				}
				for range times {
					c.Printf("hello %s\n", args[0])
				}
				if loud {
					c.Println("!")
				}
				return nil
			}}
		greet.Flags().BoolVar(&loud, "loud", false, "shout")
		greet.Flags().IntVarP(&times, "times", "t", 1, "how often")
		fail := &cobra.Command{Use: "fail", RunE: func(*cobra.Command, []string) error { return errors.New("it broke") }}
		quiet := &cobra.Command{Use: "quiet", RunE: func(c *cobra.Command, _ []string) error {
			c.PrintErrln("reported my way")
			return Exit(3)
		}}
		things := Group(&cobra.Command{Use: "things COMMAND", Short: "Things."})
		things.AddCommand(
			&cobra.Command{Use: "list", Short: "List things.", RunE: func(c *cobra.Command, _ []string) error { c.Println("a b"); return nil }},
			&cobra.Command{Use: "drop NAME", Short: "Drop a thing.", RunE: func(*cobra.Command, []string) error { return nil }},
		)
		root.AddCommand(greet, fail, quiet, things)
		var stdout, stderr bytes.Buffer
		code := Run(t.Context(), root, args, strings.NewReader(""), &stdout, &stderr)
		return result{code, stdout.String(), stderr.String()}
	}
}

func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	run := setup(t)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr []string
	}{
		{name: "ok", args: []string{"greet", "--times", "2", "ann"}, stdout: "hello ann\nhello ann\n"},
		{name: "flags anywhere", args: []string{"greet", "ann", "-t", "1", "--loud"}, stdout: "hello ann\n!\n"},
		{name: "usage error", args: []string{"greet"}, code: 2,
			stderr: []string{"demo greet: want one NAME\n", "usage: demo greet [flags] NAME\n", "--loud", "Greet someone."}},
		{name: "failure", args: []string{"fail"}, code: 1, stderr: []string{"demo fail: it broke\n"}},
		{name: "reported", args: []string{"quiet"}, code: 3, stderr: []string{"reported my way\n"}},
		{name: "unknown flag", args: []string{"greet", "--lod", "ann"}, code: 2,
			stderr: []string{"demo greet: flag provided but not defined: --lod\n", "usage: demo greet"}},
		{name: "unknown shorthand", args: []string{"greet", "-x", "ann"}, code: 2,
			stderr: []string{"flag provided but not defined: -x\n"}},
		{name: "invalid value", args: []string{"greet", "--times", "many", "ann"}, code: 2,
			stderr: []string{`invalid value "many" for flag --times: `}},
		{name: "missing value", args: []string{"greet", "ann", "--times"}, code: 2,
			stderr: []string{"flag needs an argument: --times"}},
		{name: "unknown command", args: []string{"gret"}, code: 2,
			stderr: []string{`demo: unknown command "gret" (did you mean greet?)`, "usage: demo COMMAND"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := run(tc.args...)
			require.Equal(t, tc.code, r.code, r.stderr)
			require.Equal(t, tc.stdout, r.stdout)
			for _, want := range tc.stderr {
				require.Contains(t, r.stderr, want)
			}
			if tc.stderr == nil {
				require.Empty(t, r.stderr)
			}
		})
	}
}

// TestHelp: the binary's help goes to stdout and lists the verbs under
// their groups; a verb's goes to stderr, as the flag package's did.
func TestHelp(t *testing.T) {
	t.Parallel()
	run := setup(t)
	for _, args := range [][]string{nil, {"-h"}, {"help"}} {
		r := run(args...)
		require.Equal(t, 0, r.code, args)
		require.Empty(t, r.stderr)
		require.Contains(t, r.stdout, "usage: demo COMMAND [flags] [ARGS]\n\ndemo — a test binary\n\nMain:\n  demo greet NAME")
		require.Contains(t, r.stdout, "Other:\n")
		require.Contains(t, r.stdout, "demo version")
		require.Contains(t, r.stdout, "demo completion")
	}
	r := run("greet", "-h")
	require.Equal(t, 0, r.code)
	require.Empty(t, r.stdout)
	require.True(t, strings.HasPrefix(r.stderr, "usage: demo greet [flags] NAME\n\nGreet someone.\n\nflags:\n"), r.stderr)
	require.Contains(t, r.stderr, "-t, --times int")
}

func TestGroup(t *testing.T) {
	t.Parallel()
	run := setup(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{args: []string{"things"}, code: 2, want: "demo things: missing command\n"},
		{args: []string{"things", "burn"}, code: 2, want: `demo things: unknown command "burn"`},
		{args: []string{"things", "--", "list"}, code: 2, want: "demo things: missing command\n"},
		{args: []string{"things", "help"}, code: 0},
		{args: []string{"things", "-h"}, code: 0},
	} {
		r := run(tc.args...)
		require.Equal(t, tc.code, r.code, tc.args)
		require.Contains(t, r.stderr, tc.want)
		require.Contains(t, r.stderr, "usage: demo things drop|list ...\n")
		require.Contains(t, r.stderr, "  demo things drop NAME  Drop a thing.\n")
		require.Empty(t, r.stdout)
	}
	r := run("things", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "a b\n", r.stdout)
}

func TestVersionAndCompletion(t *testing.T) {
	t.Parallel()
	run := setup(t)
	r := run("version")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, "demo "), r.stdout)
	require.Contains(t, r.stdout, "  go       go1.")
	require.Equal(t, 2, run("version", "extra").code)

	for _, shell := range []string{"bash", "zsh", "fish"} {
		r := run("completion", shell)
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, "demo", shell)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	info := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/triage-queue/triage", Version: "v0.0.0-20260101120000-0123456789ab+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-01-01T12:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}}
	require.Equal(t, `triage v0.0.0-20260101120000-0123456789ab+dirty
  revision 0123456789abcdef0123456789abcdef01234567
  time     2026-01-01T12:00:00Z
  modified true (uncommitted changes)
  go       go1.26.8
`, Version("triage", info))

	info = &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}
	require.Equal(t, "triage-bed (devel)\n  revision unknown (built without VCS stamping)\n  go       go1.26.8\n", Version("triage-bed", info))
	require.Equal(t, "triage (no build information)\n", Version("triage", nil))
}

// --log-format json gives one JSON object per line; an unknown format is
// a usage error.
func TestConfigFileLogFormat(t *testing.T) {
	t.Parallel()
	file := t.TempDir() + "/c.json"
	require.NoError(t, os.WriteFile(file, []byte(`{"name":"x"}`), 0o644))
	run := func(args ...string) (result, string) {
		var logged string
		cmd := &cobra.Command{Use: "serve", Args: NoArgs}
		cf := AddConfigFlags(cmd, "demo")
		cmd.RunE = func(c *cobra.Command, _ []string) error {
			var v struct {
				Name string `json:"name"`
			}
			log, err := cf.Load(c, &v)
			if err != nil {
				return err
			}
			log.Info("hello", "name", v.Name)
			return nil
		}
		root := NewRoot("demo", "demo")
		root.AddCommand(cmd)
		var out, errb bytes.Buffer
		code := Run(t.Context(), root, append([]string{"serve", "--config", file}, args...), strings.NewReader(""), &out, &errb)
		logged = errb.String()
		return result{code: code, stdout: out.String(), stderr: errb.String()}, logged
	}
	r, logged := run("--log-format", "json")
	require.Zero(t, r.code, r.stderr)
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(logged)), &line))
	require.Equal(t, "hello", line["msg"])
	require.Equal(t, "x", line["name"])
	r, logged = run()
	require.Zero(t, r.code, r.stderr)
	require.Contains(t, logged, `msg=hello name=x`)
	r, _ = run("--log-format", "yaml")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `--log-format "yaml": allowed text or json`)
}

// TestGCPercent: the binaries collect at GCPercent, unless GOGC is set,
// which wins.
func TestGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	setGCPercent(func(string) string { return "" })
	require.Equal(t, GCPercent, debug.SetGCPercent(100))
	setGCPercent(func(k string) string { return map[string]string{"GOGC": "50"}[k] })
	require.Equal(t, 100, debug.SetGCPercent(100), "GOGC set: left as the runtime read it")
}
