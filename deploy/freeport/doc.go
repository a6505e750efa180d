// Package freeport picks loopback ports for servers that must be given
// their port before they start: a NATS route port that the other members
// dial, a mariadbd --port, a `triage serve` address a test hands to peers.
//
// The usual way, listening on port 0 and closing the listener, returns a
// port from the kernel's ephemeral range, and closing it hands it back to
// that range: until the server binds it, any other process that listens
// on port 0 or dials out may take it, and the server then fails to bind.
// Under a loaded CI run (dozens of test binaries opening listeners and
// connections at once) that happened (a NATS route listener that never
// came up). So Pick chooses below the ephemeral range, where the kernel
// hands out nothing on its own: only another caller choosing ports
// explicitly can collide, and Pick never returns a port twice within a
// process. Across processes it chooses at random among thousands of
// ports and checks that the one it returns is free.
package freeport
