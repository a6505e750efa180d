// Package authtest makes what tests of authentication need: a throwaway
// certificate authority issuing server and client certificates (made with
// crypto/x509 in the test, never read from outside), and keys files.
// Tests import it; no production code does.
package authtest
