// Command beddir makes a compose bed directory (compose.WriteBedDir): the
// bed's API key and keys file, NATS passwords and NATS certificates, which
// docker-compose.yml mounts from TRIAGE_BED_DIR. up.sh runs it before it
// starts the bed; a directory that is complete already is left as it is,
// since the running bed's containers use it.
//
//	go run ./deploy/compose/beddir DIR
package main
