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

// bench read --warm reads the files into the page cache before each phase
// and reports how many of ffkit's reads the page-cache path served and the
// CPU per sample of both rows; --warm with --direct is refused.
func TestCLIBenchReadWarm(t *testing.T) {
	ds := loadTestDataset(t, 2000, 500)
	stdout, stderr, code := runCLI(t, nil, "--json", "bench", "read", ds, "--warm", "--duration", "200ms", "--rounds", "1", "--warmup", "10ms")
	if code != 0 {
		t.Fatalf("bench read --warm: exit %d: %s", code, stderr)
	}
	var res benchReadResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if !res.Warm || !strings.HasPrefix(res.Cache, "warm (files read") || res.SamplesPerSec <= 0 || res.BaselineSamplesPerSec <= 0 {
		t.Fatalf("--warm: warm %v, cache %q, %.0f vs %.0f samples/s", res.Warm, res.Cache, res.SamplesPerSec, res.BaselineSamplesPerSec)
	}
	if (res.CachedReads <= 0 && os.Getenv("FFKIT_NO_NOWAIT") != "1") || res.CPUMicrosPerSample <= 0 || res.BaselineCPUMicrosPerSample <= 0 {
		t.Fatalf("--warm: %.2f of the reads served by the page cache, CPU %.2f / %.2f us per sample", res.CachedReads, res.CPUMicrosPerSample, res.BaselineCPUMicrosPerSample)
	}
	if _, stderr, code := runCLI(t, nil, "bench", "read", ds, "--warm", "--direct"); code != 2 || !strings.Contains(stderr, "contradict") {
		t.Fatalf("--warm --direct: exit %d: %s", code, stderr)
	}
	// The default baseline reads ffkit's batches; --baseline samples is
	// the one before it (random samples, one reused buffer per goroutine).
	if res.Baseline != "batches" {
		t.Fatalf("default baseline %q, want batches", res.Baseline)
	}
	stdout, stderr, code = runCLI(t, nil, "--json", "bench", "read", ds, "--warm", "--duration", "200ms", "--rounds", "1", "--warmup", "10ms", "--baseline", "samples")
	if code != 0 {
		t.Fatalf("bench read --baseline samples: exit %d: %s", code, stderr)
	}
	res = benchReadResult{}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if res.Baseline != "samples" || res.BaselineSamplesPerSec <= 0 {
		t.Fatalf("--baseline samples: baseline %q, %.0f samples/s", res.Baseline, res.BaselineSamplesPerSec)
	}
	if _, stderr, code := runCLI(t, nil, "bench", "read", ds, "--baseline", "both"); code != 2 || !strings.Contains(stderr, "--baseline") {
		t.Fatalf("--baseline both: exit %d: %s", code, stderr)
	}
}
