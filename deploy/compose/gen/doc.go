// Command gen writes the compose bed's docker-compose.yml,
// docker-compose.spare.yml and config/ from
// compose.DefaultTopology: `go generate ./deploy/compose` runs it in
// deploy/compose. The files are committed, and TestGeneratedFilesAreCurrent
// fails when they differ from what the generator writes.
package main
