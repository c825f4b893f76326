package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const cliDocsFix = "go run ./cmd/ffkit gen-docs docs/cli"

// generateCLIDocs runs `ffkit gen-docs DIR` in process, as a user would run it.
func generateCLIDocs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := newRoot()
	root.SetArgs([]string{"gen-docs", dir})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("ffkit gen-docs %s: %v\n%s", dir, err, out.String())
	}
	return dir
}

// readPages returns the Markdown pages of dir by name.
func readPages(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string][]byte{}
	for _, p := range names {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		pages[filepath.Base(p)] = b
	}
	return pages
}

// diffPages lists how got (the pages in dir) differs from want, one line per page.
func diffPages(want, got map[string][]byte, dir string) []string {
	var diffs []string
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			diffs = append(diffs, name+": missing from "+dir)
		case !bytes.Equal(w, g):
			diffs = append(diffs, name+": differs at "+firstDiff(w, g))
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, name+": in "+dir+" but no longer generated (stale)")
		}
	}
	sort.Strings(diffs)
	return diffs
}

// firstDiff names the first line where a and b differ, with both versions.
func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y || i >= len(al) || i >= len(bl) {
			return fmt.Sprintf("line %d: generated %q, checked in %q", i+1, clip(x), clip(y))
		}
	}
	return "?"
}

// clip shortens a line for a failure message.
func clip(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// TestCLIDocsUpToDate regenerates the CLI reference and fails when
// docs/cli differs from it, so flags and their documentation never drift.
func TestCLIDocsUpToDate(t *testing.T) {
	fresh := readPages(t, generateCLIDocs(t))
	if len(fresh) == 0 {
		t.Fatal("gen-docs wrote no pages")
	}
	if _, ok := fresh["ffkit.md"]; !ok {
		t.Fatal("gen-docs wrote no ffkit.md (the root page)")
	}
	// Generation must be deterministic, or the check below would flap.
	if again := readPages(t, generateCLIDocs(t)); len(diffPages(fresh, again, "the second run")) > 0 {
		t.Fatalf("two runs of gen-docs differ:\n%s", strings.Join(diffPages(fresh, again, "the second run"), "\n"))
	}
	checked := readPages(t, filepath.Join("..", "..", cliDocsDir))
	if diffs := diffPages(fresh, checked, cliDocsDir); len(diffs) > 0 {
		t.Fatalf("%s is out of date with the commands (%d pages):\n  %s\nregenerate it from the repository root with:\n  %s",
			cliDocsDir, len(diffs), strings.Join(diffs, "\n  "), cliDocsFix)
	}
}

// TestGenDocsRemovesStalePages checks that a page of a command that no
// longer exists does not survive regeneration, and other files do.
func TestGenDocsRemovesStalePages(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "ffkit_gone.md")
	keep := filepath.Join(dir, "README.txt")
	for _, p := range []string{stale, keep} {
		if err := os.WriteFile(p, []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := genCLIDocs(newRoot(), dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale page %s survived gen-docs (stat: %v)", stale, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("gen-docs removed a file it did not write: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "ffkit_pack.md"))
	if err != nil {
		t.Fatalf("no page for ffkit pack: %v", err)
	}
	if !bytes.Contains(b, []byte("--shard-size")) {
		t.Errorf("ffkit_pack.md does not document --shard-size:\n%s", b)
	}
	if bytes.Contains(b, []byte("Auto generated")) {
		t.Errorf("ffkit_pack.md carries a dated auto-gen tag:\n%s", b)
	}
}
