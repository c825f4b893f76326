package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/duckdb/duckdb-go/v2"
)

// planSummary is the part of `scan --plan --json` the tests check.
type planSummary struct {
	Ran     int `json:"ran"`
	Skipped int `json:"skipped"`
	Stages  []struct {
		Name    string `json:"name"`
		RowsOut int64  `json:"rows_out"`
		Output  string `json:"output"`
	} `json:"stages"`
}

// writePlan writes a three-stage plan into dir/plan.json: filter ->
// hash repartition by k -> per-partition SQL aggregate, outputs under out.
func writePlan(t *testing.T, dir, in, out, agg string) string {
	t.Helper()
	plan := map[string]any{"dir": out, "workers": 2, "stages": []map[string]any{
		{"name": "filtered", "inputs": []string{in}, "where": "id % 3 <> 0", "partition_by": "rows", "partitions": 2},
		{"name": "by_k", "inputs": []string{"@filtered"}, "partition_by": "hash:k", "partitions": 3},
		{"name": "agg", "inputs": []string{"@by_k"}, "partition_by": "hash:k", "partitions": 3,
			"sql": "SELECT k, " + agg + " AS v FROM input GROUP BY k"},
	}}
	b, _ := json.Marshal(plan)
	p := filepath.Join(dir, "plan.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestScanPlanCLI(t *testing.T) {
	buildScanBin(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.parquet")
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(fmt.Sprintf("COPY (SELECT i AS id, i %% 10 AS k FROM range(10000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1000)", in)); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	run := func(agg string) planSummary {
		t.Helper()
		stdout, stderr, code := scanCLI(t, "--json", "scan", "--plan", writePlan(t, dir, in, out, agg))
		if code != 0 {
			t.Fatalf("scan --plan: exit %d: %s", code, stderr)
		}
		var s planSummary
		if err := json.Unmarshal([]byte(stdout), &s); err != nil {
			t.Fatalf("--json: %v: %q", err, stdout)
		}
		return s
	}
	want := func(agg string) {
		t.Helper()
		var diff int64
		q := fmt.Sprintf(`SELECT count(*) FROM (
			(SELECT * FROM read_parquet('%[1]s/agg/*.parquet') EXCEPT ALL SELECT k, %[2]s FROM read_parquet('%[3]s') WHERE id %% 3 <> 0 GROUP BY k)
			UNION ALL
			(SELECT k, %[2]s FROM read_parquet('%[3]s') WHERE id %% 3 <> 0 GROUP BY k EXCEPT ALL SELECT * FROM read_parquet('%[1]s/agg/*.parquet')))`, out, agg, in)
		if err := db.QueryRow(q).Scan(&diff); err != nil || diff != 0 {
			t.Fatalf("agg differs from DuckDB in %d rows (%v)", diff, err)
		}
	}
	if s := run("count(*)"); s.Ran != 3 || len(s.Stages) != 3 || s.Stages[2].Name != "agg" || s.Stages[2].RowsOut != 10 {
		t.Fatalf("first run: %+v", s)
	}
	want("count(*)")
	if s := run("count(*)"); s.Ran != 0 || s.Skipped != 3 {
		t.Fatalf("rerun: %+v", s)
	}
	if s := run("max(id)"); s.Ran != 1 || s.Skipped != 2 {
		t.Fatalf("changed agg: %+v", s)
	}
	want("max(id)")
	// the human summary names each stage
	stdout, _, code := scanCLI(t, "scan", "--plan", filepath.Join(dir, "plan.json"))
	if code != 0 || !strings.Contains(stdout, "stage agg:") || !strings.Contains(stdout, "0 stages run, 3 up to date") {
		t.Fatalf("human summary: exit %d: %s", code, stdout)
	}

	// usage errors exit 2 and say what is wrong
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"dir": "x", "stages": [{"name": "a", "inputs": ["@b"]}]}`), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"scan", "--plan", bad}, `"@b" names no stage`},
		{[]string{"scan", "--plan", filepath.Join(dir, "missing.json")}, "missing.json"},
		{[]string{"scan", "--plan", filepath.Join(dir, "plan.json"), in}, "no SRC"},
		{[]string{"scan", "--plan", filepath.Join(dir, "plan.json"), "--where", "k > 1"}, "--where"},
	} {
		if _, stderr, code := scanCLI(t, c.args...); code != 2 || !strings.Contains(stderr, c.want) {
			t.Fatalf("%v: exit %d, want 2 and %q: %s", c.args, code, c.want, stderr)
		}
	}
}
