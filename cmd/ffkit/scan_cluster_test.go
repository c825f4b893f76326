package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	_ "github.com/duckdb/duckdb-go/v2"
)

// scanSummary is the part of `scan --json` the cluster tests check.
type scanSummary struct {
	RowsOut      int64    `json:"rows_out"`
	Tasks        int      `json:"tasks"`
	TasksSkipped int      `json:"tasks_skipped"`
	UpToDate     bool     `json:"up_to_date"`
	OutputFiles  []string `json:"output_files"`
}

// scanOnCluster runs `ffkit --json scan ARGS` against the cluster.
func scanOnCluster(t *testing.T, u *upCluster, args ...string) scanSummary {
	t.Helper()
	out := u.must(t, append([]string{"--json", "scan"}, args...)...)
	var s scanSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("scan %v --json: %v: %q", args, err, out)
	}
	return s
}

// Scan jobs whose output is on a cluster (ffkit://): a single Parquet file,
// a directory of row partitions, a hash shuffle, a per-partition SQL query
// and FFRecord shards, each published, fetched back and compared with
// DuckDB's answer on the same input; reruns skip every task. The staging
// directories were once never made on the cluster, and every such job
// failed with "no such file or directory".
func TestScanOutputOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	u := startUp(t, t.TempDir())
	U := u.url
	dir := t.TempDir()
	in := filepath.Join(dir, "in.parquet")
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(fmt.Sprintf("COPY (SELECT i AS id, i %% 10 AS k, 'v' || i::VARCHAR AS s FROM range(20000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1000)", in)); err != nil {
		t.Fatal(err)
	}
	// the input on the cluster too: cluster to cluster
	u.must(t, "fs", "put", in, U+"/in.parquet")
	src := sqlQuote(in)
	if err := os.MkdirAll(filepath.Join(dir, "get"), 0o755); err != nil {
		t.Fatal(err)
	}

	// check fetches OUT from the cluster and compares it with want.
	check := func(out, got, want string) {
		t.Helper()
		local := filepath.Join(dir, "get", filepath.Base(out))
		u.must(t, "fs", "get", U+"/"+out, filepath.Join(dir, "get"))
		var diff int64
		q := fmt.Sprintf("SELECT count(*) FROM ((%[1]s EXCEPT ALL %[2]s) UNION ALL (%[2]s EXCEPT ALL %[1]s))",
			fmt.Sprintf(got, sqlQuote(local)), want)
		if err := db.QueryRow(q).Scan(&diff); err != nil || diff != 0 {
			t.Fatalf("%s: %d rows differ from DuckDB's answer (%v)", out, diff, err)
		}
	}

	jobs := []struct {
		args      []string
		out       string
		got, want string
	}{
		{[]string{U + "/in.parquet", "--where", "k < 3", "--columns", "id, s"}, "one.parquet",
			"SELECT * FROM read_parquet(%s)", "SELECT id, s FROM read_parquet(" + src + ") WHERE k < 3"},
		{[]string{in, "--where", "id % 7 = 1", "--partition-by", "rows", "--partitions", "3"}, "rows",
			"SELECT * FROM read_parquet(%s || '/*.parquet')", "SELECT * FROM read_parquet(" + src + ") WHERE id % 7 = 1"},
		{[]string{U + "/in.parquet", "--partition-by", "hash:k", "--partitions", "4"}, "hashed",
			"SELECT * FROM read_parquet(%s || '/*.parquet')", "SELECT * FROM read_parquet(" + src + ")"},
		{[]string{in, "--partition-by", "hash:k", "--partitions", "3", "--sql", "SELECT k, count(*) AS n, sum(id) AS t FROM input GROUP BY k"}, "sqlagg",
			"SELECT * FROM read_parquet(%s || '/*.parquet')", "SELECT k, count(*), sum(id) FROM read_parquet(" + src + ") GROUP BY k"},
		{[]string{in, "--group-by", "k", "--agg", "count(*), max(id)"}, "agg.parquet",
			"SELECT * FROM read_parquet(%s)", "SELECT k, count(*), max(id) FROM read_parquet(" + src + ") GROUP BY k"},
	}
	for _, j := range jobs {
		args := append(j.args, "-o", U+"/"+j.out)
		s := scanOnCluster(t, u, args...)
		if s.RowsOut == 0 || s.UpToDate {
			t.Fatalf("%v: %+v", args, s)
		}
		check(j.out, j.got, j.want)
		// a rerun publishes nothing again
		if r := scanOnCluster(t, u, args...); !r.UpToDate && r.TasksSkipped != r.Tasks {
			t.Fatalf("rerun of %v redid tasks: %+v", args, r)
		}
	}

	// FFRecord shards on the cluster, verified by the verify command
	s := scanOnCluster(t, u, in, "--format", "ffrecord", "--sample-column", "s", "--partition-by", "rows", "--partitions", "2", "-o", U+"/ffr")
	if s.RowsOut != 20000 || len(s.OutputFiles) < 2 {
		t.Fatalf("ffrecord: %+v", s)
	}
	u.must(t, "verify", U+"/ffr")

	// a three-stage plan whose stages all live on the cluster; a rerun
	// of the same plan runs nothing
	plan := writePlan(t, dir, U+"/in.parquet", U+"/plan", "count(*)")
	var ps planSummary
	if err := json.Unmarshal([]byte(u.must(t, "--json", "scan", "--plan", plan)), &ps); err != nil || ps.Ran != 3 {
		t.Fatalf("plan on the cluster: %+v %v", ps, err)
	}
	check("plan/agg", "SELECT * FROM read_parquet(%s || '/*.parquet')",
		"SELECT k, count(*) FROM read_parquet("+src+") WHERE id % 3 <> 0 GROUP BY k")
	if err := json.Unmarshal([]byte(u.must(t, "--json", "scan", "--plan", plan)), &ps); err != nil || ps.Ran != 0 || ps.Skipped != 3 {
		t.Fatalf("plan rerun on the cluster: %+v %v", ps, err)
	}

	// nothing is left in staging
	out := u.must(t, "--json", "fs", "ls", U+"/hashed/_ffkit")
	var rows []fileRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Name == "staging" || r.Name == "shuffle" {
			t.Fatalf("%s left in the work directory: %s", r.Name, out)
		}
	}
}

func sqlQuote(s string) string { return "'" + s + "'" }
