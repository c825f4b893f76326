package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestScanJobTasksCLI runs a shuffled SQL job task by task through
// `scan --job F --pending` and `--task NAME`, as the Python Ray executor
// does, and checks the result against DuckDB.
func TestScanJobTasksCLI(t *testing.T) {
	buildScanBin(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.parquet")
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(fmt.Sprintf("COPY (SELECT i AS id, i %% 10 AS k FROM range(5000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1000)", in)); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	job, _ := json.Marshal(map[string]any{"inputs": []string{in}, "output": out, "workers": 2, "salt": "up=1",
		"partition_by": "hash:k", "partitions": 3, "sql": "SELECT k, count(*) AS n FROM input GROUP BY k"})
	jobFile := filepath.Join(dir, "job.json")
	os.WriteFile(jobFile, job, 0o644)
	var reply jobTaskReply
	for phase := 0; ; phase++ {
		stdout, stderr, code := scanCLI(t, "scan", "--job", jobFile, "--pending")
		if code != 0 {
			t.Fatalf("--pending: exit %d: %s", code, stderr)
		}
		if err := json.Unmarshal([]byte(stdout), &reply); err != nil {
			t.Fatalf("--pending: %v: %q", err, stdout)
		}
		if len(reply.Tasks) == 0 {
			break
		}
		if phase > 2 {
			t.Fatalf("phase %d: still %v", phase, reply.Tasks)
		}
		for _, task := range reply.Tasks {
			if _, stderr, code := scanCLI(t, "scan", "--job", jobFile, "--task", task); code != 0 {
				t.Fatalf("--task %s: exit %d: %s", task, code, stderr)
			}
		}
	}
	if reply.Summary == nil || reply.Summary.RowsOut != 10 {
		t.Fatalf("final summary %+v", reply.Summary)
	}
	var diff int
	q := fmt.Sprintf(`SELECT count(*) FROM (SELECT * FROM read_parquet('%s/*.parquet') EXCEPT ALL SELECT k, count(*) FROM read_parquet('%s') GROUP BY k)`, out, in)
	if err := db.QueryRow(q).Scan(&diff); err != nil || diff != 0 {
		t.Fatalf("differs from DuckDB in %d rows (%v)", diff, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"scan", "--job", jobFile, "--task", "part-00099"}, "not runnable"},
		{[]string{"scan", "--pending"}, "go with --job"},
		{[]string{"scan", "--job", jobFile, in}, "no SRC"},
	} {
		if _, stderr, code := scanCLI(t, c.args...); code != 2 || !strings.Contains(stderr, c.want) {
			t.Fatalf("%v: exit %d, want 2 and %q: %s", c.args, code, c.want, stderr)
		}
	}
}
