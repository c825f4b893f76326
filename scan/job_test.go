package scan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/ffkit/ffkit/internal/errkind"
	"github.com/ffkit/ffkit/scan/expr"
)

// inputs returns the same generated table as written by DuckDB, by ffkit
// (a plain job over DuckDB's file) and, when pyarrow is installed, by
// pyarrow without dictionaries (plain encoding, data page v2).
func inputs(t *testing.T, rows, rowGroup int) map[string]string {
	t.Helper()
	db := openDuck(t)
	dir := t.TempDir()
	out := map[string]string{"duckdb": filepath.Join(dir, "duck.parquet")}
	genDuck(t, db, out["duckdb"], rows, rowGroup)
	out["ffkit"] = filepath.Join(dir, "ffkit.parquet")
	if _, err := Run(bg, Job{Inputs: []string{out["duckdb"]}, Output: out["ffkit"], RowGroupRows: int64(rowGroup)}); err != nil {
		t.Fatal(err)
	}
	if p, ok := pyarrowCopy(t, out["duckdb"], filepath.Join(dir, "pyarrow.parquet"), rowGroup); ok {
		out["pyarrow"] = p
	}
	return out
}

func pyarrowCopy(t *testing.T, in, out string, rowGroup int) (string, bool) {
	py := fmt.Sprintf(`import pyarrow.parquet as pq
t = pq.read_table(%q)
pq.write_table(t, %q, use_dictionary=False, data_page_version="2.0", row_group_size=%d, compression="snappy")`, in, out, rowGroup)
	if err := runPython(py); err != nil {
		t.Logf("pyarrow-written input skipped: %v", err)
		return "", false
	}
	return out, true
}

func TestInputsFromEveryWriter(t *testing.T) {
	db := openDuck(t)
	for name, in := range inputs(t, 20000, 3000) {
		t.Run(name, func(t *testing.T) {
			out := tmpPath(t, "o.parquet")
			where := "(k < 20 OR name LIKE '%_4%') AND x IS NOT NULL AND d BETWEEN '2020-02-01' AND '2021-06-30'"
			if _, err := Run(bg, Job{Inputs: []string{in}, Where: where, Output: out}); err != nil {
				t.Fatal(err)
			}
			q := fmt.Sprintf("SELECT * FROM read_parquet(%s) WHERE %s", sqlString(in), where)
			sameAsDuck(t, db, out, q)
			sameTypes(t, db, out, q)
		})
	}
}

func TestGroupByMatchesDuckDB(t *testing.T) {
	db := openDuck(t)
	ins := inputs(t, 25000, 4000)
	cases := []struct {
		keys  []string
		aggs  string // ours
		duck  string // DuckDB's select list after the keys
		where string
	}{
		{[]string{"name"}, "count(*), count(x), sum(k), mean(x), min(x), max(x)", "count(*), count(x), sum(k), round(avg(x), 6), min(x), max(x)", ""},
		{[]string{"k"}, "count(*), sum(x), min(name), max(d), mean(dec)", "count(*), round(sum(x), 6), min(name), max(d), round(avg(dec), 6)", "id % 3 = 1"},
		{[]string{"flag", "d", "t8"}, "count(*), min(ts), max(dec), sum(t8)", "count(*), min(ts), max(dec), sum(t8)", "k < 30"},
		{nil, "count(*), sum(id), min(uniq), max(uniq), mean(k), count(nothing), max(nothing)", "count(*), sum(id), min(uniq), max(uniq), round(avg(k), 6), count(nothing), max(nothing)", ""},
	}
	for name, in := range ins {
		for i, c := range cases {
			t.Run(fmt.Sprintf("%s/%d", name, i), func(t *testing.T) {
				out := tmpPath(t, "agg.parquet")
				_, err := Run(bg, Job{Inputs: []string{in}, GroupBy: c.keys, Aggs: c.aggs, Where: c.where, Output: out,
					PartitionBy: "rows", Partitions: 3})
				if err != nil {
					t.Fatal(err)
				}
				keys := strings.Join(c.keys, ", ")
				sel := keys
				if sel != "" {
					sel += ", "
				}
				want := fmt.Sprintf("SELECT %s%s FROM read_parquet(%s)", sel, c.duck, sqlString(in))
				if c.where != "" {
					want += " WHERE " + c.where
				}
				if keys != "" {
					want += " GROUP BY " + keys
				}
				// round our float columns the same way
				items, _ := expr.ParseList(c.aggs)
				var cols []string
				for _, k := range c.keys {
					cols = append(cols, fmt.Sprintf("%q", k))
				}
				duckItems, _ := expr.ParseList(c.duck)
				for j, it := range items {
					col := fmt.Sprintf("%q", it.Name)
					if strings.HasPrefix(duckItems[j].Name, "round(") {
						col = "round(" + col + ", 6)"
					}
					cols = append(cols, col)
				}
				o := fmt.Sprintf("SELECT %s FROM read_parquet(%s)", strings.Join(cols, ", "), sqlString(out))
				missing := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM ((%s) EXCEPT ALL (%s))", want, o))
				extra := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM ((%s) EXCEPT ALL (%s))", o, want))
				if missing != 0 || extra != 0 {
					t.Fatalf("group-by differs from DuckDB: %d missing, %d extra\nours: %s\nwant: %s", missing, extra, o, want)
				}
				if n := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM (%s)", want)); n == 0 {
					t.Fatal("empty result: the test proves nothing")
				}
			})
		}
	}
}

func TestHashPartitionPutsEachKeyInOnePartition(t *testing.T) {
	db := openDuck(t)
	in := inputs(t, 20000, 3000)["duckdb"]
	for _, keys := range []string{"k", "name", "name,flag"} {
		t.Run(keys, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "parts")
			n := 7
			sum, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: "hash:" + keys, Partitions: n, Output: out, Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			glob := filepath.Join(out, "*.parquet")
			sameAsDuck(t, db, glob, fmt.Sprintf("SELECT * FROM read_parquet(%s)", sqlString(in)))
			split := queryInt(t, db, fmt.Sprintf(`SELECT count(*) FROM (SELECT %s FROM read_parquet(%s, filename=true)
				GROUP BY %s HAVING count(DISTINCT regexp_extract(filename, 'part-(\d+)', 1)) > 1)`, keys, sqlString(glob), keys))
			if split != 0 {
				t.Fatalf("%d keys are in more than one partition", split)
			}
			// every partition has a file, tagged with its partition
			seen := map[int]bool{}
			for _, f := range sum.OutputFiles {
				pf, err := OpenFile(bg, f, nil)
				if err != nil {
					t.Fatal(err)
				}
				tag, _ := pf.KeyValue(KeyPartition)
				p, _ := partOfName(filepath.Base(f))
				if tag != fmt.Sprint(p) {
					t.Fatalf("%s tagged partition %q", f, tag)
				}
				seen[p] = true
				pf.Close()
			}
			if len(seen) != n {
				t.Fatalf("partitions with files: %v, want all %d", seen, n)
			}
		})
	}
	// a string filter (decoded as a dictionary) before the hash split
	strOut := filepath.Join(t.TempDir(), "str")
	if _, err := Run(bg, Job{Inputs: []string{in}, Where: "name LIKE 'str_1%'", Columns: "id, name", PartitionBy: "hash:name", Partitions: 3, Output: strOut}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, filepath.Join(strOut, "*.parquet"), fmt.Sprintf("SELECT id, name FROM read_parquet(%s) WHERE name LIKE 'str_1%%'", sqlString(in)))
	sameTypes(t, db, filepath.Join(strOut, "part-00000-00000.parquet"), fmt.Sprintf("SELECT id, name FROM read_parquet(%s)", sqlString(in)))

	// PartitionOf agrees with where rows went, and a partition nobody hashes
	// to still gets a schema-only file
	out := filepath.Join(t.TempDir(), "few")
	sum, err := Run(bg, Job{Inputs: []string{in}, Where: "k < 3", Columns: "k", PartitionBy: "hash:k", Partitions: 16, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	empty := 0
	for _, f := range sum.OutputFiles {
		if strings.HasSuffix(f, "-empty.parquet") {
			empty++
			if n := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM read_parquet(%s)", sqlString(f))); n != 0 {
				t.Fatalf("%s has %d rows", f, n)
			}
			continue
		}
		p, _ := partOfName(filepath.Base(f))
		rows, err := db.Query(fmt.Sprintf("SELECT DISTINCT k FROM read_parquet(%s)", sqlString(f)))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k int64
			rows.Scan(&k)
			if want := PartitionOf([]expr.Value{{T: expr.TInt, I: k}}, 16); want != p {
				t.Fatalf("key %d in partition %d, PartitionOf says %d", k, p, want)
			}
		}
		rows.Close()
	}
	if empty < 16-3 {
		t.Fatalf("%d schema-only files for 16 partitions of 3 keys", empty)
	}
}

func TestRowsAndFilesPartitioning(t *testing.T) {
	db := openDuck(t)
	dir := t.TempDir()
	for i := 0; i < 3; i++ {
		mustExec(t, db, "COPY (SELECT i + %d AS id FROM range(1000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 300)", i*1000, filepath.Join(dir, fmt.Sprintf("in%d.parquet", i)))
	}
	out := filepath.Join(t.TempDir(), "rows")
	sum, err := Run(bg, Job{Inputs: []string{dir}, PartitionBy: "rows", Partitions: 4, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.OutputFiles) != 4 {
		t.Fatalf("files: %v", sum.OutputFiles)
	}
	for p, f := range sum.OutputFiles {
		lo := queryInt(t, db, fmt.Sprintf("SELECT min(id) FROM read_parquet(%s)", sqlString(f)))
		n := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM read_parquet(%s)", sqlString(f)))
		if n != 750 || lo != int64(p*750) {
			t.Fatalf("rows partition %d: %d rows from %d, want 750 from %d", p, n, lo, p*750)
		}
	}
	out2 := filepath.Join(t.TempDir(), "files")
	sum, err = Run(bg, Job{Inputs: []string{filepath.Join(dir, "in*.parquet")}, PartitionBy: "files", Partitions: 2, Output: out2})
	if err != nil {
		t.Fatal(err)
	}
	counts := []int64{}
	for _, f := range sum.OutputFiles {
		counts = append(counts, queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM read_parquet(%s)", sqlString(f))))
	}
	if fmt.Sprint(counts) != "[1000 2000]" {
		t.Fatalf("files partitions: %v rows", counts)
	}
}

func TestSQLPerPartitionAndJoin(t *testing.T) {
	db := openDuck(t)
	in := inputs(t, 12000, 2000)["duckdb"]
	// per-partition SQL over hash partitions = the global group-by
	out := filepath.Join(t.TempDir(), "sql")
	if _, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: "hash:k", Partitions: 4, Output: out,
		SQL: "SELECT k, count(*) AS n, sum(id) AS s FROM input GROUP BY k", MemoryLimit: "256MB"}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, filepath.Join(out, "*.parquet"), fmt.Sprintf("SELECT k, count(*) AS n, sum(id) AS s FROM read_parquet(%s) GROUP BY k", sqlString(in)))

	// SQL over row-range partitions
	out = filepath.Join(t.TempDir(), "sqlrows")
	if _, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: "rows", Partitions: 3, Output: out,
		SQL: "SELECT id, upper(name) AS u FROM input WHERE flag"}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, filepath.Join(out, "*.parquet"), fmt.Sprintf("SELECT id, upper(name) AS u FROM read_parquet(%s) WHERE flag", sqlString(in)))

	// partition-wise join of two inputs hash-partitioned the same way
	right := tmpPath(t, "right.parquet")
	mustExec(t, db, "COPY (SELECT (i * 7) %% 12000 AS id, 'r' || i::VARCHAR AS tag FROM range(5000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 1000)", right)
	out = filepath.Join(t.TempDir(), "join")
	if _, err := Run(bg, Job{Inputs: []string{in}, JoinInputs: []string{right}, PartitionBy: "hash:id", Partitions: 5, Output: out,
		SQL: "SELECT input.id, input.name, input2.tag FROM input JOIN input2 ON input.id = input2.id"}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, filepath.Join(out, "*.parquet"), fmt.Sprintf("SELECT a.id, a.name, b.tag FROM read_parquet(%s) a JOIN read_parquet(%s) b ON a.id = b.id", sqlString(in), sqlString(right)))

	// a bad query is a usage error naming the partition, not retried
	_, err := Run(bg, Job{Inputs: []string{in}, Output: filepath.Join(t.TempDir(), "bad"), SQL: "SELEC nonsense FROM input"})
	if err == nil || errkind.Of(err) != errkind.Usage || !strings.Contains(err.Error(), "partition 0") {
		t.Fatalf("bad SQL: %v (kind %v)", err, errkind.Of(err))
	}
}

func TestRowGroupSkippingSavesBytes(t *testing.T) {
	db := openDuck(t)
	in := tmpPath(t, "sorted.parquet")
	mustExec(t, db, "COPY (SELECT i AS id, md5(i::VARCHAR) AS payload FROM range(100000) t(i)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 10000)", in)
	full, err := Run(bg, Job{Inputs: []string{in}, Where: "length(payload) > 0", Output: tmpPath(t, "a.parquet")})
	if err != nil {
		t.Fatal(err)
	}
	pruned, err := Run(bg, Job{Inputs: []string{in}, Where: "id BETWEEN 42000 AND 42100", Output: tmpPath(t, "b.parquet")})
	if err != nil {
		t.Fatal(err)
	}
	if pruned.RowGroups != 10 || pruned.RowGroupsSkipped != 9 || pruned.RowsOut != 101 {
		t.Fatalf("pruned: %+v", pruned)
	}
	if full.RowGroupsSkipped != 0 {
		t.Fatalf("full scan skipped %d row groups", full.RowGroupsSkipped)
	}
	// the footer is read once in both; the data read shrinks with the skipped groups
	if pruned.BytesRead*5 > full.BytesRead {
		t.Fatalf("bytes read: pruned %d, full %d", pruned.BytesRead, full.BytesRead)
	}
	t.Logf("bytes read: full scan %d, 9 of 10 row groups skipped %d", full.BytesRead, pruned.BytesRead)
	// IS NULL / IN / NOT prune too
	for _, w := range []string{"id IN (5, 99999)", "NOT (id >= 10000)", "payload IS NULL"} {
		s, err := Run(bg, Job{Inputs: []string{in}, Where: w, Output: tmpPath(t, "c.parquet")})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{"id IN (5, 99999)": 8, "NOT (id >= 10000)": 9, "payload IS NULL": 10}[w]
		if s.RowGroupsSkipped != want {
			t.Fatalf("%s: skipped %d row groups, want %d", w, s.RowGroupsSkipped, want)
		}
	}
}

func TestCoalescedReadsMatch(t *testing.T) {
	CoalesceLocal = true
	defer func() { CoalesceLocal = false }()
	db := openDuck(t)
	in := inputs(t, 9000, 2000)["duckdb"]
	out := tmpPath(t, "o.parquet")
	if _, err := Run(bg, Job{Inputs: []string{in}, Where: "k > 50", Columns: "id, name, x, d", Output: out}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, out, fmt.Sprintf("SELECT id, name, x, d FROM read_parquet(%s) WHERE k > 50", sqlString(in)))
}

func TestRerunSkipsPublishedTasksAndChangedJobReplaces(t *testing.T) {
	db := openDuck(t)
	in := inputs(t, 10000, 1000)["duckdb"]
	out := filepath.Join(t.TempDir(), "out")
	job := Job{Inputs: []string{in}, Where: "k < 50", PartitionBy: "rows", Partitions: 5, Output: out}
	first, err := Run(bg, job)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Run(bg, job)
	if err != nil {
		t.Fatal(err)
	}
	if again.TasksSkipped != again.Tasks || again.Tasks != 5 || again.RowsOut != first.RowsOut {
		t.Fatalf("rerun: %+v", again)
	}
	// a published file deleted by hand: its task runs again
	os.Remove(filepath.Join(out, "part-00003.parquet"))
	again, err = Run(bg, job)
	if err != nil || again.TasksSkipped != 4 {
		t.Fatalf("rerun after a deleted part: %+v %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(out, "part-00003.parquet")); err != nil {
		t.Fatal(err)
	}
	// a changed job (fewer partitions, another filter) replaces everything
	job.Partitions, job.Where = 2, "k >= 50"
	changed, err := Run(bg, job)
	if err != nil {
		t.Fatal(err)
	}
	if changed.TasksSkipped != 0 || len(changed.OutputFiles) != 2 {
		t.Fatalf("changed job: %+v", changed)
	}
	ents, _ := os.ReadDir(out)
	var parts []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "part-") {
			parts = append(parts, e.Name())
		}
	}
	if len(parts) != 2 {
		t.Fatalf("stale partitions left: %v", parts)
	}
	sameAsDuck(t, db, filepath.Join(out, "*.parquet"), fmt.Sprintf("SELECT * FROM read_parquet(%s) WHERE k >= 50", sqlString(in)))
	// a single-file output carries the fingerprint: a rerun is a no-op
	one := tmpPath(t, "one.parquet")
	job.Output = one
	if _, err := Run(bg, job); err != nil {
		t.Fatal(err)
	}
	s, err := Run(bg, job)
	if err != nil || !s.UpToDate {
		t.Fatalf("single-file rerun: %+v %v", s, err)
	}
}

func TestFailedTaskIsRetried(t *testing.T) {
	in := inputs(t, 3000, 1000)["duckdb"]
	fails := map[string]int{}
	failTaskForTesting = func(name, stage string) error {
		fails[name]++
		if name == "part-00001" && fails[name] <= 1 {
			return errors.New("injected failure")
		}
		if name == "part-00002" {
			return errors.New("injected permanent failure")
		}
		return nil
	}
	defer func() { failTaskForTesting = nil }()
	s, err := Run(bg, Job{Inputs: []string{in}, PartitionBy: "rows", Partitions: 2, Output: filepath.Join(t.TempDir(), "o"), Workers: 1})
	if err != nil || s.Retries != 1 {
		t.Fatalf("retry: %+v %v", s, err)
	}
	_, err = Run(bg, Job{Inputs: []string{in}, PartitionBy: "rows", Partitions: 3, Output: filepath.Join(t.TempDir(), "p"), Workers: 1, Retries: 2})
	if err == nil || !strings.Contains(err.Error(), "permanent") || fails["part-00002"] != 3 {
		t.Fatalf("permanent failure: %v after %d attempts", err, fails["part-00002"])
	}
}

func TestCorruptParquetNamesTheFile(t *testing.T) {
	db := openDuck(t)
	good := tmpPath(t, "good.parquet")
	genDuck(t, db, good, 5000, 1000)
	data, _ := os.ReadFile(good)
	dir := t.TempDir()
	bad := map[string][]byte{
		"truncated.parquet": data[:len(data)/2],
		"tiny.parquet":      data[:7],
		"nofooter.parquet":  append(append([]byte{}, data[:len(data)-8]...), 1, 2, 3, 4, 'X', 'X', 'X', 'X'),
	}
	// garbage over the data pages, footer intact
	smashed := append([]byte{}, data...)
	for i := 100; i < len(smashed)/2; i += 7 {
		smashed[i] ^= 0x5a
	}
	bad["smashed.parquet"] = smashed
	names := make([]string, 0, len(bad))
	for n := range bad {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		os.WriteFile(p, bad[n], 0o644)
		_, err := Run(bg, Job{Inputs: []string{p}, Output: filepath.Join(dir, "out-"+n)})
		if err == nil {
			t.Fatalf("%s: no error", n)
		}
		if !strings.Contains(err.Error(), p) || errkind.Of(err) != errkind.Data {
			t.Fatalf("%s: error %q (kind %v) does not name the file as bad data", n, err, errkind.Of(err))
		}
		t.Logf("%s: %v", n, err)
	}
}

func TestPageIndexSkipsPages(t *testing.T) {
	db := openDuck(t)
	in, src := tmpPath(t, "paged.parquet"), tmpPath(t, "src.parquet")
	// one 200,000-row row group with small pages and a page index
	mustExec(t, db, "COPY (SELECT i AS id, CASE WHEN i %% 9 = 0 THEN NULL ELSE i * 0.5 END::DOUBLE AS v, (i %% 1000)::INTEGER AS k, (i %% 77)::DECIMAL(9,2) AS dec FROM range(200000) t(i)) TO '%s' (FORMAT parquet)", src)
	writePaged(t, src, in)
	full, err := Run(bg, Job{Inputs: []string{in}, Where: "k >= 0", Output: tmpPath(t, "a.parquet")})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ where, cols string }{
		{"id BETWEEN 123456 AND 124000", "*"}, // one range: the decimal column (pqarrow) is read whole
		{"id < 10 OR id > 199990", "id, v, k"},
		{"id IN (5, 150000)", "id, k, v"},
		{"id >= 199000", "*"},
	}
	for _, c := range cases {
		out := tmpPath(t, "b.parquet")
		cols := c.cols
		if cols == "*" {
			cols = ""
		}
		s, err := Run(bg, Job{Inputs: []string{in}, Where: c.where, Columns: cols, Output: out})
		if err != nil {
			t.Fatal(err)
		}
		sameAsDuck(t, db, out, fmt.Sprintf("SELECT %s FROM read_parquet(%s) WHERE %s", c.cols, sqlString(in), c.where))
		if s.RowGroupsSkipped != 0 || s.PagesSkipped < 50 || s.BytesRead*2 > full.BytesRead {
			t.Fatalf("%s: %d pages skipped, %d bytes read (full scan %d)", c.where, s.PagesSkipped, s.BytesRead, full.BytesRead)
		}
		t.Logf("%s: %d pages skipped, %d of %d bytes read", c.where, s.PagesSkipped, s.BytesRead, full.BytesRead)
	}
}

// writePaged rewrites a Parquet file as one row group of 4 KiB pages with
// a page index.
func writePaged(t *testing.T, in, out string) {
	pf, err := OpenFile(bg, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := pqarrow.NewFileWriter(pf.Schema, f, parquet.NewWriterProperties(parquet.WithDataPageSize(4096),
		parquet.WithPageIndexEnabled(true), parquet.WithMaxRowGroupLength(1<<30), parquet.WithDictionaryDefault(false)),
		pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	for rg := 0; rg < pf.NumRowGroups(); rg++ {
		rec, err := pf.ReadRowGroup(bg, rg, allPos(pf.Schema.NumFields()))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteBuffered(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
