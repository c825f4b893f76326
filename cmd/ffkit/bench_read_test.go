package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Regression test of issue 14: bench read writes --report FILE.html like
// the other benchmarks, and --fio reads the median sample size per
// request, so its reads/s compare with samples/s.
func TestCLIBenchReadReportAndFioBlockSize(t *testing.T) {
	ds := loadTestDataset(t, 2000, 500) // samples of 10..60 bytes
	report := filepath.Join(t.TempDir(), "read.html")
	args := []string{"--json", "bench", "read", ds, "--duration", "300ms", "--rounds", "1", "--warmup", "10ms", "--report", report}
	_, ferr := exec.LookPath("fio")
	if ferr == nil {
		args = append(args, "--fio")
	}
	stdout, stderr, code := runCLI(t, nil, args...)
	if code != 0 {
		t.Fatalf("bench read: exit %d: %s", code, stderr)
	}
	var res benchReadResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	page, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "ffkit ReadBatch", "plain pread", `id="data"`} {
		if !strings.Contains(string(page), want) {
			t.Fatalf("report lacks %q", want)
		}
	}
	if _, _, code := runCLI(t, nil, "bench", "read", ds, "--report", filepath.Join(t.TempDir(), "r.txt")); code != 2 {
		t.Fatalf("--report r.txt: exit %d, want 2", code)
	}
	if ferr != nil {
		t.Skip("no fio: the block size is not checked")
	}
	want := max((res.MedianSize+4095)/4096*4096, 4096)
	if res.FioIOPS <= 0 || res.FioBlockSize != want || res.FioMiBPerSec <= 0 {
		t.Fatalf("fio: block %d bytes (want %d for a median sample of %d), %.0f IOPS, %.1f MiB/s", res.FioBlockSize, want, res.MedianSize, res.FioIOPS, res.FioMiBPerSec)
	}
}
