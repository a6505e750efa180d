package schema

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"
)

// IsRetryable reports whether err is an InnoDB deadlock (1213) or lock wait
// timeout (1205). Both roll the whole transaction back, so running it again
// is safe; concurrent leasing and deleting on a queue table produces them.
func IsRetryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// retryAttempts and retryPause bound Retry: five runs, with a random
// pause of up to retryPause << attempt before each rerun (1, 2, 4, 8 ms).
// Without a pause, the victim of a deadlock would run again at once
// against the same transactions it lost to, and could lose five times
// running within a millisecond; the random part keeps two victims from
// meeting again in step.
const (
	retryAttempts = 5
	retryPause    = time.Millisecond
)

// Retry runs fn up to five times while it fails with a retryable error,
// pausing a little before each rerun, and stops early when ctx ends.
func Retry(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 0; attempt < retryAttempts; attempt++ {
		if attempt > 0 && !Sleep(ctx, rand.N(retryPause<<(attempt-1))) {
			return err
		}
		if err = fn(); !IsRetryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// Sleep waits d, or until ctx ends, and reports whether d passed (false:
// ctx ended first): the pause between retries, polls and backoffs.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
