// Package cuttest loses a MariaDB answer on purpose, for tests of writes
// whose outcome is unknown: a TCP proxy in front of a server that, when
// armed, cuts the connection sending a matching query, either after the
// server answered it (the write took effect and its answer is lost) or
// before the query reaches the server (the server rolls the open
// transaction back). It reads the client's packets (MySQL protocol
// framing) to find the query, so it needs plaintext connections with
// interpolated parameters (COM_QUERY), as the test servers' DSNs give.
// It fakes nothing but the lost connection: the statements run on a real
// server.
package cuttest
