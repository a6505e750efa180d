package provision

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPollRetriesUntilSuccess(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	err := Poll(t.Context(), time.Millisecond, func(ctx context.Context) error {
		_, bounded := ctx.Deadline()
		require.True(t, bounded, "every attempt has a deadline")
		if calls.Add(1) < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 3, calls.Load())
}

func TestPollReportsTheLastFailure(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	errDown := errors.New("server down")
	err := Poll(ctx, 5*time.Millisecond, func(context.Context) error { return errDown })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, errDown)
}

func TestParallelJoinsEveryError(t *testing.T) {
	t.Parallel()
	errOdd := errors.New("odd")
	var ran atomic.Int32
	err := Parallel(5, func(i int) error {
		ran.Add(1)
		if i%2 == 1 {
			return errOdd
		}
		return nil
	})
	require.EqualValues(t, 5, ran.Load(), "a failure does not stop the others")
	require.ErrorIs(t, err, errOdd)
	require.Len(t, err.(interface{ Unwrap() []error }).Unwrap(), 2)
	require.NoError(t, Parallel(0, func(int) error { return errOdd }))
}
