package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/internal/testbin"

	_ "github.com/duckdb/duckdb-go/v2"
)

// CLI tests of ffkit scan: the built binary, as a user runs it.

// scanBin is the binary TestScanCLI built (in its temporary directory).
var scanBin string

func buildScanBin(t *testing.T) {
	t.Helper()
	scanBin = testbin.Path(t)
}

func scanCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(scanBin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestScanCLI(t *testing.T) {
	buildScanBin(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.parquet")
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(fmt.Sprintf("COPY (SELECT i AS id, i %% 10 AS k, 'v' || i::VARCHAR AS s FROM range(10000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1000)", in)); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.parquet")
	stdout, stderr, code := scanCLI(t, "scan", in, "--where", "k < 3 AND id >= 5000", "--columns", "id, k * 2 AS k2", "-o", out, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var sum struct {
		RowsIn           int64 `json:"rows_in"`
		RowsOut          int64 `json:"rows_out"`
		RowGroupsSkipped int   `json:"row_groups_skipped"`
		UpToDate         bool  `json:"up_to_date"`
	}
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatalf("--json: %v: %q", err, stdout)
	}
	if sum.RowsIn != 10000 || sum.RowsOut != 1500 || sum.RowGroupsSkipped == 0 {
		t.Fatalf("summary: %+v", sum)
	}
	var n, k2 int64
	if err := db.QueryRow(fmt.Sprintf("SELECT count(*), max(k2) FROM read_parquet('%s')", out)).Scan(&n, &k2); err != nil || n != 1500 || k2 != 4 {
		t.Fatalf("output: %d rows, max(k2) %d, %v", n, k2, err)
	}
	stdout, _, _ = scanCLI(t, "scan", in, "--where", "k < 3 AND id >= 5000", "--columns", "id, k * 2 AS k2", "-o", out, "--json")
	if json.Unmarshal([]byte(stdout), &sum); !sum.UpToDate {
		t.Fatalf("rerun not up to date: %s", stdout)
	}
	// human summary
	stdout, _, code = scanCLI(t, "scan", in, "--group-by", "k", "--agg", "count(*), sum(id)", "-o", filepath.Join(dir, "agg"))
	if code != 0 || !strings.Contains(stdout, "10 rows out") {
		t.Fatalf("group-by: exit %d: %s", code, stdout)
	}
	// usage errors exit 2, bad data exits 1 naming the file
	for _, args := range [][]string{
		{"scan", in, "--where", "k <", "-o", filepath.Join(dir, "x")},
		{"scan", in, "--where", "nope = 1", "-o", filepath.Join(dir, "x")},
		{"scan", in, "--format", "ffrecord", "-o", filepath.Join(dir, "x")},
		{"scan", in},
	} {
		if _, stderr, code := scanCLI(t, args...); code != 2 {
			t.Fatalf("%v: exit %d, want 2: %s", args, code, stderr)
		}
	}
	bad := filepath.Join(dir, "bad.parquet")
	data, _ := os.ReadFile(in)
	os.WriteFile(bad, data[:len(data)-100], 0o644)
	if _, stderr, code := scanCLI(t, "scan", bad, "-o", filepath.Join(dir, "y")); code != 1 || !strings.Contains(stderr, bad) {
		t.Fatalf("corrupt input: exit %d: %s", code, stderr)
	}
}
