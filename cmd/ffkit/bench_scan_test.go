package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// bench scan on a small input: both engines produce the same row counts,
// the separate repartition input has the requested size, and bad flags
// are usage errors (exit 2). Times are not asserted.
func TestBenchScanCLI(t *testing.T) {
	buildScanBin(t)
	dir := filepath.Join(t.TempDir(), "new", "sub") // created if missing
	stdout, stderr, code := scanCLI(t, "bench", "scan", "--rows", "30000", "--runs", "1", "--only", "filter,repartition",
		"--repartition-size", "2M", "--partitions", "4", "--dir", dir, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Results []struct {
			Name     string `json:"name"`
			FFkit    int64  `json:"ffkit_rows_out"`
			Baseline int64  `json:"baseline_rows_out"`
		} `json:"results"`
		RepartitionBytes int64   `json:"repartition_input_uncompressed_bytes"`
		RepartitionRows  int64   `json:"repartition_input_rows"`
		PerCore          float64 `json:"repartition_mib_s_per_core"`
		GraySort         float64 `json:"smallpond_graysort_mib_s_per_core"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if len(res.Results) != 2 || res.Results[0].Name != "filter+project" || !strings.HasPrefix(res.Results[1].Name, "hash repartition") {
		t.Fatalf("measurements: %+v", res.Results)
	}
	for _, r := range res.Results {
		if r.FFkit != r.Baseline || r.FFkit == 0 {
			t.Fatalf("%s: ffkit %d rows out, DuckDB %d", r.Name, r.FFkit, r.Baseline)
		}
	}
	if res.Results[1].FFkit != res.RepartitionRows || res.RepartitionBytes < 1<<20 || res.RepartitionBytes > 4<<20 {
		t.Fatalf("repartition input: %d rows, %d bytes (want ~2 MiB); %d rows out", res.RepartitionRows, res.RepartitionBytes, res.Results[1].FFkit)
	}
	if res.PerCore <= 0 || res.GraySort < 6 || res.GraySort > 7 {
		t.Fatalf("per-core figures: ffkit %v, GraySort %v", res.PerCore, res.GraySort)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "q5*")); len(m) != 0 {
		t.Fatalf("repartition outputs left behind: %v", m)
	}
	for _, args := range [][]string{
		{"bench", "scan", "--rows", "1000", "--only", "bogus", "--dir", dir},
		{"bench", "scan", "--rows", "1000", "--repartition-size", "lots", "--dir", dir},
	} {
		if _, stderr, code := scanCLI(t, args...); code != 2 {
			t.Fatalf("%v: exit %d, want 2: %s", args, code, stderr)
		}
	}
}
