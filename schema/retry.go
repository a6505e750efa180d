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
// Without a pause, the victim of a deadlock ran again at once against the
// same transactions it had lost to, and could lose five times running
// within a millisecond (a serve did, in triage-steady, and its Dequeue
// failed); the random part keeps two victims from meeting again in step.
const (
	retryAttempts = 5
	retryPause    = time.Millisecond
)

// Retry runs fn up to five times while it fails with a retryable error,
// pausing a little before each rerun, and stops early when ctx ends.
func Retry(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 0; attempt < retryAttempts; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(rand.N(retryPause << (attempt - 1)))
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
		if err = fn(); !IsRetryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}
