package scan

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// runByTasks runs a job phase by phase as a distributed executor does:
// PendingTasks lists a phase, each task runs through RunTask (here in
// goroutines, each a separate run of the job), until nothing is left.
func runByTasks(t *testing.T, job Job) (*Summary, int) {
	t.Helper()
	phases := 0
	for {
		tasks, sum, err := PendingTasks(bg, job)
		if err != nil {
			t.Fatalf("pending: %v", err)
		}
		if len(tasks) == 0 {
			if sum == nil {
				t.Fatal("no tasks and no summary")
			}
			return sum, phases
		}
		phases++
		var wg sync.WaitGroup
		errs := make([]error, len(tasks))
		for i, name := range tasks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = RunTask(bg, job, name)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("tasks %v: %v", tasks, err)
		}
		if phases > 5 {
			t.Fatalf("more than 5 phases (last %v)", tasks)
		}
	}
}

func TestTasksOneByOneMatchDuckDB(t *testing.T) {
	db := openDuck(t)
	in := tmpPath(t, "in.parquet")
	genDuck(t, db, in, 5000, 700)
	in2 := tmpPath(t, "small.parquet")
	mustExec(t, db, "COPY (SELECT i AS k, 'k' || i AS label FROM range(0, 30) t(i)) TO '%s' (FORMAT parquet)", in2)
	src := fmt.Sprintf("read_parquet(%s)", sqlString(in))
	dir := t.TempDir()
	cases := []struct {
		name, want string
		job        Job
		phases     int
	}{
		{"native", "SELECT id, k FROM " + src + " WHERE x IS NOT NULL",
			Job{Columns: "id, k", Where: "x IS NOT NULL", PartitionBy: "rows", Partitions: 3}, 1},
		// 13 keys into 64 partitions: some get no rows, a second phase writes them
		{"hash", "SELECT id, s FROM " + src,
			Job{Columns: "id, s", PartitionBy: "hash:s", Partitions: 64}, 2},
		{"agg", "SELECT k, count(*) AS \"count(*)\" FROM " + src + " GROUP BY k",
			Job{GroupBy: []string{"k"}, Aggs: "count(*)"}, 1},
		{"count", "SELECT count(*) AS \"count(*)\" FROM " + src,
			Job{Aggs: "count(*)"}, 1},
		{"sql_join", "SELECT a.id, b.label FROM " + src + " a JOIN read_parquet(" + sqlString(in2) + ") b USING (k)",
			Job{JoinInputs: []string{in2}, PartitionBy: "hash:k", Partitions: 3, SQL: "SELECT a.id, b.label FROM input a JOIN input2 b USING (k)"}, 2},
		{"broadcast", "SELECT a.id, b.label FROM " + src + " a JOIN read_parquet(" + sqlString(in2) + ") b USING (k)",
			Job{JoinInputs: []string{in2}, Broadcast: true, PartitionBy: "rows", Partitions: 3, SQL: "SELECT a.id, b.label FROM input a JOIN input2 b USING (k)"}, 1},
		{"single", "SELECT id FROM " + src + " WHERE id % 7 = 0",
			Job{Columns: "id", Where: "id % 7 = 0", Output: filepath.Join(dir, "single.parquet")}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := c.job
			j.Inputs, j.Workers = []string{in}, 2
			if j.Output == "" {
				j.Output = filepath.Join(dir, c.name)
			}
			sum, phases := runByTasks(t, j)
			if phases != c.phases {
				t.Errorf("%d phases, want %d", phases, c.phases)
			}
			ours := j.Output
			if filepath.Ext(ours) == "" {
				ours = filepath.Join(ours, "*.parquet")
			}
			sameAsDuck(t, db, ours, c.want)
			if sum.RowsOut != queryInt(t, db, "SELECT count(*) FROM ("+c.want+")") {
				t.Errorf("summary rows out %d", sum.RowsOut)
			}
			// finished: nothing pending, a task rerun is a no-op, Run skips all
			if tasks, _, err := PendingTasks(bg, j); err != nil || len(tasks) != 0 {
				t.Fatalf("after the job: pending %v, %v", tasks, err)
			}
			again, err := Run(bg, j)
			if err != nil || (!again.UpToDate && again.TasksSkipped != again.Tasks) {
				t.Fatalf("rerun: %+v %v", again, err)
			}
			if err := RunTask(bg, j, "no-such-task"); !errors.Is(err, ErrTaskNotReady) {
				t.Fatalf("unknown task: %v", err)
			}
		})
	}
}

// A stage's partitioned output read with PartitionBy "parts" keeps its
// partitions: a co-partitioned join needs no second shuffle.
func TestPartsPartitioningJoinsCoPartitioned(t *testing.T) {
	db := openDuck(t)
	in := tmpPath(t, "in.parquet")
	genDuck(t, db, in, 4000, 500)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, out := range []string{a, b} {
		if _, err := Run(bg, Job{Inputs: []string{in}, Columns: "id, k", PartitionBy: "hash:k", Partitions: 4, Workers: 2, Output: out}); err != nil {
			t.Fatal(err)
		}
	}
	j := Job{Inputs: []string{a}, JoinInputs: []string{b}, PartitionBy: "parts", Partitions: 4, Workers: 2,
		SQL: "SELECT input.k, count(*) AS n FROM input JOIN input2 USING (k) GROUP BY input.k", Output: filepath.Join(dir, "j")}
	sum, phases := runByTasks(t, j)
	if phases != 1 || sum.Partitions != 4 {
		t.Fatalf("%d phases, %d partitions", phases, sum.Partitions)
	}
	src := fmt.Sprintf("read_parquet(%s)", sqlString(in))
	sameAsDuck(t, db, filepath.Join(dir, "j", "*.parquet"),
		"SELECT x.k, count(*) AS n FROM "+src+" x JOIN "+src+" y USING (k) GROUP BY x.k")
	// a one-partition side broadcast to each partition
	small := filepath.Join(dir, "small")
	if _, err := Run(bg, Job{Inputs: []string{in}, Columns: "k", Where: "k < 5", PartitionBy: "files", Workers: 2, Output: small}); err != nil {
		t.Fatal(err)
	}
	bj := Job{Inputs: []string{a}, JoinInputs: []string{small}, Broadcast: true, PartitionBy: "parts", Partitions: 4, Workers: 2,
		SQL: "SELECT input.id FROM input JOIN (SELECT DISTINCT k FROM input2) s USING (k)", Output: filepath.Join(dir, "bj")}
	runByTasks(t, bj)
	sameAsDuck(t, db, filepath.Join(dir, "bj", "*.parquet"), "SELECT id FROM "+src+" WHERE k < 5")
	// a file not named by its partition is refused
	j.Inputs, j.Output = []string{in}, filepath.Join(dir, "bad")
	if _, err := Run(bg, j); !errors.Is(err, ErrUsage) {
		t.Fatalf("parts over a plain file: %v", err)
	}
}
