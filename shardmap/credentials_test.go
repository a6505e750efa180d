package shardmap_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/shardmap"
)

// TestNATSTLSRefusesIncompleteSettings: a nats_tls that cannot verify the
// servers fails at start, with the field to fix, rather than at every
// reconnect; no nats_tls is plain TCP.
func TestNATSTLSRefusesIncompleteSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	for _, tc := range []struct {
		name string
		tls  shardmap.NATSTLS
		want string
	}{
		{"no ca", shardmap.NATSTLS{}, "ca_file is required"},
		{"missing ca", shardmap.NATSTLS{CAFile: filepath.Join(dir, "gone.crt")}, "ca_file"},
		{"not pem", shardmap.NATSTLS{CAFile: notPEM}, "no PEM certificate"},
	} {
		_, err := tc.tls.Option()
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	var none *shardmap.NATSTLS
	_, err := none.Option()
	require.NoError(t, err)
	_, err = shardmap.NATSOptions(nil, &shardmap.NATSTLS{})
	require.ErrorContains(t, err, "nats_tls: ")
}
