// Package natstest gives tests a real NATS server with JetStream (the
// embedded nats-server module), one per test, stopped when the test ends.
package natstest
