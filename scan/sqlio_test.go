package scan

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSQLSummaryCountsWhatDuckDBRead: DuckDB reads a SQL job's Parquet
// files itself; the summary still reports the bytes and row groups it
// read. A filter on the sorted column lets DuckDB skip most row groups by
// their statistics; a full projection reads every row group.
func TestSQLSummaryCountsWhatDuckDBRead(t *testing.T) {
	db := openDuck(t)
	in := filepath.Join(t.TempDir(), "in.parquet")
	genDuck(t, db, in, 100000, 10000) // 10 row groups, id sorted
	st, err := os.Stat(in)
	if err != nil {
		t.Fatal(err)
	}

	sum, err := Run(bg, Job{Inputs: []string{in}, Output: filepath.Join(t.TempDir(), "all"),
		SQL: "SELECT * FROM input"})
	if err != nil {
		t.Fatal(err)
	}
	if sum.RowGroups != 10 || sum.RowGroupsSkipped != 0 {
		t.Fatalf("SELECT *: row groups %d, skipped %d; want 10, 0", sum.RowGroups, sum.RowGroupsSkipped)
	}
	if sum.BytesRead < st.Size()/2 || sum.BytesRead > 2*st.Size() {
		t.Fatalf("SELECT *: bytes read %d for a %d-byte file", sum.BytesRead, st.Size())
	}
	all := sum.BytesRead

	sum, err = Run(bg, Job{Inputs: []string{in}, Output: filepath.Join(t.TempDir(), "some"),
		SQL: "SELECT sum(f32) AS s FROM input WHERE id < 15000"})
	if err != nil {
		t.Fatal(err)
	}
	if sum.RowGroups != 10 || sum.RowGroupsSkipped < 7 || sum.RowGroupsSkipped > 8 {
		t.Fatalf("filtered: row groups %d, skipped %d; want 10, 8 (DuckDB prunes by statistics)", sum.RowGroups, sum.RowGroupsSkipped)
	}
	if sum.BytesRead <= 0 || sum.BytesRead >= all/2 {
		t.Fatalf("filtered: bytes read %d, want more than 0 and well under the full scan's %d", sum.BytesRead, all)
	}
}
