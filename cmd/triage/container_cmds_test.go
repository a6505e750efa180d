package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/natsserver"
	"github.com/triage-queue/triage/routing/auth/authtest"
)

// TestNATSAuthFlags: `triage nats` reads the logins' passwords from files
// (dropping the newline); a missing file is an error, not an open server.
func TestNATSAuthFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tri, cli := filepath.Join(dir, "triage"), filepath.Join(dir, "client")
	authtest.Write(t, tri, []byte("t-secret\n"))
	authtest.Write(t, cli, []byte("c-secret\n"))
	a, err := natsAuth("triage", tri, "client", cli)
	require.NoError(t, err)
	require.Equal(t, &natsserver.Auth{Triage: natsserver.Login{User: "triage", Password: "t-secret"},
		Clients: []natsserver.Login{{User: "client", Password: "c-secret"}}}, a)
	a, err = natsAuth("triage", tri, "client", "")
	require.NoError(t, err)
	require.Empty(t, a.Clients)
	_, err = natsAuth("triage", filepath.Join(dir, "missing"), "client", cli)
	require.Error(t, err)
	_, err = natsAuth("triage", tri, "client", filepath.Join(dir, "missing"))
	require.Error(t, err)
}
