package scan

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

func TestFilterProjectMatchesDuckDB(t *testing.T) {
	db := openDuck(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "duck.parquet")
	genDuck(t, db, in, 30000, 4000)
	cases := []struct{ where, columns, duckCols string }{
		{"", "", "*"},
		{"k < 10", "id, k, x, name", "id, k, x, name"},
		{"x > 100 AND name IS NOT NULL", "", "*"},
		{"name LIKE 'str_1%' OR flag", "id, name, flag", "id, name, flag"},
		{"k IN (1, 2, 3, NULL) AND NOT s BETWEEN 3 AND 9", "id, s, k", "id, s, k"},
		{"k NOT IN (1, 2, 3)", "id", "id"},
		{"x IS NULL", "id, x, d, ts", "id, x, d, ts"},
		{"d >= DATE '2022-01-01' AND ts < '2021-01-01 02:00:00'", "id, d, ts, dec", "id, d, ts, dec"},
		{"dec > 50.5 AND f32 < 20000", "id, dec, f32, t8, nothing", "id, dec, f32, t8, nothing"},
		{"(x * 2 - k) / 3 > 10 OR t8 % 7 = 3", "id, uniq", "id, uniq"},
		{"name || '!' = 'str_7!'", "id, name", "id, name"},
		{"k = 5", "*, k * 2 + 1 AS k2", "*, k * 2 + 1 AS k2"},
		{"ilike_dummy IS NULL", "", ""}, // unknown column: error
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.parquet")
			_, err := Run(bg, Job{Inputs: []string{in}, Where: c.where, Columns: c.columns, Output: out})
			if c.duckCols == "" {
				if err == nil {
					t.Fatal("unknown column accepted")
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			q := fmt.Sprintf("SELECT %s FROM read_parquet(%s)", c.duckCols, sqlString(in))
			if c.where != "" {
				q += " WHERE " + c.where
			}
			sameAsDuck(t, db, out, q)
			if !strings.Contains(c.columns, " AS ") { // computed integers are BIGINT here
				sameTypes(t, db, out, q)
			}
		})
	}
}

// Nested, unsigned and time-zone columns pass through filters untouched.
func TestOtherTypesPassThrough(t *testing.T) {
	db := openDuck(t)
	in := tmpPath(t, "nested.parquet")
	mustExec(t, db, `COPY (SELECT i AS id, [i, i + 1] AS l, {'a': i, 'b': 'x' || i::VARCHAR} AS st,
		(i * 3)::UINTEGER AS u32, (i * 5)::UBIGINT AS u64, (i %% 200)::UTINYINT AS u8,
		TIMESTAMPTZ '2024-01-01 00:00:00+00' + to_seconds(i) AS tz, make_timestamp(i * 1000000)::TIMESTAMP_MS AS tsms,
		'\xAA\xBB'::BLOB AS bin
		FROM range(5000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1000)`, in)
	for _, where := range []string{"id % 7 = 3", "u32 > 9000 AND u8 < 100", "tz >= TIMESTAMP '2024-01-01 01:00:00'", "u64 BETWEEN 100 AND 20000"} {
		out := tmpPath(t, "o.parquet")
		if _, err := Run(bg, Job{Inputs: []string{in}, Where: where, Output: out}); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		q := fmt.Sprintf("SELECT * FROM read_parquet(%s) WHERE %s", sqlString(in), where)
		sameAsDuck(t, db, out, q)
		sameTypes(t, db, out, q)
	}
}

// Scan hands filtered, projected batches over in input order.
func TestScanAPIBatchesInOrder(t *testing.T) {
	db := openDuck(t)
	in := tmpPath(t, "in.parquet")
	genDuck(t, db, in, 40000, 3000)
	var last int64 = -1
	var rows int64
	st, err := Scan(bg, []string{in}, ScanOptions{Columns: "id, x * 2 AS x2", Where: "name LIKE 'str_2%' AND x IS NOT NULL", Workers: 3},
		func(rec arrow.RecordBatch) error {
			if rec.Schema().Field(1).Name != "x2" {
				t.Fatalf("schema %s", rec.Schema())
			}
			for _, id := range rec.Column(0).(*array.Int64).Int64Values() {
				if id <= last {
					t.Fatalf("id %d after %d: batches out of order", id, last)
				}
				last = id
			}
			rows += rec.NumRows()
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	want := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM read_parquet(%s) WHERE name LIKE 'str_2%%' AND x IS NOT NULL", sqlString(in)))
	if rows != want || st.RowsOut != want || st.RowsIn != 40000 || st.BytesRead == 0 {
		t.Fatalf("rows %d, stats %+v, want %d", rows, st, want)
	}
	// an error from the callback stops the scan and comes back
	stop := fmt.Errorf("enough")
	if _, err := Scan(bg, []string{in}, ScanOptions{}, func(arrow.RecordBatch) error { return stop }); err != stop {
		t.Fatalf("callback error: %v", err)
	}
}
