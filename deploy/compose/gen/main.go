package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/triage-queue/triage/deploy/compose"
)

func main() {
	dir := flag.String("dir", ".", "the deploy/compose directory to write into")
	flag.Parse()
	files, err := compose.Generate(compose.DefaultTopology())
	if err == nil {
		err = compose.WriteFiles(*dir, files)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose gen:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %d files under %s\n", len(files), filepath.Clean(*dir))
}
