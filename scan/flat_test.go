package scan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// The flat decoder gives the same values and nulls as arrow-go's reader on
// files written by pyarrow (every codec it handles, data pages v1 and v2,
// dictionary and plain, several pages per chunk, nulls) and by DuckDB, and
// declines codecs it does not handle.
func TestFlatDecoderMatchesArrow(t *testing.T) {
	dir := t.TempDir()
	var files, lz4 []string
	if err := runPython("import pyarrow"); err != nil {
		t.Logf("pyarrow missing, DuckDB files only: %v", err)
	} else {
		code := fmt.Sprintf(`
import pyarrow as pa, pyarrow.parquet as pq, datetime
n = 20000
def col(f, nulls):
    return [None if nulls and i %% 9 == 4 else f(i) for i in range(n)]
t = pa.table({
  "i64": pa.array(col(lambda i: i * 7 - 5000, False), pa.int64()),
  "i32": pa.array(col(lambda i: (i %% 300) - 150, True), pa.int32()),
  "f64": pa.array(col(lambda i: i / 3.0, True), pa.float64()),
  "f32": pa.array(col(lambda i: float(i %% 50) / 4, False), pa.float32()),
  "d": pa.array(col(lambda i: datetime.date(2020, 1, 1) + datetime.timedelta(days=i %% 400), True), pa.date32()),
})
req = pa.schema([f.with_nullable(False) if f.name in ("i64", "f32") else f for f in t.schema])
t = t.cast(req)
for codec in ["NONE", "SNAPPY", "GZIP", "ZSTD", "LZ4"]:
    for v in ["1.0", "2.0"]:
        for d in [True, False]:
            pq.write_table(t, "%s/pa-%%s-v%%s-%%s.parquet" %% (codec, v, d), compression=codec, data_page_version=v,
                use_dictionary=d, data_page_size=16 << 10, row_group_size=7000)
`, dir)
		if err := runPython(code); err != nil {
			t.Fatal(err)
		}
		m, _ := filepath.Glob(filepath.Join(dir, "pa-*.parquet"))
		for _, f := range m {
			if strings.Contains(f, "LZ4") {
				lz4 = append(lz4, f) // Hadoop LZ4: neither arrow-go nor this decoder reads it
			} else {
				files = append(files, f)
			}
		}
	}
	db := openDuck(t)
	duck := filepath.Join(dir, "duck.parquet")
	mustExec(t, db, `COPY (SELECT i::BIGINT AS i64, CASE WHEN i %% 5 = 0 THEN NULL ELSE (i %% 77)::INTEGER END AS i32,
		CASE WHEN i %% 3 = 0 THEN NULL ELSE i * 0.5 END::DOUBLE AS f64, (i %% 9)::FLOAT AS f32, DATE '2021-03-01' + (i %% 30)::INTEGER AS d
		FROM range(30000) t(i)) TO '%s' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 12000)`, duck)
	files = append(files, duck)
	forEachChunk(t, "column", append(files, lz4...), func(path string, pf *File, rg, c int) bool {
		s := getScratch()
		vals, valid, nulls, err := pf.decodeFlat(rg, c, s)
		if err == errDecline {
			putScratch(s)
			if !strings.Contains(path, "LZ4") {
				t.Errorf("%s rg %d col %s: declined", path, rg, pf.Schema.Field(c).Name)
			}
			return false
		}
		if err != nil {
			t.Fatalf("%s rg %d col %d: %v", path, rg, c, err)
		}
		rec := generalColumn(t, pf, rg, c)
		want := rec.Column(0)
		got := viewArray(pf.Schema.Field(c).Type, want.Len(), vals, valid, nulls)
		if !array.Equal(got, want) {
			t.Fatalf("%s rg %d col %s: flat decoder differs from arrow-go\n got %v\nwant %v", path, rg, pf.Schema.Field(c).Name, got, want)
		}
		if want.NullN() != nulls {
			t.Fatalf("%s rg %d col %s: %d nulls, want %d", path, rg, pf.Schema.Field(c).Name, nulls, want.NullN())
		}
		got.Release()
		putScratch(s)
		// the array-owning form ReadRowGroup uses
		owned, err := pf.flatArray(rg, c)
		if err != nil {
			t.Fatal(err)
		}
		if !array.Equal(owned, want) {
			t.Fatalf("%s rg %d col %s: flatArray differs from arrow-go", path, rg, pf.Schema.Field(c).Name)
		}
		owned.Release()
		rec.Release()
		return true
	})
	// a filter+projection through the flat path equals the general path
	// (i64 has no nulls: its comparisons with a constant take selectFlat)
	wheres := []string{"i32 > 20 OR f64 IS NULL", "i64 < 9000", "30000 >= i64", "i64 != 700", "f64 > 1000.5", "d = DATE '2020-01-07'", "i32 <= -3"}
	for k, path := range files {
		where := wheres[k%len(wheres)]
		if path == duck {
			where = "i64 >= 12345"
		}
		run := func() []arrow.RecordBatch {
			var out []arrow.RecordBatch
			_, err := Scan(bg, []string{path}, ScanOptions{Columns: "i64, f64, d, i32 + 1 AS j", Where: where, Workers: 2},
				func(r arrow.RecordBatch) error { r.Retain(); out = append(out, r); return nil })
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
		got := run()
		FastPath = false
		want := run()
		FastPath = true
		gt, wt := array.NewTableFromRecords(got[0].Schema(), got), array.NewTableFromRecords(want[0].Schema(), want)
		if gt.NumRows() != wt.NumRows() || gt.NumRows() == 0 {
			t.Fatalf("%s where %s: %d rows, want %d", path, where, gt.NumRows(), wt.NumRows())
		}
		for c := 0; c < int(gt.NumCols()); c++ {
			a, b := gt.Column(c).Data(), wt.Column(c).Data()
			if !array.ChunkedEqual(a, b) {
				t.Fatalf("%s where %s: column %d differs", path, where, c)
			}
		}
		releaseBatches(got)
		releaseBatches(want)
	}
}

// A chunk smashed under an intact footer is an error naming the file on
// the flat path, not a panic or wrong rows.
func TestFlatDecoderCorruptChunk(t *testing.T) {
	db := openDuck(t)
	good := tmpPath(t, "good.parquet")
	mustExec(t, db, `COPY (SELECT i::BIGINT AS a, (i * 0.25)::DOUBLE AS b FROM range(50000) t(i))
		TO '%s' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 10000)`, good)
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for i := 100; i < len(data)/2; i += 7 {
		data[i] ^= 0x5a
	}
	bad := tmpPath(t, "smashed.parquet")
	os.WriteFile(bad, data, 0o644)
	_, err = Scan(bg, []string{bad}, ScanOptions{Columns: "a", Where: "b > 10"}, func(arrow.RecordBatch) error { return nil })
	if err == nil || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), bad) {
		t.Fatalf("error %v does not name %s as corrupt", err, bad)
	}
	t.Log(err)
}

// A local file truncated under the memory map while it is scanned faults;
// the fault is an ErrCorrupt naming the file, not a crash.
func TestFlatDecoderFileTruncatedUnderMap(t *testing.T) {
	db := openDuck(t)
	path := tmpPath(t, "shrinks.parquet")
	mustExec(t, db, `COPY (SELECT i::BIGINT AS a, hash(i)::DOUBLE AS b FROM range(400000) t(i))
		TO '%s' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 100000)`, path)
	pf, err := OpenFile(bg, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	if pf.mapped() == nil {
		t.Skip("no memory map here")
	}
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	s := getScratch()
	defer putScratch(s)
	_, _, _, err = pf.decodeFlat(pf.NumRowGroups()-1, 1, s)
	if err == nil || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %v does not name %s as corrupt", err, path)
	}
	t.Log(err)
}

// dictArray gives the strings and nulls arrow-go gives, on files of pyarrow
// (codecs, pages v1 and v2, nulls, several pages) and DuckDB, and declines
// chunks whose dictionary overflowed into PLAIN pages.
func TestDictArrayMatchesArrow(t *testing.T) {
	dir := t.TempDir()
	var files []string
	if err := runPython("import pyarrow"); err == nil {
		code := fmt.Sprintf(`
import pyarrow as pa, pyarrow.parquet as pq
n = 30000
t = pa.table({
  "s": pa.array([None if i %% 7 == 3 else "cat_%%d" %% (i %% 23) for i in range(n)], pa.string()),
  "b": pa.array([("k%%d" %% (i %% 5)).encode() for i in range(n)], pa.binary()),
  "u": pa.array(["unique_%%d" %% i for i in range(n)], pa.string()),
})
for codec in ["NONE", "SNAPPY", "GZIP", "ZSTD"]:
    for v in ["1.0", "2.0"]:
        pq.write_table(t, "%s/pa-%%s-v%%s.parquet" %% (codec, v), compression=codec, data_page_version=v,
            data_page_size=8 << 10, dictionary_pagesize_limit=64 << 10, row_group_size=12000)
`, dir)
		if err := runPython(code); err != nil {
			t.Fatal(err)
		}
		m, _ := filepath.Glob(filepath.Join(dir, "pa-*.parquet"))
		files = append(files, m...)
	}
	db := openDuck(t)
	duck := filepath.Join(dir, "duck.parquet")
	mustExec(t, db, `COPY (SELECT CASE WHEN i %% 4 = 0 THEN NULL ELSE 'v' || (i %% 9)::VARCHAR END AS s FROM range(50000) t(i))
		TO '%s' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 20000)`, duck)
	files = append(files, duck)
	forEachChunk(t, "string", files, func(path string, pf *File, rg, c int) bool {
		got, err := pf.dictArray(rg, c)
		if err == errDecline {
			if pf.Schema.Field(c).Name != "u" {
				t.Errorf("%s rg %d col %s: declined", path, rg, pf.Schema.Field(c).Name)
			}
			return false
		}
		if err != nil {
			t.Fatalf("%s rg %d col %d: %v", path, rg, c, err)
		}
		rec := generalColumn(t, pf, rg, c)
		plain, err := undict(got.(*array.Dictionary), pf.Schema.Field(c).Type)
		if err != nil {
			t.Fatal(err)
		}
		if !array.Equal(plain, rec.Column(0)) || got.NullN() != rec.Column(0).NullN() {
			t.Fatalf("%s rg %d col %s: dictArray differs from arrow-go", path, rg, pf.Schema.Field(c).Name)
		}
		plain.Release()
		got.Release()
		rec.Release()
		return true
	})
}

// forEachChunk opens each file and calls check on every column chunk of
// every row group; check reports false when the decoder declined the
// chunk. It logs how many (what) chunks were decoded and declined, and
// fails the test if none was decoded.
func forEachChunk(t *testing.T, what string, files []string, check func(path string, pf *File, rg, c int) bool) {
	t.Helper()
	decoded, declined := 0, 0
	for _, path := range files {
		pf, err := OpenFile(bg, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for rg := 0; rg < pf.NumRowGroups(); rg++ {
			for c := 0; c < pf.Schema.NumFields(); c++ {
				if check(path, pf, rg, c) {
					decoded++
				} else {
					declined++
				}
			}
		}
		pf.Close()
	}
	t.Logf("%d %s chunks decoded, %d declined", decoded, what, declined)
	if decoded == 0 {
		t.Fatal("nothing decoded")
	}
}

// generalColumn reads column c of row group rg with the fast decoders
// turned off: the arrow-go reading the fast paths are checked against.
func generalColumn(t *testing.T, pf *File, rg, c int) arrow.Record {
	t.Helper()
	FastPath = false
	defer func() { FastPath = true }()
	rec, err := pf.ReadRowGroup(bg, rg, []int{c})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
