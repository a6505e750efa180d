package store

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// queueSQL matches a statement on a queue table as code spells one. The
// keywords are upper case, as every statement in the repository writes
// them, so prose ("gone from items") does not match.
var queueSQL = regexp.MustCompile(`\b(FROM|UPDATE|INTO|JOIN)\s+(items|dead_letters|dedup_tombstones)\b`)

// ownerRules are what only this package may do outside tests, besides
// spelling statements on the queue tables.
var ownerRules = map[string]*regexp.Regexp{
	"statement on a queue table":              queueSQL,
	"schema.Keys (a by-id statement)":         regexp.MustCompile(`\bschema\.Keys\(`),
	"transaction (BeginTxx; use the store's)": regexp.MustCompile(`\.BeginTxx?\(`),
	"schema.Retry (the store's inTx retries)": regexp.MustCompile(`\bschema\.Retry\(`),
}

// ownerExempt are directories outside schema/ allowed to break the rules,
// and why.
var ownerExempt = map[string]string{
	// The benchmark's baselines measure what MariaDB does with plain SQL on
	// a copy of the schema (their own databases), as the ceiling Triage is
	// compared with; they are not a path of the service.
	"deploy/bench": "raw-SQL baselines of the benchmark",
}

// TestStoreOwnsQueueTables: every statement on items, dead_letters and
// dedup_tombstones is in this package (issue 10). A statement written
// elsewhere would miss the rules kept here (by-id statements through
// schema.Keys, FORCE INDEX hints, one transaction helper with the deadlock
// retry) and the tests that hold the store to them.
func TestStoreOwnsQueueTables(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from the package directory: %v", err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "schema" || ownerExempt[rel] != "" || (rel != "." && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for i, line := range strings.Split(string(data), "\n") {
			for what, re := range ownerRules {
				if re.MatchString(line) {
					t.Errorf("%s:%d: %s outside schema/store: %s", rel, i+1, what, strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Fatalf("checked only %d files: the walk missed the repository", checked)
	}
}
