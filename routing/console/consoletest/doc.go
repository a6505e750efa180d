// Package consoletest drives the web console (routing/console) in headless
// Chromium through chromedp, for tests: it starts the browser, types the
// API key into the console's form as an operator would, waits for DOM
// conditions (never for a fixed time), reads what the page shows and saves
// screenshots.
//
// # Chromium
//
// The browser is Debian's chromium (make deps installs it with
// .ci/ensure-chromium), or the binary TRIAGE_CHROMIUM names. A test that
// needs it and does not find it fails with that advice: it never skips. As
// root (CI's containers) Chromium runs with --no-sandbox, which it needs
// there; as another user it keeps its sandbox.
//
// Each browser gets its own profile directory. When the test ends the
// browser is closed, and every process that still runs with that profile
// is an error of the test (and is killed, by PID), so no test leaves a
// Chromium behind.
//
// # Artifacts
//
// Screenshots go to $TRIAGE_ARTIFACTS/<test name>/ when that is set (CI
// keeps the directory), else to the test's artifact directory (kept by go
// test -artifacts -outputdir DIR, removed otherwise); the directory is
// logged.
package consoletest
