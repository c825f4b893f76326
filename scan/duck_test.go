package scan

import (
	"context"
	"database/sql"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/duckdb/duckdb-go/v2"

	_ "github.com/ffkit/ffkit/fs/localfs"
)

func openDuck(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t testing.TB, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(fmt.Sprintf(q, args...)); err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(q, args...), err)
	}
}

func queryInt(t testing.TB, db *sql.DB, q string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// genTableSQL is a table of many types with nulls: integers of several
// widths, doubles, floats, strings (low cardinality: dictionary-encoded by
// the writers), booleans, dates, timestamps, decimals and an all-NULL column.
const genTableSQL = `SELECT
  i::BIGINT AS id,
  (i %% 100)::INTEGER AS k,
  CASE WHEN i %% 7 = 0 THEN NULL ELSE round(i * 0.37, 2)::DOUBLE END AS x,
  (i %% 13)::SMALLINT AS s,
  CASE WHEN i %% 11 = 0 THEN NULL ELSE 'str_' || (i %% 50)::VARCHAR END AS name,
  md5(i::VARCHAR) AS uniq,
  (i %% 3 = 0) AS flag,
  DATE '2020-01-01' + (i %% 1000)::INTEGER AS d,
  TIMESTAMP '2021-01-01 00:00:00' + to_seconds(i) AS ts,
  ((i %% 10000) / 100.0)::DECIMAL(10,2) AS dec,
  (i * 1.5)::FLOAT AS f32,
  CASE WHEN i %% 5 = 0 THEN NULL ELSE (i %% 200 - 100)::TINYINT END AS t8,
  NULL::INTEGER AS nothing
FROM range(0, %d) t(i)`

// genDuck writes rows of genTableSQL with DuckDB into path.
func genDuck(t testing.TB, db *sql.DB, path string, rows, rowGroup int) {
	t.Helper()
	mustExec(t, db, "COPY ("+genTableSQL+") TO '%s' (FORMAT parquet, ROW_GROUP_SIZE %d)", rows, path, rowGroup)
}

// sameAsDuck checks that the Parquet file(s) ours hold exactly the rows of
// the DuckDB query want (as multisets, NULLs equal), comparing typed values
// inside DuckDB.
func sameAsDuck(t testing.TB, db *sql.DB, ours, want string) {
	t.Helper()
	o := fmt.Sprintf("SELECT * FROM read_parquet(%s)", sqlString(ours))
	missing := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM ((%s) EXCEPT ALL (%s))", want, o))
	extra := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM ((%s) EXCEPT ALL (%s))", o, want))
	nw := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM (%s)", want))
	no := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM (%s)", o))
	if missing != 0 || extra != 0 || nw != no {
		t.Fatalf("ours (%s) != DuckDB (%s): %d rows vs %d, %d missing, %d extra", ours, want, no, nw, missing, extra)
	}
}

// sameTypes checks the column names and types DuckDB sees in both.
func sameTypes(t testing.TB, db *sql.DB, ours, want string) {
	t.Helper()
	desc := func(q string) string {
		rows, err := db.Query("DESCRIBE " + q)
		if err != nil {
			t.Fatalf("describe %s: %v", q, err)
		}
		defer rows.Close()
		var out []string
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%v %v", vals[0], vals[1]))
		}
		return strings.Join(out, ", ")
	}
	a := desc(fmt.Sprintf("SELECT * FROM read_parquet(%s)", sqlString(ours)))
	b := desc(want)
	if a != b {
		t.Fatalf("types differ:\nours:   %s\nDuckDB: %s", a, b)
	}
}

func tmpPath(t testing.TB, name string) string { return filepath.Join(t.TempDir(), name) }

var bg = context.Background()

func runPython(code string) error {
	cmd := exec.Command("python3", "-c", code)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}
