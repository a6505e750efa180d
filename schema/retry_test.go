package schema

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

// TestRetryRerunsOnlyRetryableErrors: a deadlock or lock wait timeout is
// run again, up to five runs in all, with pauses that stay short; any
// other error, or an ended context, stops at once.
func TestRetryRerunsOnlyRetryableErrors(t *testing.T) {
	deadlock := &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}
	runs := 0
	start := time.Now()
	err := Retry(t.Context(), func() error { runs++; return deadlock })
	require.ErrorIs(t, err, deadlock)
	require.Equal(t, 5, runs)
	require.Less(t, time.Since(start), time.Second, "the pauses add up to at most 15 ms")

	runs = 0
	err = Retry(t.Context(), func() error {
		runs++
		if runs < 3 {
			return &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout"}
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, runs)

	other := errors.New("syntax")
	runs = 0
	require.ErrorIs(t, Retry(t.Context(), func() error { runs++; return other }), other)
	require.Equal(t, 1, runs)

	ctx, cancel := context.WithCancel(t.Context())
	runs = 0
	err = Retry(ctx, func() error { runs++; cancel(); return deadlock })
	require.ErrorIs(t, err, deadlock)
	require.Equal(t, 1, runs, "an ended context is not run again")
}
