package scan

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/internal/errkind"
)

// --partition-by column:COL puts each row in the partition its column
// holds (SmallPond's repartition(n, by=COL)), for a plain shuffle and for
// per-partition SQL with a co-partitioned join.
func TestPartitionByColumnValue(t *testing.T) {
	db := openDuck(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.parquet")
	mustExec(t, db, "COPY (SELECT i AS id, (i * 7 %% 4)::INTEGER AS p, 'n' || (i %% 9)::VARCHAR AS name FROM range(12000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1000)", in)
	side := filepath.Join(dir, "side.parquet")
	mustExec(t, db, "COPY (SELECT i AS p, i * 100 AS w FROM range(4) t(i)) TO '%s' (FORMAT parquet)", side)
	src := fmt.Sprintf("read_parquet(%s)", sqlString(in))

	out := filepath.Join(dir, "by_p")
	if _, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: "column:p", Partitions: 4, Output: out}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, filepath.Join(out, "*.parquet"), "SELECT * FROM "+src)
	// every file of partition P holds only rows with p = P
	bad := queryInt(t, db, fmt.Sprintf(`SELECT count(*) FROM read_parquet(%s, filename = true)
		WHERE p <> regexp_extract(filename, 'part-(\d{5})', 1)::INTEGER`, sqlString(filepath.Join(out, "*.parquet"))))
	if bad != 0 {
		t.Fatalf("%d rows in another partition than their column says", bad)
	}

	// per-partition SQL over a co-partitioned join
	joined := filepath.Join(dir, "joined")
	if _, err := Run(bg, Job{Inputs: []string{in}, JoinInputs: []string{side}, PartitionBy: "column:p", Partitions: 4, Output: joined,
		SQL: "SELECT p, count(*) AS n, max(w) AS w FROM input JOIN input2 USING (p) GROUP BY p"}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, filepath.Join(joined, "*.parquet"), fmt.Sprintf(
		"SELECT p, count(*) AS n, max(w) AS w FROM %s a JOIN read_parquet(%s) b USING (p) GROUP BY p", src, sqlString(side)))

	// a value outside [0, partitions) is a data error naming the column and the value
	_, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: "column:p", Partitions: 3, Output: filepath.Join(dir, "x")})
	if !errors.Is(err, ErrPartitionValue) || errkind.Of(err) != errkind.Data || !strings.Contains(err.Error(), "column p holds 3, want [0, 3)") {
		t.Fatalf("out-of-range value: %v", err)
	}
	// not an integer, or more than one column: usage errors
	for _, by := range []string{"column:name", "column:p,id", "column:"} {
		_, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: by, Partitions: 4, Output: filepath.Join(dir, "y")})
		if !errors.Is(err, ErrUsage) {
			t.Fatalf("%s: %v, want a usage error", by, err)
		}
	}
}

// --partition-by range:COL with bounds puts each row in the partition
// between the bounds its key falls in (GraySort's range partitioning), for
// a plain shuffle and for per-partition SQL (a sort within each partition).
func TestPartitionByRange(t *testing.T) {
	db := openDuck(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.parquet")
	mustExec(t, db, "COPY (SELECT i AS id, CASE WHEN i %% 97 = 0 THEN NULL ELSE md5(i::VARCHAR) END AS k FROM range(12000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1000)", in)
	src := fmt.Sprintf("read_parquet(%s)", sqlString(in))
	bounds := [][]byte{[]byte("4"), []byte("8"), []byte("8"), []byte("c")}
	// the partition of key k by SQL: the bounds <= k
	want := "(CASE WHEN k IS NULL THEN 0 ELSE (k >= '4')::INT + (k >= '8')::INT * 2 + (k >= 'c')::INT END)"

	out := filepath.Join(dir, "by_range")
	if _, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: "range:k", Partitions: 5, Bounds: bounds, Output: out}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, filepath.Join(out, "*.parquet"), "SELECT * FROM "+src)
	bad := queryInt(t, db, fmt.Sprintf(`SELECT count(*) FROM read_parquet(%s, filename = true)
		WHERE %s <> regexp_extract(filename, 'part-(\d{5})', 1)::INTEGER`, sqlString(filepath.Join(out, "*.parquet")), want))
	if bad != 0 {
		t.Fatalf("%d rows in another partition than their range", bad)
	}

	sorted := filepath.Join(dir, "sorted")
	if _, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: "range:k", Partitions: 5, Bounds: bounds, Output: sorted,
		SQL: "SELECT * FROM input ORDER BY k NULLS FIRST, id"}); err != nil {
		t.Fatal(err)
	}
	// the partitions in order, each sorted, are the whole input sorted
	var got []string
	for p := 0; p < 5; p++ {
		rows, err := db.Query(fmt.Sprintf("SELECT coalesce(k, '') || ':' || id FROM read_parquet(%s)", sqlString(filepath.Join(sorted, fmt.Sprintf("part-%05d*.parquet", p)))))
		if err != nil {
			if p == 2 {
				continue // [8, 8) is empty
			}
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			rows.Scan(&s)
			got = append(got, s)
		}
		rows.Close()
	}
	var all []string
	rows, err := db.Query(fmt.Sprintf("SELECT coalesce(k, '') || ':' || id FROM %s ORDER BY k NULLS FIRST, id", src))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		rows.Scan(&s)
		all = append(all, s)
	}
	rows.Close()
	if strings.Join(got, "\n") != strings.Join(all, "\n") {
		t.Fatalf("range-partitioned sort: %d rows, want %d in DuckDB's order", len(got), len(all))
	}

	for _, j := range []Job{
		{PartitionBy: "range:id", Partitions: 2, Bounds: [][]byte{[]byte("5")}},             // not a string
		{PartitionBy: "range:k", Partitions: 3, Bounds: [][]byte{[]byte("5")}},              // too few bounds
		{PartitionBy: "range:k", Partitions: 3, Bounds: [][]byte{[]byte("5"), []byte("1")}}, // descending
		{PartitionBy: "hash:k", Partitions: 2, Bounds: [][]byte{[]byte("5")}},               // bounds without range
	} {
		j.Inputs, j.Output = []string{in}, filepath.Join(dir, "y")
		if _, err := Run(bg, j); !errors.Is(err, ErrUsage) {
			t.Fatalf("%s %q: %v, want a usage error", j.PartitionBy, j.Bounds, err)
		}
	}
}
