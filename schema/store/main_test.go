package store

import (
	"os"
	"testing"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.MainCheckingLeaks(m)) }
