package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/internal/testbin"

	"github.com/ffkit/ffkit/ffrecord"
)

// loadTestBinary builds the ffkit binary once for the CLI tests of `ffkit
// load` (they run the real program, as a user does).
func loadTestBinary(t *testing.T) string {
	t.Helper()
	return testbin.Path(t)
}

// loadTestDataset writes n samples into files of per samples; sample i
// holds its index in text.
func loadTestDataset(t *testing.T, n, per int) string {
	t.Helper()
	dir := t.TempDir()
	for f := 0; f*per < n; f++ {
		cnt := min(per, n-f*per)
		w, err := ffrecord.Create(context.Background(), filepath.Join(dir, fmt.Sprintf("PART_%05d.ffr", f)), int64(cnt))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < cnt; i++ {
			g := f*per + i
			if err := w.WriteOne([]byte(fmt.Sprintf("sample-%d-%s", g, strings.Repeat("z", g%50)))); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

type loadRun struct {
	stdout, stderr string
	code           int
}

func runLoad(t *testing.T, args ...string) loadRun {
	t.Helper()
	cmd := exec.Command(loadTestBinary(t), append([]string{"load"}, args...)...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := loadRun{stdout: so.String(), stderr: se.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// parseLoadIndices reads --print-indices output: one line per batch.
func parseLoadIndices(t *testing.T, out string) [][]int64 {
	t.Helper()
	var bs [][]int64
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		var b []int64
		for _, f := range strings.Split(line, " ") {
			v, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("--print-indices line %q is not indices separated by spaces", line)
			}
			b = append(b, v)
		}
		bs = append(bs, b)
	}
	return bs
}

func TestLoadCLIPrintIndices(t *testing.T) {
	ds := loadTestDataset(t, 103, 40)
	r := runLoad(t, ds, "--batch-size", "10", "--shuffle", "--seed", "4", "--print-indices")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	bs := parseLoadIndices(t, r.stdout)
	if len(bs) != 11 || len(bs[10]) != 3 {
		t.Fatalf("%d lines (last %d indices), want 11 batches with a short last one", len(bs), len(bs[len(bs)-1]))
	}
	var all []int64
	for _, b := range bs {
		all = append(all, b...)
	}
	sorted := append([]int64(nil), all...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	for i, v := range sorted {
		if v != int64(i) {
			t.Fatalf("epoch is not a permutation of 0..102: %v", sorted)
		}
	}
	if sort.SliceIsSorted(all, func(i, j int) bool { return all[i] < all[j] }) {
		t.Fatal("--shuffle gave index order")
	}
	// Same seed, same order; other worker settings, same order.
	r2 := runLoad(t, ds, "--batch-size", "10", "--shuffle", "--seed", "4", "--print-indices", "--workers", "1", "--prefetch", "1")
	if r2.stdout != r.stdout {
		t.Fatal("order depends on --workers/--prefetch")
	}
	r3 := runLoad(t, ds, "--batch-size", "10", "--shuffle", "--seed", "5", "--print-indices")
	if r3.stdout == r.stdout {
		t.Fatal("another seed gave the same order")
	}
	// Two epochs: the second is another permutation.
	r4 := runLoad(t, ds, "--batch-size", "10", "--shuffle", "--seed", "4", "--print-indices", "--epochs", "2")
	if !strings.HasPrefix(r4.stdout, r.stdout) || len(parseLoadIndices(t, r4.stdout)) != 22 || r4.stdout[len(r.stdout):] == r.stdout {
		t.Fatal("--epochs 2 does not continue with a new permutation")
	}
	// --start-epoch 1 is the second epoch on its own.
	r5 := runLoad(t, ds, "--batch-size", "10", "--shuffle", "--seed", "4", "--print-indices", "--start-epoch", "1")
	if r5.stdout != r4.stdout[len(r.stdout):] {
		t.Fatal("--start-epoch 1 differs from the second epoch of --epochs 2")
	}
}

func TestLoadCLIRanksAndDropLast(t *testing.T) {
	ds := loadTestDataset(t, 103, 50)
	count := map[int64]int{}
	var lines []int
	for r := 0; r < 4; r++ {
		out := runLoad(t, ds, "--batch-size", "8", "--shuffle", "--rank", strconv.Itoa(r), "--world-size", "4", "--print-indices")
		if out.code != 0 {
			t.Fatal(out.stderr)
		}
		bs := parseLoadIndices(t, out.stdout)
		lines = append(lines, len(bs))
		for _, b := range bs {
			for _, v := range b {
				count[v]++
			}
		}
	}
	if lines[0] != 4 || lines[1] != 4 || lines[2] != 4 || lines[3] != 4 {
		t.Fatalf("batches per rank %v, want 4 each (26 samples per rank)", lines)
	}
	extra := 0
	for i := int64(0); i < 103; i++ {
		if count[i] == 0 {
			t.Fatalf("sample %d on no rank", i)
		}
		extra += count[i] - 1
	}
	if extra != 1 {
		t.Fatalf("%d padded samples, want 1 (104-103)", extra)
	}
	out := runLoad(t, ds, "--batch-size", "8", "--rank", "1", "--world-size", "4", "--drop-last", "--print-indices")
	bs := parseLoadIndices(t, out.stdout)
	if len(bs) != 3 || len(bs[2]) != 8 {
		t.Fatalf("--drop-last: %d batches, want 3 full ones", len(bs))
	}
	if bad := runLoad(t, ds, "--rank", "4", "--world-size", "4"); bad.code != 2 || !strings.Contains(bad.stderr, "rank 4") {
		t.Fatalf("rank outside the world: exit %d, %s", bad.code, bad.stderr)
	}
}

func TestLoadCLISaveStateResumeElastic(t *testing.T) {
	ds := loadTestDataset(t, 500, 120)
	dir := t.TempDir()
	full := runLoad(t, ds, "--batch-size", "16", "--shuffle", "--seed", "9", "--epochs", "2", "--rank", "1", "--world-size", "3", "--print-indices")
	state := filepath.Join(dir, "state.json")
	first := runLoad(t, ds, "--batch-size", "16", "--shuffle", "--seed", "9", "--epochs", "2", "--rank", "1", "--world-size", "3",
		"--print-indices", "--save-state", state, "--stop-after-batches", "13")
	if first.code != 0 {
		t.Fatal(first.stderr)
	}
	if n := len(parseLoadIndices(t, first.stdout)); n != 13 {
		t.Fatalf("--stop-after-batches 13 printed %d batches", n)
	}
	// The state brings its seed and shuffle.
	rest := runLoad(t, ds, "--batch-size", "16", "--epochs", "2", "--rank", "1", "--world-size", "3",
		"--print-indices", "--resume", state)
	if rest.code != 0 {
		t.Fatal(rest.stderr)
	}
	if first.stdout+rest.stdout != full.stdout {
		t.Fatal("stop + resume differs from the uninterrupted run")
	}

	// Elastic: three ranks stop after 5 batches; rank 2's state resumes a
	// job of two ranks; together every sample of the epoch comes once.
	count := map[int64]int{}
	for r := 0; r < 3; r++ {
		st := filepath.Join(dir, fmt.Sprintf("s%d.json", r))
		out := runLoad(t, ds, "--batch-size", "16", "--shuffle", "--seed", "9", "--rank", strconv.Itoa(r), "--world-size", "3",
			"--print-indices", "--save-state", st, "--stop-after-batches", "5")
		for _, b := range parseLoadIndices(t, out.stdout) {
			for _, v := range b {
				count[v]++
			}
		}
	}
	for r := 0; r < 2; r++ {
		out := runLoad(t, ds, "--batch-size", "10", "--shuffle", "--seed", "9", "--rank", strconv.Itoa(r), "--world-size", "2",
			"--print-indices", "--resume", filepath.Join(dir, "s2.json"))
		if out.code != 0 {
			t.Fatal(out.stderr)
		}
		for _, b := range parseLoadIndices(t, out.stdout) {
			for _, v := range b {
				count[v]++
			}
		}
	}
	// 500 - 240 = 260 remain, even: no padding.
	for i := int64(0); i < 500; i++ {
		if count[i] != 1 {
			t.Fatalf("sample %d delivered %d times across the elastic resume", i, count[i])
		}
	}

	// Another dataset refuses the state (usage error, exit 2).
	other := loadTestDataset(t, 501, 120)
	bad := runLoad(t, other, "--batch-size", "16", "--shuffle", "--seed", "9", "--resume", state)
	if bad.code != 2 || !strings.Contains(bad.stderr, "other data") {
		t.Fatalf("resume on another dataset: exit %d, %s", bad.code, bad.stderr)
	}
	// ... and so is another seed given explicitly.
	seed := runLoad(t, ds, "--batch-size", "16", "--shuffle", "--seed", "10", "--resume", state)
	if seed.code != 2 || !strings.Contains(seed.stderr, "seed 9") {
		t.Fatalf("resume with another seed: exit %d, %s", seed.code, seed.stderr)
	}
}

func TestLoadCLISummaryJSON(t *testing.T) {
	ds := loadTestDataset(t, 300, 100)
	r := runLoad(t, ds, "--batch-size", "32", "--shuffle", "--epochs", "3", "--json")
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	var s map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("--json output is not one JSON document: %v\n%s", err, r.stdout)
	}
	if v, ok := s["samples_per_s"].(float64); !ok || v <= 0 {
		t.Fatalf("samples_per_s = %v", s["samples_per_s"])
	}
	if s["delivered_samples"].(float64) != 900 || s["batches"].(float64) != 30 {
		t.Fatalf("summary %v", s)
	}
	h := runLoad(t, ds, "--batch-size", "32")
	if !strings.Contains(h.stdout, "samples/s") || !strings.Contains(h.stdout, "MiB/s") || !strings.Contains(h.stdout, "consumer waited") {
		t.Fatalf("human summary:\n%s", h.stdout)
	}
	// A corrupt sample: exit 1 naming file and sample.
	path := filepath.Join(ds, "PART_00001.ffr")
	raw, _ := os.ReadFile(path)
	raw[len(raw)-5] ^= 0xff
	os.WriteFile(path, raw, 0o644)
	c := runLoad(t, ds, "--batch-size", "32")
	if c.code != 1 || !strings.Contains(c.stderr, "PART_00001.ffr") || !strings.Contains(c.stderr, "sample 199") {
		t.Fatalf("corrupt sample: exit %d, %s", c.code, c.stderr)
	}
	sk := runLoad(t, ds, "--batch-size", "32", "--bad-samples", "skip", "--json")
	if sk.code != 0 || !strings.Contains(sk.stderr, "skipping bad sample 199") {
		t.Fatalf("--bad-samples skip: exit %d, %s", sk.code, sk.stderr)
	}
	if missing := runLoad(t, filepath.Join(ds, "nope")); missing.code != 3 {
		t.Fatalf("missing path: exit %d, %s", missing.code, missing.stderr)
	}
}

func TestLoadCLIIOConfigAndMixture(t *testing.T) {
	a := loadTestDataset(t, 100, 100)
	b := loadTestDataset(t, 300, 100)
	cfg := filepath.Join(t.TempDir(), "io.json")
	os.WriteFile(cfg, []byte(`{"version":1,"mode":"read","block_size":4096,"queue_depth":4,"threads":2,"direct":false,"mib_s":1,"iops":1,"measured_at":"2026-11-30T00:00:00Z"}`), 0o644)
	r := runLoad(t, a, "--io-config", cfg, "--json")
	var s map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil || s["workers"].(float64) != 8 {
		t.Fatalf("--io-config: workers %v (%v) %s", s["workers"], err, r.stderr)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"version":99}`), 0o644)
	if r := runLoad(t, a, "--io-config", bad); r.code == 0 {
		t.Fatal("a bad --io-config was accepted")
	}
	m := runLoad(t, a, b, "--weights", "1,3", "--mixture-epoch", "200", "--shuffle", "--batch-size", "20", "--print-indices")
	if m.code != 0 {
		t.Fatal(m.stderr)
	}
	per := [2]int{}
	for _, line := range strings.Split(strings.TrimSpace(m.stdout), "\n") {
		for _, f := range strings.Fields(line) {
			src, _, _ := strings.Cut(f, ":")
			n, _ := strconv.Atoi(src)
			per[n]++
		}
	}
	if per != [2]int{50, 150} {
		t.Fatalf("mixture 1:3 of 200 gave %v", per)
	}
}

// --direct takes on, off or auto (alone it means on); the summary says
// what was chosen and why.
func TestLoadCLIDirect(t *testing.T) {
	ds := loadTestDataset(t, 200, 100)
	for _, c := range []struct {
		flag, prefix string
		direct       bool
	}{
		{"--direct=auto", "buffered (auto: ", false},
		{"--direct", "direct (on: ", true},
		{"--direct=on", "direct (on: ", true},
		{"--direct=off", "buffered (off: ", false},
	} {
		r := runLoad(t, ds, "--batch-size", "32", c.flag, "--json")
		if r.code != 0 {
			t.Fatalf("%s: exit %d: %s", c.flag, r.code, r.stderr)
		}
		var s loadSummary
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("%s: %v\n%s", c.flag, err, r.stdout)
		}
		if !strings.HasPrefix(s.DirectChoice, c.prefix) || s.Direct != c.direct || s.Delivered != 200 {
			t.Fatalf("%s: direct %v, direct_choice %q, %d samples", c.flag, s.Direct, s.DirectChoice, s.Delivered)
		}
	}
	if r := runLoad(t, ds, "--direct=sometimes"); r.code != 2 || !strings.Contains(r.stderr, "on, off or auto") {
		t.Fatalf("--direct=sometimes: exit %d, %s", r.code, r.stderr)
	}
}
