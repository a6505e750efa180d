package store

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// FormatToken returns a lease token's external form, the receipt handle a
// consumer acks, nacks or extends with.
func FormatToken(t uint64) string { return fmt.Sprintf("%016x", t) }

// ParseToken reads a lease token's external form.
func ParseToken(s string) (uint64, error) {
	if len(s) != 16 {
		return 0, ErrBadToken
	}
	t, err := strconv.ParseUint(s, 16, 64)
	if err != nil || t == 0 {
		return 0, ErrBadToken
	}
	return t, nil
}

// Backoff is the default nack delay after attempts deliveries: 1s doubling
// per attempt up to 15 minutes, times a random factor in [0.5, 1) so
// items that failed together do not come back together.
func Backoff(attempts int) time.Duration {
	d := 15 * time.Minute
	if attempts >= 1 && attempts <= 10 {
		d = min(d, time.Second<<(attempts-1))
	} else if attempts < 1 {
		d = time.Second
	}
	return time.Duration(float64(d) * (0.5 + rand.Float64()/2))
}
