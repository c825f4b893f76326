package scan

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
)

// The flat binary decoder gives the same values and nulls as arrow-go's
// reader on binary and string chunks written by pyarrow (every codec it
// handles, data pages v1 and v2, several pages per chunk, nulls, empty
// values, dictionary pages and chunks whose dictionary overflowed into
// PLAIN pages) and by DuckDB, and declines codecs it lacks.
func TestFlatBinaryMatchesArrow(t *testing.T) {
	dir := t.TempDir()
	var files []string
	if err := runPython("import pyarrow"); err != nil {
		t.Logf("pyarrow missing, DuckDB files only: %v", err)
	} else {
		code := fmt.Sprintf(`
import pyarrow as pa, pyarrow.parquet as pq
n = 20000
t = pa.table({
  "k": pa.array([bytes([(i * 37 + j) %% 256 for j in range(10)]) for i in range(n)], pa.binary()),
  "s": pa.array([None if i %% 9 == 4 else "x" * (i %% 23) for i in range(n)], pa.string()),
  "b": pa.array([None if i %% 5 == 0 else b"" if i %% 7 == 0 else b"v%%d" %% i for i in range(n)], pa.binary()),
})
t = t.cast(pa.schema([t.schema.field("k").with_nullable(False), t.schema.field("s"), t.schema.field("b")]))
for codec in ["NONE", "SNAPPY", "GZIP", "ZSTD", "LZ4"]:
    for v in ["1.0", "2.0"]:
        for d in [True, False]:
            pq.write_table(t, "%s/pa-%%s-v%%s-%%s.parquet" %% (codec, v, d), compression=codec, data_page_version=v,
                use_dictionary=d, data_page_size=16 << 10, row_group_size=7000, dictionary_pagesize_limit=4 << 10)
`, dir)
		if err := runPython(code); err != nil {
			t.Fatal(err)
		}
		files, _ = filepath.Glob(filepath.Join(dir, "pa-*.parquet"))
	}
	db := openDuck(t)
	duck := filepath.Join(dir, "duck.parquet")
	mustExec(t, db, `COPY (SELECT unhex(md5(i::VARCHAR)) AS k, CASE WHEN i %% 5 = 0 THEN NULL ELSE repeat('y', (i %% 13)::INTEGER) END AS s
		FROM range(30000) t(i)) TO '%s' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 12000)`, duck)
	files = append(files, duck)
	forEachChunk(t, "binary", files, func(path string, pf *File, rg, c int) bool {
		got, err := pf.binaryArray(rg, c)
		if err == errDecline {
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
		if !array.Equal(got, want) || got.NullN() != want.NullN() {
			t.Fatalf("%s rg %d col %s: flat binary decoder differs from arrow-go\n got %v\nwant %v", path, rg, pf.Schema.Field(c).Name, got, want)
		}
		got.Release()
		rec.Release()
		return true
	})
}
