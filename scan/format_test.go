package scan

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/ffkit/ffkit/ffrecord"
)

// The killed-job test runs a job in a child process (this test binary,
// re-executed) and SIGKILLs it midway.
func TestMain(m *testing.M) {
	if spec := os.Getenv("FFKIT_SCAN_CHILD_JOB"); spec != "" {
		var j Job
		if err := json.Unmarshal([]byte(spec), &j); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		block := os.Getenv("FFKIT_SCAN_CHILD_BLOCK")
		failTaskForTesting = func(name, stage string) error {
			if name == block {
				select {} // wait to be killed
			}
			return nil
		}
		if _, err := Run(bg, j); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestKilledJobRerunGivesSameOutput(t *testing.T) {
	db := openDuck(t)
	in := inputs(t, 12000, 1000)["duckdb"]
	out := filepath.Join(t.TempDir(), "out")
	job := Job{Inputs: []string{in}, Where: "x IS NOT NULL", Columns: "id, name, x * 2 AS x2, d", PartitionBy: "rows", Partitions: 6, Output: out, Workers: 1}
	spec, _ := json.Marshal(job)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FFKIT_SCAN_CHILD_JOB="+string(spec), "FFKIT_SCAN_CHILD_BLOCK=part-00003")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(out, WorkDirName, "tasks", "part-00002.json")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("child never published part-00002")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if _, err := os.Stat(filepath.Join(out, "part-00003.parquet")); err == nil {
		t.Fatal("the blocked task was published")
	}
	s, err := Run(bg, job)
	if err != nil {
		t.Fatal(err)
	}
	if s.TasksSkipped != 3 || s.Tasks != 6 {
		t.Fatalf("rerun after kill: %+v", s)
	}
	clean := filepath.Join(t.TempDir(), "clean")
	job.Output = clean
	c, err := Run(bg, job)
	if err != nil {
		t.Fatal(err)
	}
	if c.RowsOut != s.RowsOut || len(c.OutputFiles) != len(s.OutputFiles) {
		t.Fatalf("rerun %+v, clean run %+v", s, c)
	}
	for i := range s.OutputFiles {
		if filepath.Base(s.OutputFiles[i]) != filepath.Base(c.OutputFiles[i]) {
			t.Fatalf("file lists differ: %v vs %v", s.OutputFiles, c.OutputFiles)
		}
		sameAsDuck(t, db, s.OutputFiles[i], fmt.Sprintf("SELECT * FROM read_parquet(%s)", sqlString(c.OutputFiles[i])))
	}
	ents, _ := os.ReadDir(filepath.Join(out, WorkDirName))
	for _, e := range ents {
		if e.Name() == "staging" {
			t.Fatal("staging left behind after a successful rerun")
		}
	}
}

func TestOutputFormats(t *testing.T) {
	db := openDuck(t)
	in := inputs(t, 5000, 1000)["duckdb"]
	src := fmt.Sprintf("read_parquet(%s)", sqlString(in))
	dir := t.TempDir()

	// CSV and JSON lines read back by DuckDB
	for _, f := range []string{FormatCSV, FormatJSONL} {
		out := filepath.Join(dir, "out."+map[string]string{FormatCSV: "csv", FormatJSONL: "jsonl"}[f])
		if _, err := Run(bg, Job{Inputs: []string{in}, Columns: "id, name, x, flag, d", Where: "k < 40", Format: f, Output: out, PartitionBy: "rows", Partitions: 2}); err != nil {
			t.Fatal(err)
		}
		reader := "read_csv(" + sqlString(out) + ", header=true)"
		if f == FormatJSONL {
			reader = "read_json(" + sqlString(out) + ", format='newline_delimited')"
		}
		want := "SELECT id, name, x, flag, d FROM " + src + " WHERE k < 40"
		got := "SELECT id::BIGINT, name::VARCHAR, x::DOUBLE, flag::BOOLEAN, d::DATE FROM " + reader
		missing := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM ((%s) EXCEPT ALL (%s))", want, got))
		extra := queryInt(t, db, fmt.Sprintf("SELECT count(*) FROM ((%s) EXCEPT ALL (%s))", got, want))
		if missing != 0 || extra != 0 {
			t.Fatalf("%s output differs: %d missing, %d extra", f, missing, extra)
		}
	}

	// Arrow IPC file: memory-mappable, read by arrow-go (and pyarrow if present)
	arrowOut := filepath.Join(dir, "out.arrow")
	if _, err := Run(bg, Job{Inputs: []string{in}, Columns: "id, name, ts, dec", Where: "k = 7", Format: FormatArrow, Output: arrowOut}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(arrowOut)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ipc.NewFileReader(f, ipc.WithAllocator(memory.DefaultAllocator))
	if err != nil {
		t.Fatal(err)
	}
	var rows int64
	for i := 0; i < r.NumRecords(); i++ {
		rec, err := r.RecordBatch(i)
		if err != nil {
			t.Fatal(err)
		}
		rows += rec.NumRows()
	}
	r.Close()
	f.Close()
	if want := queryInt(t, db, "SELECT count(*) FROM "+src+" WHERE k = 7"); rows != want || fmt.Sprint(r.Schema().Field(3).Type) != "decimal(10, 2)" {
		t.Fatalf("arrow file: %d rows (want %d), schema %s", rows, want, r.Schema())
	}
	if err := runPython(fmt.Sprintf(`import pyarrow as pa
t = pa.ipc.open_file(pa.memory_map(%q)).read_all()
assert t.num_rows == %d, t.num_rows
assert t.column_names == ["id", "name", "ts", "dec"], t.column_names`, arrowOut, rows)); err != nil && !strings.Contains(err.Error(), "No module named") {
		t.Fatalf("pyarrow cannot map the Arrow file: %v", err)
	}

	// FFRecord: one sample per row, the bytes of the sample column, in order
	ffr := filepath.Join(dir, "packed")
	if _, err := Run(bg, Job{Inputs: []string{in}, Where: "k < 10", Format: FormatFFRecord, SampleColumn: "uniq", ShardSize: 4 << 10, Output: ffr}); err != nil {
		t.Fatal(err)
	}
	rd, err := ffrecord.Open(bg, []string{ffr}, ffrecord.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	dbRows, err := db.Query("SELECT uniq FROM " + src + " WHERE k < 10")
	if err != nil {
		t.Fatal(err)
	}
	defer dbRows.Close()
	var i int64
	for dbRows.Next() {
		var want string
		dbRows.Scan(&want)
		got, err := rd.ReadOne(bg, i)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("sample %d: %q, want %q", i, got, want)
		}
		i++
	}
	if i != rd.N() || i == 0 {
		t.Fatalf("ffrecord has %d samples, want %d", rd.N(), i)
	}
	shards, _ := filepath.Glob(filepath.Join(ffr, "*.ffr"))
	if len(shards) < 2 {
		t.Fatalf("want several shards at a 4 KiB target, got %v", shards)
	}
}

// A sink's buffered row groups respect the byte cap shuffle producers use.
func TestSinkRowGroupByteCap(t *testing.T) {
	db := openDuck(t)
	in := tmpPath(t, "in.parquet")
	mustExec(t, db, "COPY (SELECT random() AS a, random() AS b FROM range(300000)) TO '%s' (FORMAT parquet, ROW_GROUP_SIZE 300000)", in)
	pf, err := OpenFile(bg, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	dir := t.TempDir()
	s, err := newSink(bg, sinkOptions{format: FormatParquet, dir: dir, base: "capped", schema: pf.Schema, rowGroupBytes: 512 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for rg := 0; rg < pf.NumRowGroups(); rg++ {
		rec, err := pf.ReadRowGroup(bg, rg, []int{0, 1})
		if err != nil {
			t.Fatal(err)
		}
		for off := int64(0); off < rec.NumRows(); off += 10000 {
			part := rec.NewSlice(off, min(off+10000, rec.NumRows()))
			if err := s.Write(part); err != nil {
				t.Fatal(err)
			}
			part.Release()
		}
		rec.Release()
	}
	if _, _, err := s.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := OpenFile(bg, filepath.Join(dir, "capped.parquet"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	// 300k rows x 16 bytes = 4.8 MB: a 512 KiB cap makes ~9 row groups
	if out.NumRowGroups() < 5 || out.Rows != 300000 {
		t.Fatalf("%d row groups, %d rows", out.NumRowGroups(), out.Rows)
	}
}
