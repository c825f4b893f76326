package scan

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
)

// A hash repartition into Parquet passes string dictionaries through
// (sinkdict.go): the files hold the same rows, the same per-row-group
// statistics and the same Arrow types as the decoded write, whether the
// input's row groups share their dictionary values (in another order),
// bring new ones, hold NULLs, or never repeat a value.
func TestDictionaryPassThroughSameFiles(t *testing.T) {
	db := openDuck(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.parquet")
	// row groups of 2048 rows (DuckDB's unit); s: 13 values, the set
	// shifting by 5 every 4000 rows; u: distinct per row (dictionaries
	// never overlap)
	mustExec(t, db, `COPY (SELECT i AS id,
		CASE WHEN i %% 97 = 0 THEN NULL ELSE 'c' || ((i * 7 %% 13) + (i // 4000) * 5)::VARCHAR END AS s,
		md5(i::VARCHAR) AS u, (i %% 5)::INTEGER AS k
		FROM range(20000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 2048)`, in)
	src := fmt.Sprintf("SELECT * FROM read_parquet(%s)", sqlString(in))

	run := func(pass bool, name string, j Job) string {
		t.Helper()
		old := PassDictionaries
		PassDictionaries = pass
		defer func() { PassDictionaries = old }()
		j.Inputs, j.Output = []string{in}, filepath.Join(dir, name)
		if _, err := Run(bg, j); err != nil {
			t.Fatal(err)
		}
		return j.Output
	}
	// row groups of 1500 rows: the sink cuts several per file
	hash := Job{PartitionBy: "hash:id", Partitions: 3, RowGroupRows: 1500}
	on, off := run(true, "on", hash), run(false, "off", hash)
	sameAsDuck(t, db, filepath.Join(on, "*.parquet"), src)
	sameAsDuck(t, db, filepath.Join(off, "*.parquet"), src)
	stats := func(d string) string {
		t.Helper()
		rows, err := db.Query(fmt.Sprintf(`SELECT parse_filename(file_name), row_group_id, row_group_num_rows, path_in_schema,
			stats_min_value, stats_max_value, stats_null_count, encodings
			FROM parquet_metadata(%s) ORDER BY ALL`, sqlString(filepath.Join(d, "*.parquet"))))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var f, col, enc string
			var rg, n int64
			var lo, hi sql.NullString
			var nulls sql.NullInt64
			if err := rows.Scan(&f, &rg, &n, &col, &lo, &hi, &nulls, &enc); err != nil {
				t.Fatal(err)
			}
			if col == "s" && !strings.Contains(enc, "DICTIONARY") {
				t.Errorf("%s row group %d: column s encodings %s, want a dictionary", f, rg, enc)
			}
			out = append(out, fmt.Sprintf("%s rg%d %d %s [%s, %s] nulls %d", f, rg, n, col, lo.String, hi.String, nulls.Int64))
		}
		return strings.Join(out, "\n")
	}
	if a, b := stats(on), stats(off); a != b {
		t.Fatalf("row groups and statistics differ:\npass-through:\n%s\ndecoded:\n%s", a, b)
	}
	// the Arrow schema stored in the files is the plain one
	files, _ := filepath.Glob(filepath.Join(on, "*.parquet"))
	for _, f := range files {
		pf, err := OpenFile(bg, f, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"s", "u"} {
			if ty := pf.Schema.Field(pf.Schema.FieldIndices(name)[0]).Type; ty.ID() != arrow.STRING {
				t.Errorf("%s: column %s read back as %s, want string", f, name, ty)
			}
		}
		pf.Close()
	}

	// per-partition SQL over a shuffle keyed on the string column
	agg := Job{PartitionBy: "hash:s", Partitions: 4, SQL: "SELECT s, count(*) AS n, max(u) AS m FROM input GROUP BY s"}
	sameAsDuck(t, db, filepath.Join(run(true, "sql", agg), "*.parquet"),
		fmt.Sprintf("SELECT s, count(*) AS n, max(u) AS m FROM (%s) GROUP BY s", src))
}
