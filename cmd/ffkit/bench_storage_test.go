package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/internal/testbin"

	"github.com/ffkit/ffkit/bench"
)

// The storage-benchmark CLI tests run the built binary on small sizes and
// check what it prints and leaves behind. They never assert on speed.

func storageBenchBinary(t *testing.T) string {
	t.Helper()
	return testbin.Path(t)
}

// runBench runs ffkit with args and returns stdout, stderr and the exit code.
func runBench(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(storageBenchBinary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// runBenchJSON runs a benchmark with --json and decodes stdout, which must
// be exactly one JSON document.
func runBenchJSON(t *testing.T, v any, args ...string) string {
	t.Helper()
	out, stderr, code := runBench(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("ffkit %s: exit %d\n%s", strings.Join(args, " "), code, stderr)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	if dec.More() {
		t.Fatalf("stdout has more than one JSON document:\n%s", out)
	}
	return stderr
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	return n
}

func TestBenchSweepReadCLI(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "new", "sweep") // created by the benchmark, removed after
	cfgPath := filepath.Join(tmp, "io.json")
	report := filepath.Join(tmp, "sweep.html")
	var doc sweepDoc
	runBenchJSON(t, &doc, "bench", "sweep", dir, "--block-sizes", "4K,64K", "--queue-depths", "1,4", "--threads", "1,2",
		"--size", "8M", "--duration", "40ms", "--warmup", "10ms", "--runs", "2", "--fio=false",
		"--save-config", cfgPath, "--report", report)
	if len(doc.Points) != 8 || doc.Mode != "read" || doc.Runs != 2 || doc.FileSize != 8<<20 {
		t.Fatalf("doc: %+v", doc)
	}
	for _, p := range doc.Points {
		if p.MiBPerSec.Runs != 2 || p.MiBPerSec.Mean <= 0 || p.IOPS.Mean <= 0 || p.Latency.Count == 0 || p.Latency.P50US <= 0 {
			t.Errorf("point %+v", p)
		}
		// IOPS is batches/s x queue depth: MiB/s = IOPS x block / MiB.
		if want := p.IOPS.Mean * float64(p.BlockSize) / bench.MiB; abs(want-p.MiBPerSec.Mean) > 1e-6*want {
			t.Errorf("bs %d qd %d: IOPS %.1f does not match %.3f MiB/s", p.BlockSize, p.QueueDepth, p.IOPS.Mean, p.MiBPerSec.Mean)
		}
		if p.NaiveSumMiBPerSec < p.MiBPerSec.Mean*(1-1e-9) {
			t.Errorf("naive sum %.3f below aggregate %.3f", p.NaiveSumMiBPerSec, p.MiBPerSec.Mean)
		}
	}
	for _, p := range doc.Points {
		if p.MiBPerSec.Mean > doc.Best.MiBPerSec.Mean {
			t.Errorf("best %+v is not the fastest point", doc.Best)
		}
	}
	cfg, err := bench.ReadIOConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BlockSize != doc.Best.BlockSize || cfg.QueueDepth != doc.Best.QueueDepth || cfg.Threads != doc.Best.Threads || cfg.Mode != "read" {
		t.Errorf("io config %+v does not match best %+v", cfg, doc.Best)
	}
	html, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(html), `<svg class="chart"`); n != 3 {
		t.Errorf("report has %d charts, want 3", n)
	}
	checkReportRenders(t, report, 3)
	// The page carries the same figures as JSON.
	_, after, _ := strings.Cut(string(html), `<script type="application/json" id="data">`)
	data, _, _ := strings.Cut(after, "</script>")
	var embedded sweepDoc
	if err := json.Unmarshal([]byte(data), &embedded); err != nil || len(embedded.Points) != 8 || embedded.Best != doc.Best {
		t.Errorf("embedded data: %v, %d points", err, len(embedded.Points))
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("work directory %s left behind: %v", dir, err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "new")); !os.IsNotExist(err) {
		t.Errorf("parent directory the benchmark created is left: %v", err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Errorf("pre-existing directory removed: %v", err)
	}
}

// checkReportRenders opens an HTML report in headless Chromium (when
// installed) and checks that its charts were laid out without script errors.
func checkReportRenders(t *testing.T, page string, charts int) {
	t.Helper()
	var chrome string
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(n); err == nil {
			chrome = p
			break
		}
	}
	if chrome == "" {
		t.Log("chromium is not installed (scripts/setup.sh installs it): not rendering the report")
		return
	}
	profile := t.TempDir()
	cmd := exec.Command(chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
		"--user-data-dir="+profile, "--virtual-time-budget=3000", "--dump-dom", "file://"+page)
	cmd.Env = append(os.Environ(), "HOME="+profile)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, errb.String())
	}
	dom := out.String()
	if !strings.Contains(dom, fmt.Sprintf(`data-charts="%d"`, charts)) || !strings.Contains(dom, `data-errors="0"`) {
		i := strings.Index(dom, "<body")
		t.Errorf("report %s did not render %d charts without errors: %.200s", page, charts, dom[max(i, 0):])
	}
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

func TestBenchSweepWriteKeepsUserFiles(t *testing.T) {
	dir := t.TempDir()
	mine := filepath.Join(dir, "mine.txt")
	os.WriteFile(mine, []byte("keep me"), 0o644)
	var doc sweepDoc
	runBenchJSON(t, &doc, "bench", "sweep", dir, "--write", "--block-sizes", "64K", "--queue-depths", "2", "--threads", "1",
		"--size", "256M", "--duration", "40ms", "--warmup", "10ms", "--runs", "1", "--save-config", "")
	if len(doc.Points) != 1 || doc.Mode != "write" || doc.Points[0].MiBPerSec.Mean <= 0 || doc.IOConfig != "" {
		t.Fatalf("doc %+v", doc)
	}
	if names := dirNames(t, dir); len(names) != 1 || names[0] != "mine.txt" {
		t.Errorf("directory after the benchmark: %v (want only mine.txt)", names)
	}
	if bench.FioAvailable() && doc.Points[0].Fio == nil {
		t.Errorf("fio is installed but has no figure: %s", doc.Points[0].FioError)
	}
}

func TestBenchCheckpointCLI(t *testing.T) {
	dir := t.TempDir()
	var doc checkpointDoc
	report := filepath.Join(t.TempDir(), "ck.html")
	runBenchJSON(t, &doc, "bench", "checkpoint", dir, "--size", "6M", "--chunk", "1M", "--runs", "2", "--report", report)
	checkReportRenders(t, report, 2)
	if doc.Size != 6<<20 || doc.Write.MiBPerSec.Runs != 2 || doc.Write.MiBPerSec.Mean <= 0 || doc.Read.MiBPerSec.Mean <= 0 {
		t.Fatalf("doc %+v", doc)
	}
	if doc.Write.Latency.Count != 12 || doc.Read.Latency.Count != 12 {
		t.Errorf("latency counts %d/%d, want 6 calls x 2 runs", doc.Write.Latency.Count, doc.Read.Latency.Count)
	}
	if doc.BufferedMiBPerSec.Mean < doc.Write.MiBPerSec.Mean || doc.FsyncSeconds.Mean <= 0 {
		t.Errorf("buffered %.1f vs save %.1f, fsync %v", doc.BufferedMiBPerSec.Mean, doc.Write.MiBPerSec.Mean, doc.FsyncSeconds)
	}
	if r := doc.Write.MBPerSec.Mean / doc.Write.MiBPerSec.Mean; abs(r-1.048576) > 1e-9 {
		t.Errorf("MB/s / MiB/s = %v", r)
	}
	if bench.FioAvailable() && (doc.Write.Fio == nil || doc.Read.Fio == nil) {
		t.Errorf("fio installed but no figure: %q %q", doc.Write.FioError, doc.Read.FioError)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("files left: %v", names)
	}
}

func TestBenchModelLoadCLI(t *testing.T) {
	dir := t.TempDir()
	var doc modelLoadDoc
	report := filepath.Join(t.TempDir(), "ml.html")
	runBenchJSON(t, &doc, "bench", "model-load", dir, "--generate", "3x2M", "--clients", "2", "--runs", "1", "--keep", "--fio=false", "--report", report)
	checkReportRenders(t, report, 2)
	hdr := int64(len(safetensorsHeader(2 << 20)))
	if doc.Files != 3 || doc.Bytes != 3*(2<<20+hdr) || doc.Clients != 2 || doc.LoadTime.Count != 2 {
		t.Fatalf("doc %+v", doc)
	}
	if doc.AggregateMiBPerSec.Mean <= 0 || abs(doc.GiBPerSec.Mean*1024-doc.AggregateMiBPerSec.Mean) > 1e-9*doc.AggregateMiBPerSec.Mean {
		t.Errorf("GiB/s %v vs MiB/s %v", doc.GiBPerSec, doc.AggregateMiBPerSec)
	}
	// Aggregate is all clients' bytes over the whole span.
	if want := float64(2*doc.Bytes) / bench.MiB / doc.TotalSeconds.Mean; abs(want-doc.AggregateMiBPerSec.Mean) > 1e-6*want {
		t.Errorf("aggregate %.3f, want %.3f", doc.AggregateMiBPerSec.Mean, want)
	}
	// --keep left valid safetensors shards.
	names := dirNames(t, dir)
	if len(names) != 3 {
		t.Fatalf("kept files: %v", names)
	}
	b, err := os.ReadFile(filepath.Join(dir, names[0]))
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var meta map[string]struct {
		Dtype   string  `json:"dtype"`
		Shape   []int64 `json:"shape"`
		Offsets []int64 `json:"data_offsets"`
	}
	if err := json.Unmarshal(b[8:8+n], &meta); err != nil {
		t.Fatalf("safetensors header: %v", err)
	}
	if w := meta["weight"]; w.Dtype != "U8" || w.Offsets[1] != 2<<20 || int64(len(b))-8-int64(n) != 2<<20 {
		t.Errorf("tensor %+v, file %d bytes", w, len(b))
	}

	// Loading the kept directory again, without --generate.
	var again modelLoadDoc
	runBenchJSON(t, &again, "bench", "model-load", dir, "--runs", "1", "--fio=false")
	if again.Files != 3 || again.Generated || again.Bytes != doc.Bytes {
		t.Errorf("reload: %+v", again)
	}
	if len(dirNames(t, dir)) != 3 {
		t.Error("model-load removed files it did not create")
	}
}

func TestBenchParallelWriteCLI(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(t.TempDir(), "pw.html")
	var doc parallelWriteDoc
	runBenchJSON(t, &doc, "bench", "parallel-write", dir, "--procs", "3", "--size-per-proc", "3M", "--block", "512K", "--report", report)
	if doc.Procs != 3 || len(doc.PerRun) != 2 || doc.AggregateMiBPerSec <= 0 || doc.WriteLatency.Count != 2*3*6 {
		t.Fatalf("doc %+v", doc)
	}
	for _, r := range doc.PerRun {
		// Each process's own span is within the whole span, so the naive
		// sum can never be below the aggregate.
		if r.NaiveSumMiBPerSec < r.AggregateMiBPerSec*(1-1e-9) || r.SlowestProcSeconds > r.Seconds+1e-9 {
			t.Errorf("run %+v", r)
		}
		if want := 3 * 3.0 / r.Seconds; abs(want-r.AggregateMiBPerSec) > 1e-6*want {
			t.Errorf("aggregate %.3f, want 9 MiB / %.6fs = %.3f", r.AggregateMiBPerSec, r.Seconds, want)
		}
	}
	var raw map[string]any
	out, _, _ := runBench(t, "bench", "parallel-write", dir, "--procs", "2", "--size-per-proc", "1M", "--runs", "1", "--fio=false", "--json")
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"aggregate_mib_s", "naive_sum_mib_s"} {
		if v, ok := raw[k].(float64); !ok || v <= 0 {
			t.Errorf("JSON key %s = %v", k, raw[k])
		}
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("files left: %v", names)
	}
	checkReportRenders(t, report, 3)
}

func TestBenchStorageUsageErrors(t *testing.T) {
	dir := t.TempDir()
	empty := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, []byte("x"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "sweep", dir, "--block-sizes", "4Q"}, "unknown unit"},
		{[]string{"bench", "sweep", dir, "--queue-depths", "0"}, "positive integer"},
		{[]string{"bench", "sweep", dir, "--report", "x.txt"}, "FILE.html"},
		{[]string{"bench", "sweep", dir, "--duration", "0s"}, "--duration must be positive"},
		{[]string{"bench", "sweep", dir, "--runs", "0"}, "--runs"},
		{[]string{"bench", "sweep", dir, "--read", "--write"}, "none of the others"},
		{[]string{"bench", "sweep", file}, "is a file"},
		{[]string{"bench", "checkpoint", dir, "--size", "-1"}, "--size"},
		{[]string{"bench", "model-load", empty}, "no files to load"},
		{[]string{"bench", "model-load", dir, "--generate", "8"}, "COUNTxSIZE"},
		{[]string{"bench", "parallel-write", dir, "--procs", "0"}, "--procs"},
		{[]string{"bench", "parallel-write", "nosuch://x/y"}, "unknown scheme"},
	} {
		_, stderr, code := runBench(t, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("ffkit %s: exit %d, stderr %q; want exit 2 mentioning %q", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
	}
}

// TestBenchFioDir runs fio in another directory than the benchmark's (as
// for an ffkit:// path, whose device baseline is a local disk).
func TestBenchFioDir(t *testing.T) {
	if !bench.FioAvailable() {
		t.Skip("fio is not installed (scripts/setup.sh installs it)")
	}
	tmp := t.TempDir()
	dir, fioDir := filepath.Join(tmp, "bench"), filepath.Join(tmp, "fio")
	var doc sweepDoc
	runBenchJSON(t, &doc, "bench", "sweep", dir, "--fio-dir", fioDir, "--block-sizes", "64K", "--queue-depths", "2", "--threads", "1",
		"--size", "4M", "--duration", "40ms", "--warmup", "10ms", "--runs", "1", "--save-config", "")
	if len(doc.Points) != 1 || doc.Points[0].Fio == nil || doc.Points[0].Fio.MiBPerSec <= 0 || !strings.Contains(doc.FioNote, fioDir) {
		t.Fatalf("doc %+v", doc)
	}
	var ml modelLoadDoc
	runBenchJSON(t, &ml, "bench", "model-load", dir, "--fio-dir", fioDir, "--generate", "2x1M", "--runs", "1")
	if ml.Fio == nil || ml.Fio.MiBPerSec <= 0 {
		t.Fatalf("model-load fio: %+v %s", ml.Fio, ml.FioError)
	}
	for _, d := range []string{dir, fioDir} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", d, err)
		}
	}
	if _, stderr, code := runBench(t, "bench", "checkpoint", dir, "--fio-dir", "ffkit://127.0.0.1:1/x"); code != exitUsage || !strings.Contains(stderr, "local directory") {
		t.Errorf("--fio-dir URL: exit %d %s", code, stderr)
	}
}
