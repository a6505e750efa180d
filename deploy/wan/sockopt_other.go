//go:build !linux

package wan

import "time"

// setUserTimeoutFD does nothing where TCP_USER_TIMEOUT is missing: the
// keepalives alone close a dead connection.
func setUserTimeoutFD(uintptr, time.Duration) error { return nil }
