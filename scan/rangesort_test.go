package scan

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A range repartition and a partial sort as one job (in memory, and split
// through intermediate files when over RangeSortMemoryBytes) write the
// files the two stages write, with the same rows in the same order: keys
// with repeats (ties keep input order) and NULLs, several input files of
// several row groups, an empty partition; a rerun skips every task.
func TestRangeSortOneJob(t *testing.T) {
	db := openDuck(t)
	dir := t.TempDir()
	var ins []string
	for f := 0; f < 3; f++ {
		in := filepath.Join(dir, fmt.Sprintf("in-%d.parquet", f))
		mustExec(t, db, `COPY (SELECT i AS id,
			CASE WHEN i %% 71 = 0 THEN NULL ELSE unhex(left(md5((i %% 900)::VARCHAR), 20)) END AS k,
			md5(i::VARCHAR) AS s FROM range(%d, %d) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1500)`, f*4000, f*4000+4000, in)
		ins = append(ins, in)
	}
	bounds := [][]byte{{0x40}, {0x80}, {0x80}, {0xc0}}
	base := Job{Inputs: ins, Partitions: 5, Bounds: bounds, Workers: 3, RowGroupRows: 2500, ZstdLevel: 1}

	// the two stages, as the Ray executor runs them
	rep := base
	rep.PartitionBy, rep.Output, rep.Compression = "range:k", filepath.Join(dir, "rep"), "none"
	if _, err := Run(bg, rep); err != nil {
		t.Fatal(err)
	}
	two := base
	two.Inputs, two.Bounds, two.PartitionBy, two.SortBy, two.Output = []string{rep.Output}, nil, "parts", []string{"k"}, filepath.Join(dir, "two")
	if _, err := Run(bg, two); err != nil {
		t.Fatal(err)
	}
	want := partRows(t, two.Output)
	if len(want) != 5 {
		t.Fatalf("two stages wrote %d files", len(want))
	}

	for _, memory := range []int64{RangeSortMemoryBytes, 0} {
		one := base
		one.PartitionBy, one.SortBy, one.Output = "range:k", []string{"k"}, filepath.Join(dir, fmt.Sprintf("one-%d", memory))
		old := RangeSortMemoryBytes
		RangeSortMemoryBytes = memory
		sum, err := Run(bg, one)
		if err == nil {
			sum, err = Run(bg, one)
		}
		RangeSortMemoryBytes = old
		if err != nil {
			t.Fatal(err)
		}
		if sum.TasksSkipped != sum.Tasks || sum.Tasks == 0 {
			t.Fatalf("memory %d: rerun ran %d of %d tasks", memory, sum.Tasks-sum.TasksSkipped, sum.Tasks)
		}
		got := partRows(t, one.Output)
		for _, name := range slices.Sorted(maps.Keys(want)) {
			if got[name] != want[name] {
				t.Fatalf("memory %d: %s differs from the two stages' (%d vs %d bytes of rows)", memory, name, len(got[name]), len(want[name]))
			}
		}
		if len(got) != len(want) {
			t.Fatalf("memory %d: %d files, want %d", memory, len(got), len(want))
		}
		if _, err := os.Stat(filepath.Join(one.Output, WorkDirName, "shuffle")); !os.IsNotExist(err) {
			t.Fatalf("memory %d: intermediate files left: %v", memory, err)
		}
	}
}

// partRows maps each part file of dir to its rows, in order, as text.
func partRows(t *testing.T, dir string) map[string]string {
	t.Helper()
	db := openDuck(t)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		rows, err := db.Query(fmt.Sprintf("SELECT coalesce(hex(k), 'null') || ':' || id || ':' || s FROM read_parquet(%s)", sqlString(filepath.Join(dir, e.Name()))))
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			b.WriteString(s + "\n")
		}
		rows.Close()
		out[e.Name()] = b.String()
	}
	return out
}
