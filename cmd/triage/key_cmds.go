package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
	"github.com/triage-queue/triage/routing/auth"
)

// keyCommand is `triage key`, which makes API keys for a router's
// keys_file (routing/auth), so that nobody generates or hashes a key by
// hand.
func keyCommand() *cobra.Command {
	g := cli.Group(&cobra.Command{
		Use:     "key COMMAND",
		GroupID: groupService,
		Short:   "Make API keys for a router's keys_file (sub-command create).",
	})
	g.AddCommand(keyCreateCommand())
	return g
}

// keyCreateNote goes to stderr after the key and its entry, so that a
// script reading stdout gets exactly the two lines.
const keyCreateNote = `
The first line is the key: hand it to its caller now (TRIAGE_TOKEN for the
CLI, "authorization: Bearer <key>" for the APIs). Only its SHA-256 is kept,
so it cannot be shown again. Add the second line to the keys file's "keys"
list; routers re-read the file within a second.
`

// keyCreateCommand makes a key with auth.NewToken and prints it once, then
// the keys file entry that grants it the flags' roles.
func keyCreateCommand() *cobra.Command {
	f := &keyFlags{}
	cmd := &cobra.Command{
		Use:   "create [flags] NAME",
		Short: "Make a new random API key; print it and its keys_file entry.",
		Long: `Make a new random API key ("trk_" and 32 random bytes, base64url) for the
identity NAME, and print two lines to stdout: the key, then the keys file
entry to add, which holds the key's SHA-256 (never the key), NAME and the
grants of the flags. Every --role is granted on every --namespace ("*" is
every namespace); --cluster-admin grants everything.

  triage key create orders-api -n orders -r producer,reader
  triage key create ops --cluster-admin`,
		Args: cli.ExactArgs(1, "NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			k, err := f.entry(args[0])
			if err != nil {
				return err
			}
			token, line, err := newKeyEntry(k)
			if err != nil {
				return err
			}
			fmt.Fprintln(c.OutOrStdout(), token)
			fmt.Fprintln(c.OutOrStdout(), line)
			fmt.Fprint(c.ErrOrStderr(), keyCreateNote)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringSliceVarP(&f.namespaces, "namespace", "n", nil, "namespace the roles hold on, repeated or comma-separated; \"*\" is every namespace")
	fs.StringSliceVarP(&f.roles, "role", "r", nil, "producer, consumer, reader or admin, repeated or comma-separated")
	fs.BoolVar(&f.clusterAdmin, "cluster-admin", false, "grant cluster-admin, which holds every role on every namespace too")
	fs.Float64Var(&f.rateLimit, "rate-limit", 0, "most requests per second of the key (a token bucket); 0 means no limit")
	fs.IntVar(&f.burst, "burst", 0, "size of the --rate-limit bucket (default: the rate rounded up)")
	return cmd
}

// keyFlags are the grants and limits of `triage key create`, as the keys
// file's entry (auth.Key) words them.
type keyFlags struct {
	namespaces, roles []string
	clusterAdmin      bool
	rateLimit         float64
	burst             int
}

// namespaceRoles are the roles --role accepts: those a keys file grants
// per namespace.
var namespaceRoles = []auth.Role{auth.Producer, auth.Consumer, auth.Reader, auth.Admin}

// entry checks the flags and returns the keys file entry for name, without
// its hash. A key granted nothing is a usage error: it could call nothing.
func (f *keyFlags) entry(name string) (auth.Key, error) {
	k := auth.Key{Name: strings.TrimSpace(name), ClusterAdmin: f.clusterAdmin, RateLimit: f.rateLimit, Burst: f.burst}
	switch {
	case k.Name == "":
		return auth.Key{}, cli.Usagef("NAME must not be empty: it names the caller in logs and audit lines")
	case len(f.roles) > 0 && len(f.namespaces) == 0:
		return auth.Key{}, cli.Usagef("--role needs --namespace (\"*\" for every namespace)")
	case len(f.namespaces) > 0 && len(f.roles) == 0:
		return auth.Key{}, cli.Usagef("--namespace needs --role")
	case len(f.roles) == 0 && !f.clusterAdmin:
		return auth.Key{}, cli.Usagef("give --namespace and --role, or --cluster-admin: a key granted nothing can call nothing")
	case !(f.rateLimit >= 0) || math.IsInf(f.rateLimit, 0):
		return auth.Key{}, cli.Usagef("--rate-limit must be a number of requests per second, 0 or more")
	case f.burst < 0:
		return auth.Key{}, cli.Usagef("--burst must not be negative")
	case f.burst > 0 && f.rateLimit == 0:
		return auth.Key{}, cli.Usagef("--burst needs --rate-limit")
	}
	roles, err := parseRoles(f.roles)
	if err != nil {
		return auth.Key{}, err
	}
	for _, ns := range f.namespaces {
		if ns == "" {
			return auth.Key{}, cli.Usagef("empty --namespace (\"*\" is every namespace)")
		}
		if k.Namespaces == nil {
			k.Namespaces = map[string][]auth.Role{}
		}
		k.Namespaces[ns] = roles
	}
	return k, nil
}

// parseRoles checks the --role values and returns them without
// duplicates, in the order given.
func parseRoles(names []string) ([]auth.Role, error) {
	var roles []auth.Role
	for _, n := range names {
		r := auth.Role(strings.TrimSpace(n))
		switch {
		case r == auth.ClusterAdmin:
			return nil, cli.Usagef("--role cluster-admin: cluster-admin holds on every namespace; give --cluster-admin")
		case !slices.Contains(namespaceRoles, r):
			return nil, cli.Usagef("--role %q: allowed producer, consumer, reader, admin", n)
		case !slices.Contains(roles, r):
			roles = append(roles, r)
		}
	}
	return roles, nil
}

// newKeyEntry makes a key and returns it with k's entry, holding the key's
// hash, as one line of JSON. The entry is parsed back as a keys file
// would be, so what is printed is what routers accept.
func newKeyEntry(k auth.Key) (token, line string, err error) {
	token, k.SHA256, err = auth.NewToken()
	if err != nil {
		return "", "", fmt.Errorf("new key: %w", err)
	}
	data, err := json.Marshal(k)
	if err != nil {
		return "", "", err
	}
	if _, err := auth.ParseKeys([]byte(`{"keys": [` + string(data) + `]}`)); err != nil {
		return "", "", err
	}
	return token, string(data), nil
}
