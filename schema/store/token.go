package store

import (
	"fmt"
	"strconv"
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
