package schema_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/schematest"
)

// TestCheckServerTakesTheTestServer: the MariaDB the tests run on (the
// version README's commands install) passes the check every shard meets.
func TestCheckServerTakesTheTestServer(t *testing.T) {
	db := schematest.DB(t, nil)
	require.NoError(t, schema.CheckServer(t.Context(), db.DB))
}
