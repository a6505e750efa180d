// Package testlog gives tests a slog.Logger that writes to t.Log, so the
// log lines of the servers a test starts are printed with that test, and
// only when it fails or runs with -v. Logs that went to io.Discard left a
// rare failure (a bed's enqueue that timed out once in a CI run) without
// its cause; logs that went to stderr flooded the package's output, where
// parallel tests' lines hid which test they belonged to.
package testlog
