package main

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/internal/testbin"
)

// Regression tests of issue 14: values that make no sense are usage errors
// (exit 2) naming the flag, malformed cluster URLs are usage errors in
// every command, and one spelling per idea across commands.

// runCLI runs the ffkit binary with args and extra environment.
func runCLI(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(testbin.Path(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// usageParquet writes a small Parquet file with columns id, k, s.
func usageParquet(t *testing.T) string {
	t.Helper()
	in := filepath.Join(t.TempDir(), "in.parquet")
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(fmt.Sprintf("COPY (SELECT i AS id, i %% 10 AS k, 'v' || i::VARCHAR AS s FROM range(1000) t(i)) TO '%s' (FORMAT parquet)", in)); err != nil {
		t.Fatal(err)
	}
	return in
}

func TestCLIRefusesSenselessValues(t *testing.T) {
	ds := loadTestDataset(t, 200, 50)
	pq := usageParquet(t)
	out := filepath.Join(t.TempDir(), "out")
	for _, c := range []struct {
		args []string
		want string // in the message: the flag
	}{
		{[]string{"load", ds, "--batch-size", "0"}, "--batch-size"},
		{[]string{"load", ds, "--workers", "0"}, "--workers"},
		{[]string{"load", ds, "--workers", "-1"}, "--workers"},
		{[]string{"load", ds, "--prefetch", "0"}, "--prefetch"},
		{[]string{"load", ds, "--world-size", "0"}, "--world-size"},
		{[]string{"load", ds, "--watchdog", "-1s"}, "--watchdog"},
		{[]string{"load", ds, "--memory-budget", "1"}, "--memory-budget"},
		{[]string{"load", ds, "--memory-budget", "64"}, "--memory-budget"},
		{[]string{"load", ds, "--memory-budget", "banana"}, "--memory-budget"},
		{[]string{"scan", pq, "-o", out, "--partitions", "0"}, "--partitions"},
		{[]string{"scan", pq, "-o", out, "--partitions", "-3", "--partition-by", "rows"}, "--partitions"},
		{[]string{"scan", pq, "-o", out, "--row-group-rows", "0"}, "--row-group-rows"},
		{[]string{"scan", pq, "-o", out, "--retries", "-5"}, "--retries"},
		{[]string{"scan", pq, "-o", out, "--format", "ffrecord", "--sample-column", "s", "--shard-size", "0"}, "--shard-size"},
		{[]string{"scan", pq, "-o", out, "--sql", "SELECT 1", "--memory-budget", "banana"}, "--memory-budget"},
		{[]string{"scan", pq, "-o", out, "--sql", "SELECT 1", "--memory-limit", "banana"}, "--memory-limit"},
	} {
		_, stderr, code := runCLI(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("ffkit %s: exit %d, want 2 with a message naming %s: %s", strings.Join(c.args, " "), code, c.want, stderr)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused scan wrote its output")
	}
	// The budget refusal says what one batch needs; that much is accepted.
	_, stderr, _ := runCLI(t, nil, "load", ds, "--batch-size", "10", "--memory-budget", "64")
	var need int64
	if i := strings.Index(stderr, "samples, "); i < 0 {
		t.Fatalf("no batch size in %q", stderr)
	} else if _, err := fmt.Sscanf(stderr[i+len("samples, "):], "%d bytes", &need); err != nil {
		t.Fatalf("%q: %v", stderr, err)
	}
	if _, stderr, code := runCLI(t, nil, "load", ds, "--batch-size", "10", "--memory-budget", fmt.Sprint(need)); code != 0 {
		t.Fatalf("--memory-budget %d (one batch): exit %d: %s", need, code, stderr)
	}
}

func TestCLIMalformedClusterURLs(t *testing.T) {
	// A token, so that no command stops at the missing token first.
	env := []string{"FFKIT_TOKEN=test"}
	mnt := t.TempDir()
	for _, u := range []string{"ffkit://127.0.0.1:99999/", "ffkit://127.0.0.1/", "ffkit://[::1/", "ffkit://:9000/"} {
		for _, args := range [][]string{
			{"inspect", u}, {"cat", u, "0"}, {"verify", u}, {"load", u}, {"bench", "read", u},
			{"scan", u, "-o", filepath.Join(t.TempDir(), "o.parquet")},
			{"fs", "ls", u}, {"fs", "df", u}, {"fs", "status", u}, {"fs", "put", "/etc/hostname", u},
			{"fs", "mount", u, mnt},
		} {
			_, stderr, code := runCLI(t, env, args...)
			if code != 2 || !strings.Contains(stderr, "HOST:PORT") {
				t.Errorf("ffkit %s: exit %d, want 2 naming HOST:PORT: %s", strings.Join(args, " "), code, stderr)
			}
		}
	}
}

func TestCLIOneSpellingPerIdea(t *testing.T) {
	pq := usageParquet(t)
	dir := t.TempDir()
	// scan --shard-size takes the size suffixes pack takes.
	if _, stderr, code := runCLI(t, nil, "scan", pq, "-o", filepath.Join(dir, "ffr"), "--format", "ffrecord", "--sample-column", "s", "--shard-size", "4K"); code != 0 {
		t.Fatalf("scan --shard-size 4K: exit %d: %s", code, stderr)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "ffr", "*.ffr"))
	if len(files) < 2 {
		t.Fatalf("scan --shard-size 4K of ~10 KiB wrote %d shard(s)", len(files))
	}
	// scan's memory bound is --memory-budget, as load's; the old name stays.
	for _, flag := range []string{"--memory-budget", "--memory-limit"} {
		out := filepath.Join(dir, "sql"+flag+".parquet")
		if _, stderr, code := runCLI(t, nil, "scan", pq, "-o", out, "--sql", "SELECT count(*) AS n FROM input", flag, "256MiB"); code != 0 {
			t.Fatalf("scan %s 256MiB: exit %d: %s", flag, code, stderr)
		}
	}
	help, _, _ := runCLI(t, nil, "scan", "--help")
	if !strings.Contains(help, "--memory-budget") || strings.Contains(help, "--memory-limit") {
		t.Fatalf("scan --help should show --memory-budget only:\n%s", help)
	}
	// fs status takes the cluster URL as its argument, like every fs command.
	help, _, _ = runCLI(t, nil, "fs", "status", "--help")
	if !strings.Contains(help, "status ffkit://HOST:PORT") || strings.Contains(help, "--cluster string") {
		t.Fatalf("fs status --help:\n%s", help)
	}
	// --workers says what it bounds.
	for _, cmd := range [][]string{{"load"}, {"scan"}, {"verify"}} {
		help, _, _ := runCLI(t, nil, append(cmd, "--help")...)
		for _, line := range strings.Split(help, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "--workers") && !strings.Contains(line, "bounds") {
				t.Errorf("%s --help: %q does not say what --workers bounds", cmd[0], line)
			}
		}
	}
}

func TestCLILoadShufflesByDefault(t *testing.T) {
	// ffkit.Loader (Python) shuffles by default; so does ffkit load.
	ds := loadTestDataset(t, 100, 100)
	def := runLoad(t, ds, "--batch-size", "100", "--print-indices")
	shuf := runLoad(t, ds, "--batch-size", "100", "--print-indices", "--shuffle")
	seq := runLoad(t, ds, "--batch-size", "100", "--print-indices", "--no-shuffle")
	for _, r := range []loadRun{def, shuf, seq} {
		if r.code != 0 {
			t.Fatal(r.stderr)
		}
	}
	if def.stdout != shuf.stdout {
		t.Fatal("the default order is not the --shuffle order")
	}
	var want []string
	for i := 0; i < 100; i++ {
		want = append(want, fmt.Sprint(i))
	}
	if strings.TrimSpace(seq.stdout) != strings.Join(want, " ") {
		t.Fatalf("--no-shuffle is not index order: %q", seq.stdout)
	}
	if def.stdout == seq.stdout {
		t.Fatal("the default order is index order")
	}
	if r := runLoad(t, ds, "--shuffle", "--no-shuffle"); r.code != 2 {
		t.Fatalf("--shuffle --no-shuffle: exit %d", r.code)
	}
}

func TestCLIScanSQLErrorShowsTheUsersQuery(t *testing.T) {
	pq := usageParquet(t)
	for _, c := range []struct{ query, line string }{
		{"SELEC 1", "LINE 1: SELEC 1"},
		{"SELECT nope FROM input", "LINE 1: SELECT nope FROM input"},
	} {
		_, stderr, code := runCLI(t, nil, "scan", pq, "-o", filepath.Join(t.TempDir(), "o"), "--sql", c.query)
		if code != 2 || !strings.Contains(stderr, c.line) || strings.Contains(stderr, "COPY") || strings.Contains(stderr, "result.parquet") {
			t.Fatalf("--sql %q: exit %d, want 2 quoting %q without ffkit's rewrite:\n%s", c.query, code, c.line, stderr)
		}
		// The caret points into the query as written.
		lines := strings.Split(stderr, "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, "LINE 1: ") && i+1 < len(lines) {
				caret := strings.Index(lines[i+1], "^") - len("LINE 1: ")
				if caret < 0 || caret >= len(c.query) {
					t.Fatalf("--sql %q: caret at %d:\n%s", c.query, caret, stderr)
				}
			}
		}
	}
}
