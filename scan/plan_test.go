package scan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testPlan is a five-stage plan over in: filter -> hash repartition ->
// per-partition SQL aggregate -> a co-partitioned join of the aggregate
// with the filtered rows, and a single-file filter of the aggregate.
// Stages are listed out of order on purpose.
func testPlan(in, dir, aggSQL string) Plan {
	return Plan{Dir: dir, Workers: 2, Stages: []Stage{
		{Name: "joined", Job: Job{Inputs: []string{"@agg"}, JoinInputs: []string{"@filtered"}, PartitionBy: "hash:k", Partitions: 2,
			SQL: "SELECT f.id, f.k, a.n FROM input2 f JOIN input a USING (k)"}},
		{Name: "filtered", Job: Job{Inputs: []string{in}, Where: "x IS NOT NULL", Columns: "id, k, name, x", PartitionBy: "rows", Partitions: 3}},
		{Name: "by_k", Job: Job{Inputs: []string{"@filtered"}, PartitionBy: "hash:k", Partitions: 4}},
		{Name: "agg", Job: Job{Inputs: []string{"@by_k"}, PartitionBy: "hash:k", Partitions: 4, SQL: aggSQL}},
		{Name: "top", Job: Job{Inputs: []string{"@agg"}, Where: "n > 150", Output: filepath.Join(dir, "top.parquet")}},
	}}
}

func TestPlanStagesMatchDuckDBAndRerunOnlyChangedStages(t *testing.T) {
	db := openDuck(t)
	in := tmpPath(t, "in.parquet")
	genDuck(t, db, in, 20000, 1000)
	dir := t.TempDir()
	src := fmt.Sprintf("read_parquet(%s)", sqlString(in))
	filtered := "SELECT id, k, name, x FROM " + src + " WHERE x IS NOT NULL"
	check := func(aggCols string) {
		t.Helper()
		agg := "SELECT k, count(*) AS n, " + aggCols + " FROM (" + filtered + ") GROUP BY k"
		sameAsDuck(t, db, filepath.Join(dir, "filtered", "*.parquet"), filtered)
		sameAsDuck(t, db, filepath.Join(dir, "by_k", "*.parquet"), filtered)
		sameAsDuck(t, db, filepath.Join(dir, "agg", "*.parquet"), agg)
		sameAsDuck(t, db, filepath.Join(dir, "joined", "*.parquet"),
			"SELECT f.id, f.k, a.n FROM ("+filtered+") f JOIN ("+agg+") a USING (k)")
		sameAsDuck(t, db, filepath.Join(dir, "top.parquet"), "SELECT * FROM ("+agg+") WHERE n > 150")
	}

	sum, err := RunPlan(bg, testPlan(in, dir, "SELECT k, count(*) AS n, min(x) AS mx FROM input GROUP BY k"))
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	for _, s := range sum.Stages {
		ran = append(ran, s.Name)
	}
	// dependency order: filtered before by_k before agg before joined/top
	if !validOrder(ran) {
		t.Fatalf("stages ran in order %s", strings.Join(ran, " "))
	}
	if sum.Ran != 5 || sum.Skipped != 0 {
		t.Fatalf("first run: %+v", sum)
	}
	check("min(x) AS mx")

	// a rerun of the same plan does nothing
	again, err := RunPlan(bg, testPlan(in, dir, "SELECT k, count(*) AS n, min(x) AS mx FROM input GROUP BY k"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Ran != 0 || again.Skipped != 5 {
		t.Fatalf("rerun redid stages: %+v", again)
	}
	for i, s := range again.Stages {
		if !s.UpToDate && s.TasksSkipped != s.Tasks {
			t.Fatalf("rerun: stage %s redid tasks: %+v", s.Name, s.Summary)
		}
		if s.Fingerprint != sum.Stages[i].Fingerprint {
			t.Fatalf("rerun: stage %s has a new fingerprint", s.Name)
		}
	}

	// change the aggregate's query: agg and the stages that read it (joined,
	// top) run again, filtered and by_k keep their published files
	mtimes := func(stage string) map[string]time.Time {
		out := map[string]time.Time{}
		ents, _ := os.ReadDir(filepath.Join(dir, stage))
		for _, e := range ents {
			if info, err := e.Info(); err == nil && !e.IsDir() {
				out[e.Name()] = info.ModTime()
			}
		}
		return out
	}
	before := map[string]map[string]time.Time{"filtered": mtimes("filtered"), "by_k": mtimes("by_k")}
	changed, err := RunPlan(bg, testPlan(in, dir, "SELECT k, count(*) AS n, max(id) AS top_id FROM input GROUP BY k"))
	if err != nil {
		t.Fatal(err)
	}
	redone := map[string]bool{}
	for _, s := range changed.Stages {
		redone[s.Name] = !s.UpToDate && s.TasksSkipped != s.Tasks
	}
	want := map[string]bool{"filtered": false, "by_k": false, "agg": true, "joined": true, "top": true}
	for name, w := range want {
		if redone[name] != w {
			t.Fatalf("after changing agg's query: stage %s redone=%v, want %v (%+v)", name, redone[name], w, changed.Stages)
		}
	}
	if changed.Ran != 3 || changed.Skipped != 2 {
		t.Fatalf("changed run: %+v", changed)
	}
	for stage, m := range before {
		after := mtimes(stage)
		if len(after) != len(m) {
			t.Fatalf("%s: files changed: %v -> %v", stage, m, after)
		}
		for f, tm := range m {
			if !after[f].Equal(tm) {
				t.Fatalf("%s/%s was rewritten", stage, f)
			}
		}
	}
	check("max(id) AS top_id")
}

// validOrder reports whether every stage of testPlan ran after the stages
// it reads.
func validOrder(ran []string) bool {
	pos := map[string]int{}
	for i, n := range ran {
		pos[n] = i
	}
	return pos["filtered"] < pos["by_k"] && pos["by_k"] < pos["agg"] && pos["agg"] < pos["joined"] &&
		pos["filtered"] < pos["joined"] && pos["agg"] < pos["top"]
}

func TestPlanFileAndErrors(t *testing.T) {
	dir := t.TempDir()
	good := `{"dir": "` + dir + `", "workers": 3, "stages": [
	  {"name": "a", "inputs": ["x.parquet"], "where": "k < 3", "partition_by": "rows", "partitions": 2},
	  {"name": "b", "inputs": ["@a"], "group_by": ["k"], "aggs": "count(*)", "output": "` + dir + `/b.parquet"}]}`
	p, err := ParsePlan("good.json", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if j := p.job(p.Stages[1]); j.Inputs[0] != filepath.Join(dir, "a") || j.Workers != 3 || j.GroupBy[0] != "k" {
		t.Fatalf("stage b as a job: %+v", j)
	}

	for _, c := range []struct{ plan, want string }{
		{`{"stages": [{"name": "a", "inputs": ["x"], "wher": "k"}]}`, `unknown field "wher"`},
		{`{"dir": "d", "stages": []}`, "no stages"},
		{`{"dir": "d", "stages": [{"name": "a", "inputs": ["@b"]}]}`, `input "@b" names no stage`},
		{`{"dir": "d", "stages": [{"name": "a", "inputs": ["x"]}, {"name": "a", "inputs": ["y"]}]}`, `two stages named "a"`},
		{`{"stages": [{"name": "a", "inputs": ["x"]}]}`, "no output"},
		{`{"dir": "d", "stages": [{"name": "../a", "inputs": ["x"]}]}`, "name"},
		{`{"dir": "d", "stages": [{"name": "a", "inputs": []}]}`, `stage "a": no inputs`},
		{`{"dir": "d", "stages": [{"name": "a", "inputs": ["@c"]}, {"name": "b", "inputs": ["@a"]}, {"name": "c", "inputs": ["@b"]}]}`, "cycle: a -> c -> b -> a"},
		{`{"dir": "d", "stages": [{"name": "a", "inputs": ["x"], "partition_by": "bogus"}]}`, `plan stage "a": `},
		{`{"dir": "d", "stages": [{"name": "a", "inputs": ["x"], "output": "o"}, {"name": "b", "inputs": ["x"], "output": "o"}]}`, "both write o"},
	} {
		p, err := ParsePlan("bad.json", []byte(c.plan))
		if err == nil {
			err = p.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrUsage) {
			t.Errorf("%s: error %v, want one containing %q (a usage error)", c.plan, err, c.want)
		}
	}

	// a stage that fails names itself and what failed
	_, err = RunPlan(bg, Plan{Dir: dir, Stages: []Stage{{Name: "s", Job: Job{Inputs: []string{filepath.Join(dir, "missing.parquet")}}}}})
	if err == nil || !strings.Contains(err.Error(), `plan stage "s"`) || !strings.Contains(err.Error(), "missing.parquet") {
		t.Fatalf("missing input: %v", err)
	}
}
