package main

import (
	"fmt"
	"os"

	"github.com/triage-queue/triage/deploy/compose"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "" || os.Args[1][0] == '-' {
		fmt.Fprintln(os.Stderr, "usage: beddir DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	wrote, err := compose.WriteBedDir(dir, compose.DefaultTopology())
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose beddir:", err)
		os.Exit(1)
	}
	if wrote {
		fmt.Printf("made the bed directory %s: a new API key, NATS passwords and certificates\n", dir)
	} else {
		fmt.Printf("the bed directory %s is complete: kept\n", dir)
	}
}
