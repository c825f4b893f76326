package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Regression tests of issue 14: verify's counts and keys, and a damaged
// shard that no longer sinks inspect, cat and load --bad-samples skip.

// damagedDataset writes 400 samples in 4 files of 100 and damages two:
// PART_00001 is cut inside its sample 60 (samples 160..199 unreadable),
// PART_00002's header has a flipped byte (samples 200..299 unreadable).
func damagedDataset(t *testing.T) (dir string, parts []string) {
	t.Helper()
	dir = loadTestDataset(t, 400, 100)
	for i := 0; i < 4; i++ {
		parts = append(parts, filepath.Join(dir, fmt.Sprintf("PART_%05d.ffr", i)))
	}
	b, err := os.ReadFile(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	// Sample 60's offset is at 12 + 4*100 + 8*60; cut 3 bytes into it.
	off := int64(0)
	for k := 0; k < 8; k++ {
		off |= int64(b[12+400+8*60+k]) << (8 * k)
	}
	if err := os.WriteFile(parts[1], b[:off+3], 0o644); err != nil {
		t.Fatal(err)
	}
	b, err = os.ReadFile(parts[2])
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0xff // a CRC of the header
	if err := os.WriteFile(parts[2], b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, parts
}

func TestCLIVerifyCountsAfterHeaderFault(t *testing.T) {
	dir, parts := damagedDataset(t)
	stdout, _, code := runCLI(t, nil, "verify", dir)
	if code != 1 {
		t.Fatalf("verify: exit %d", code)
	}
	// 400 samples, of which 100+60+100 are good.
	if !strings.Contains(stdout, "260 of 400 samples verified good") {
		t.Fatalf("verify summary does not count the damaged header's samples:\n%s", stdout)
	}
	for _, line := range strings.Split(stdout, "\n") {
		if n := strings.Count(line, parts[2]); n > 1 {
			t.Fatalf("path printed %d times: %q", n, line)
		}
	}
	stdout, _, _ = runCLI(t, nil, "--json", "verify", dir)
	var rep struct {
		Samples int64 `json:"samples"`
		Checked int64 `json:"checked"`
		Files   []map[string]any
		Faults  []map[string]any `json:"faults"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || rep.Samples != 400 || rep.Checked != 260 {
		t.Fatalf("verify --json: %v\n%s", err, stdout)
	}
	// The same keys as inspect --json's per-file entries.
	istdout, _, _ := runCLI(t, nil, "--json", "inspect", dir)
	var ins struct {
		PerFile []map[string]any `json:"per_file"`
	}
	if err := json.Unmarshal([]byte(istdout), &ins); err != nil || len(ins.PerFile) != 4 {
		t.Fatalf("inspect --json: %v\n%s", err, istdout)
	}
	for _, k := range []string{"path", "samples", "bytes", "first", "legacy"} {
		if _, ok := rep.Files[0][k]; !ok {
			t.Errorf("verify --json files[] lacks %q: %v", k, rep.Files[0])
		}
		if _, ok := ins.PerFile[0][k]; !ok {
			t.Errorf("inspect --json per_file[] lacks %q: %v", k, ins.PerFile[0])
		}
		if k != "path" && fmt.Sprint(rep.Files[3][k]) != fmt.Sprint(ins.PerFile[3][k]) {
			t.Errorf("%q: verify says %v, inspect %v", k, rep.Files[3][k], ins.PerFile[3][k])
		}
	}
	// faults is [] for a healthy dataset, not null.
	good := loadTestDataset(t, 10, 10)
	stdout, _, code = runCLI(t, nil, "--json", "verify", good)
	if code != 0 || !strings.Contains(stdout, `"faults": []`) {
		t.Fatalf("verify --json of good data: exit %d\n%s", code, stdout)
	}
}

func TestCLIDamagedShard(t *testing.T) {
	dir, parts := damagedDataset(t)
	// inspect describes every healthy file and names the damaged ones.
	stdout, stderr, code := runCLI(t, nil, "inspect", dir)
	if code != 1 {
		t.Fatalf("inspect: exit %d, want 1: %s", code, stderr)
	}
	for i, p := range parts {
		if !strings.Contains(stdout, p) {
			t.Fatalf("inspect does not list %s:\n%s", p, stdout)
		}
		damaged := strings.Contains(stdout, "DAMAGED: "+p)
		if damaged != (i == 1 || i == 2) {
			t.Fatalf("inspect: %s damaged=%v:\n%s", p, damaged, stdout)
		}
	}
	if !strings.Contains(stdout, "60 of 100 samples readable") || !strings.Contains(stdout, "400 samples in 4 file(s)") {
		t.Fatalf("inspect:\n%s", stdout)
	}
	// cat of samples in healthy files works; a damaged one is named by
	// its global and local index.
	for _, i := range []int{0, 99, 159, 300, 399} {
		stdout, stderr, code := runCLI(t, nil, "cat", dir, fmt.Sprint(i))
		if code != 0 || !strings.HasPrefix(stdout, fmt.Sprintf("sample-%d-", i)) {
			t.Fatalf("cat %d: exit %d, %q: %s", i, code, stdout, stderr)
		}
	}
	for _, c := range []struct{ global, local int }{{170, 70}, {250, 50}} {
		_, stderr, code := runCLI(t, nil, "cat", dir, fmt.Sprint(c.global))
		want := fmt.Sprintf("sample %d (sample %d of the file)", c.global, c.local)
		if code != 1 || !strings.Contains(stderr, want) {
			t.Fatalf("cat %d: exit %d, want 1 naming %q: %s", c.global, code, want, stderr)
		}
	}
	// load --bad-samples skip: the epoch keeps its length and the ranks
	// their balance; the damaged samples are skipped and reported.
	var batches []int64
	for rank := 0; rank < 2; rank++ {
		r := runLoad(t, dir, "--bad-samples", "skip", "--batch-size", "16", "--world-size", "2", "--rank", fmt.Sprint(rank), "--json")
		if r.code != 0 {
			t.Fatalf("load --bad-samples skip rank %d: exit %d: %s", rank, r.code, r.stderr)
		}
		var s loadSummary
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatal(err)
		}
		if s.Samples != 400 || s.Delivered != 200 || s.Skipped == 0 {
			t.Fatalf("rank %d: %+v", rank, s)
		}
		if !strings.Contains(r.stderr, parts[1]) || !strings.Contains(r.stderr, parts[2]) || !strings.Contains(r.stderr, "damaged") {
			t.Fatalf("rank %d does not report the damaged files: %s", rank, r.stderr)
		}
		batches = append(batches, s.Batches)
	}
	if batches[0] != batches[1] {
		t.Fatalf("ranks got %v batches", batches)
	}
	// Without skip, a damaged file is still an error (exit 1).
	if r := runLoad(t, dir); r.code != 1 {
		t.Fatalf("load of a damaged dataset: exit %d: %s", r.code, r.stderr)
	}
}
