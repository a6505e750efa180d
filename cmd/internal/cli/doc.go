// Package cli is what Triage's two binaries share on top of cobra
// (github.com/spf13/cobra): `triage`, the production binary, and
// `triage-bed`, the development one. Each binary builds its command tree;
// this package gives the root its conventions once, so no verb repeats
// the prologue of flag parsing, error printing and exit codes.
//
// # Conventions
//
//   - Exit status 0 on success, 1 when the work failed, 2 for a mistake in
//     the command line. A verb returns [Usagef] for the latter; cli prints
//     "<command>: <message>" and the command's usage. Any other error is
//     printed as "<command>: <error>" with status 1; a verb that has
//     already reported returns [Exit].
//   - Help and usage keep the layout of Go's flag package, which the CLI
//     used before cobra: "usage: triage enqueue [flags] TOPIC
//     [PAYLOAD...]", the summary, then the flags. A verb's help goes to
//     stderr, the binary's own (no verb, -h, help) to stdout. Flag errors
//     read as the flag package words them ("flag provided but not
//     defined", "invalid value"), so scripts that matched them keep
//     working. Long flags take two dashes; flags may come anywhere among
//     the arguments, and "--" ends them.
//   - A command with sub-commands and no known one given says "missing
//     command" or "unknown command" with its list of sub-commands, the
//     binary as much for an unknown verb.
//   - A verb that runs from a config file (ConfigFile) takes --config,
//     --log-level and --log-format (text, the default, or json: one object
//     per line for log pipelines); its logger writes to stderr.
//   - Every binary has `version` (module version, VCS revision, time and
//     modified flag from runtime/debug.ReadBuildInfo) and `completion
//     bash|zsh|fish|powershell` (cobra's).
//   - [Main] runs the root under a context that SIGINT and SIGTERM cancel,
//     with the process's streams; tests call [Run] with their own.
//   - [Main] sets the collector's target to [GCPercent] (400) unless GOGC
//     is set: set where the process starts, so `triage serve`, the beds
//     and the benchmark (whose node runs inside triage-bed) collect alike.
package cli
