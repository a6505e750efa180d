package schema

import (
	"context"
	"errors"

	"github.com/go-sql-driver/mysql"
)

// IsRetryable reports whether err is an InnoDB deadlock (1213) or lock wait
// timeout (1205). Both roll the whole transaction back, so running it again
// is safe; concurrent leasing and deleting on a queue table produces them.
func IsRetryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// Retry runs fn up to five times while it fails with a retryable error.
func Retry(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = fn(); !IsRetryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}
