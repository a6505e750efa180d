// Package certs makes a test bed's throwaway certificate authority and
// the server certificates it signs, for the process bed (package bed) and
// the compose bed (package compose) alike, so that both beds serve NATS
// and MariaDB over TLS with certificates of one kind.
//
// A CA lives in memory only: a bed makes one while it is set up, issues
// its servers' certificates with it and drops it, so its private key is
// never written and nothing else is ever signed with it. Only its
// certificate (CA.PEM) is written, for the bed's clients to verify the
// servers with.
//
// Keys are ECDSA P-256. Certificates are valid for Lifetime, starting an
// hour back so that a clock a little behind the issuer's still accepts
// them, and every issued certificate is good for server and client
// authentication: a NATS route is a client of the peer it dials.
package certs
