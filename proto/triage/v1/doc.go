// Package triagev1 holds the generated Go code of Triage's public API,
// triage.v1.Queue and triage.v1.Admin (proto/triage/v1/triage.proto):
// messages, gRPC stubs and the grpc-gateway JSON routes. Edit the .proto
// and run `make generate`; CI fails when the generated files are stale.
package triagev1
