package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// clientMayImport are the only packages of the module that a program
// importing the client links: the client and the generated API it speaks.
var clientMayImport = []string{module + "/client", module + "/proto/triage/v1"}

// notInClient are third-party modules a program importing the client must
// not link: the client talks gRPC to a router, so nothing of NATS, MySQL,
// the WAN proxies, the browser driver or the test libraries belongs in
// it.
var notInClient = []string{
	"github.com/nats-io",
	"github.com/go-sql-driver/mysql",
	"github.com/jmoiron/sqlx",
	"github.com/Shopify/toxiproxy",
	"github.com/chromedp",
	"github.com/stretchr/testify",
	"go.uber.org/goleak",
}

// clientDepProblems returns what of deps (go list -deps output) a program
// importing the client must not link: any package of the module but
// clientMayImport (the servers: routing, enqueuer, dequeuer, regions,
// schema, shardmap, deploy, cmd/...) and the modules of notInClient.
func clientDepProblems(deps []string) []string {
	var bad []string
	for _, d := range deps {
		under := func(prefix string) bool { return d == prefix || strings.HasPrefix(d, prefix+"/") }
		if under(module) && !slices.Contains(clientMayImport, d) || slices.ContainsFunc(notInClient, under) {
			bad = append(bad, d)
		}
	}
	return bad
}

// TestClientImportsNoServer holds the client importable on its own: a
// program importing github.com/triage-queue/triage/client links the
// client, the generated API and gRPC's stack, and no server package of
// Triage nor the servers' dependencies (NATS, MySQL drivers, toxiproxy,
// chromedp). The check is shown to fail on a server package.
func TestClientImportsNoServer(t *testing.T) {
	t.Parallel()
	deps := goList(t, "-deps", module+"/client")
	require.Contains(t, deps, module+"/client")
	if bad := clientDepProblems(deps); len(bad) > 0 {
		t.Errorf("a program importing the client links %s: the client must stay importable without the servers (go list -deps ./client)", strings.Join(bad, ", "))
	}
	require.NotEmpty(t, clientDepProblems(goList(t, "-deps", module+"/routing")), "the check finds a server's dependencies")
}
