// Package e2e drives the real triage binary from outside, as a user and an
// operator would: it builds cmd/triage and cmd/triage-bed once, starts `triage serve`
// processes with role configs against spawned mariadbd shards and an
// embedded NATS server, and kills processes with SIGKILL mid-flight to show
// that no acknowledged enqueue is lost.
//
// The drill tests start the three-region bed with `triage-bed up
// --multi-region` and run `triage-bed drill --json` against it, with clients on
// all three routers, and assert the report's figures one by one (lost,
// resurrected after ack, nacks undone, the isolated side's writes, RTO), so
// one run names every figure that is off. A failing drill test prints the
// drill's report and progress and the tail of the bed's log; the drill runs
// under a deadline inside the test's, so a hung drill is reported rather
// than ending the test binary with nothing printed. With go test
// -artifacts -outputdir DIR, the report (JSON and text), the progress and
// the bed's whole log are kept under DIR.
package e2e
