package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestGoModTidy fails when go.mod or go.sum do not match the imports of
// every package under every build tag (go mod tidy would change them).
func TestGoModTidy(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: go mod tidy -diff is checked by the plain suite")
	}
	cmd := exec.Command("go", "mod", "tidy", "-diff")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go mod tidy -diff: %v (run `go mod tidy`):\n%s", err, out)
	}
}

// TestFDBBackendLinked checks that `go build -tags fdb ./cmd/ffkit` links
// the FoundationDB backend (its cgo part needs libfdb_c, which this
// machine cannot install, so the check is on the package graph).
func TestFDBBackendLinked(t *testing.T) {
	const pkg = "github.com/ffkit/ffkit/fs/kv/fdbkv"
	deps := func(tags ...string) string {
		args := append([]string{"list"}, tags...)
		args = append(args, "-deps", "-f", "{{.ImportPath}} {{len .GoFiles}} {{len .CgoFiles}}", ".")
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	withTag := deps("-tags", "fdb")
	var line string
	for _, l := range strings.Split(withTag, "\n") {
		if strings.HasPrefix(l, pkg+" ") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("-tags fdb: %s is not linked into ffkit", pkg)
	}
	if line == pkg+" 0 0" {
		t.Fatalf("-tags fdb: %s is linked but has no Go files under the tag", pkg)
	}
	if !strings.Contains(withTag, "github.com/apple/foundationdb/bindings/go/src/fdb ") {
		t.Fatalf("-tags fdb: the FoundationDB bindings are not in the build")
	}
	if strings.Contains(deps(), pkg+" ") {
		t.Fatalf("without -tags fdb, %s should not be linked", pkg)
	}
}
