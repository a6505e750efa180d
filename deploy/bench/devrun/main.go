// Command devrun runs the benchmark during development (temporary).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/triage-queue/triage/deploy/bench"
)

func main() {
	quick := flag.Bool("quick", false, "quick")
	dir := flag.String("dir", "/tmp/benchout", "dir")
	prof := flag.String("prof", "", "profile dir")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_, err := bench.Run(ctx, bench.Config{Quick: *quick, Dir: *dir, ProfileDir: *prof}, os.Stdout)
	if err != nil {
		fmt.Println("ERROR:", err)
		os.Exit(1)
	}
}
