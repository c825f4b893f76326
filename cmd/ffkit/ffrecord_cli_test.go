package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/internal/testbin"
)

// CLI tests of pack, inspect, verify, cat and bench read: they run the
// built binary as a user does and check exit codes, stdout and --json.

func ffrBinary(t *testing.T) string {
	t.Helper()
	return testbin.Path(t)
}

type ffrResult struct {
	stdout, stderr []byte
	code           int
}

func ffr(t *testing.T, args ...string) ffrResult {
	t.Helper()
	cmd := exec.Command(ffrBinary(t), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return ffrResult{o.Bytes(), e.Bytes(), code}
}

func ffrMust(t *testing.T, code int, args ...string) ffrResult {
	t.Helper()
	r := ffr(t, args...)
	if r.code != code {
		t.Fatalf("ffkit %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	return r
}

const goldenFFR = "../../ffrecord/testdata/golden"

// smallSamples are the samples of the reference vector small.ffr.
func smallSamples() [][]byte {
	var out [][]byte
	for i := range 10 {
		out = append(out, bytes.Repeat([]byte(fmt.Sprintf("sample-%d", i)), i+1))
	}
	return out
}

func sha(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestCLIPackDirMatchesReference(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	// sorted relative paths: a0 ... a8, then sub/z (sample 9)
	for i, s := range smallSamples() {
		p := filepath.Join(src, fmt.Sprintf("a%d", i))
		if i == 9 {
			p = filepath.Join(src, "sub", "z")
		}
		os.WriteFile(p, s, 0o644)
	}
	out := filepath.Join(dir, "x.ffr")
	r := ffrMust(t, 0, "pack", src, "-o", out)
	if len(r.stderr) != 0 {
		t.Fatalf("stderr not empty without a terminal: %q", r.stderr)
	}
	if got := sha(t, out); got != "b4aea7cbe0c9a1b4358360e0f4b4f881ea35d430fcca2cae33c81ee85f47374b" {
		t.Fatalf("pack DIR -o X.ffr is not the reference's bytes: %s", got)
	}
	idx, _ := os.ReadFile(out + ".index.jsonl")
	lines := strings.Split(strings.TrimSpace(string(idx)), "\n")
	if len(lines) != 10 || !strings.Contains(lines[9], `"source":"sub/z"`) || !strings.Contains(lines[9], `"index":9`) {
		t.Fatalf("sidecar index:\n%s", idx)
	}
	// exists: refused; --force replaces
	ffrMust(t, 2, "pack", src, "-o", out)
	ffrMust(t, 0, "pack", src, "-o", out, "--force", "--workers", "1")
	if sha(t, out) != "b4aea7cbe0c9a1b4358360e0f4b4f881ea35d430fcca2cae33c81ee85f47374b" {
		t.Fatal("repacking changed the bytes")
	}
	// directory output, CSV index, same bytes on a second run
	ds := filepath.Join(dir, "ds")
	r = ffrMust(t, 0, "--json", "pack", src, "-o", ds, "--shard-size", "200", "--index-format", "csv")
	var res map[string]any
	if err := json.Unmarshal(r.stdout, &res); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if res["samples"].(float64) != 10 || len(res["files"].([]any)) < 2 {
		t.Fatalf("pack --json: %v", res)
	}
	first := sha(t, filepath.Join(ds, "PART_00001.ffr"))
	csv, _ := os.ReadFile(filepath.Join(ds, "index.csv"))
	if !strings.HasPrefix(string(csv), "index,file,local,source,size\n0,PART_00000.ffr,0,a0,8\n") {
		t.Fatalf("csv index:\n%s", csv)
	}
	ffrMust(t, 0, "pack", src, "-o", ds, "--shard-size", "200", "--force")
	if sha(t, filepath.Join(ds, "PART_00001.ffr")) != first {
		t.Fatal("same input, different bytes")
	}
	// shards start their data on a page boundary; --align 0 gives the reference layout
	part, _ := os.ReadFile(filepath.Join(ds, "PART_00000.ffr"))
	n := binary.LittleEndian.Uint64(part[4:])
	if off0 := binary.LittleEndian.Uint64(part[12+4*n:]); off0%4096 != 0 {
		t.Fatalf("shard data starts at %d", off0)
	}
	ds0 := filepath.Join(dir, "ds0")
	ffrMust(t, 0, "pack", src, "-o", ds0, "--align", "0")
	if sha(t, filepath.Join(ds0, "PART_00000.ffr")) != "b4aea7cbe0c9a1b4358360e0f4b4f881ea35d430fcca2cae33c81ee85f47374b" {
		t.Fatal("--align 0 shard of the same samples is not the reference's bytes")
	}
	// cat the whole dataset back
	r = ffrMust(t, 0, "cat", ds, "0:10")
	if !bytes.Equal(r.stdout, bytes.Join(smallSamples(), nil)) {
		t.Fatal("cat 0:10 differs from the source files")
	}
	// usage errors
	ffrMust(t, 2, "pack", src, "-o", filepath.Join(dir, "y.ffr"), "--shard-size", "1M")
	ffrMust(t, 2, "pack", src, "-o", filepath.Join(dir, "y.ffr"), "--format", "parquet")
	ffrMust(t, 2, "pack", src, "-o", filepath.Join(dir, "y.ffr"), "--format", "tar")
	ffrMust(t, 3, "pack", filepath.Join(dir, "missing"), "-o", filepath.Join(dir, "y.ffr"))
}

func TestCLIPackJSONLAndTar(t *testing.T) {
	dir := t.TempDir()
	jl := filepath.Join(dir, "in.jsonl")
	os.WriteFile(jl, []byte("{\"a\":1}\n\n{\"b\":2}\r\n{\"c\":3}"), 0o644)
	out := filepath.Join(dir, "j.ffr")
	ffrMust(t, 0, "pack", jl, "-o", out)
	r := ffrMust(t, 0, "--json", "inspect", out)
	var ins map[string]any
	json.Unmarshal(r.stdout, &ins)
	if ins["samples"].(float64) != 3 || ins["files"].(float64) != 1 || ins["bytes"] == nil {
		t.Fatalf("inspect --json: %s", r.stdout)
	}
	for i, want := range []string{`{"a":1}`, `{"b":2}`, `{"c":3}`} {
		if r := ffrMust(t, 0, "cat", out, fmt.Sprint(i)); string(r.stdout) != want {
			t.Fatalf("jsonl sample %d = %q, want %q", i, r.stdout, want)
		}
	}
	idx, _ := os.ReadFile(out + ".index.jsonl")
	if !strings.Contains(string(idx), `"source":"in.jsonl:3"`) {
		t.Fatalf("jsonl index names lines: %s", idx)
	}

	// a tar with a directory, a symlink and three regular members
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
	members := []string{"d/one", "two", "d/three"}
	for i, m := range members {
		body := bytes.Repeat([]byte{byte('a' + i)}, 700*(i+1))
		tw.WriteHeader(&tar.Header{Name: m, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		tw.Write(body)
		if i == 0 {
			tw.WriteHeader(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "two"})
		}
	}
	tw.Close()
	ta := filepath.Join(dir, "in.data") // no .tar suffix: auto detection sniffs the header
	os.WriteFile(ta, tb.Bytes(), 0o644)
	ds := filepath.Join(dir, "tards")
	ffrMust(t, 0, "pack", ta, "-o", ds)
	r = ffrMust(t, 0, "cat", ds, "2", "0")
	want := append(bytes.Repeat([]byte{'c'}, 2100), bytes.Repeat([]byte{'a'}, 700)...)
	if !bytes.Equal(r.stdout, want) {
		t.Fatalf("tar cat: %d bytes", len(r.stdout))
	}
	idx, _ = os.ReadFile(filepath.Join(ds, "index.jsonl"))
	if strings.Count(string(idx), "\n") != 3 || !strings.Contains(string(idx), `"source":"d/three"`) {
		t.Fatalf("tar index: %s", idx)
	}
	// an unknown format is a usage error
	junk := filepath.Join(dir, "junk.bin")
	os.WriteFile(junk, []byte{0, 1, 2, 3}, 0o644)
	ffrMust(t, 2, "pack", junk, "-o", filepath.Join(dir, "k.ffr"))
}

func copyGolden(t *testing.T, name string, edit func([]byte) []byte) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenFFR, name))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), filepath.Base(name))
	os.WriteFile(p, edit(b), 0o644)
	return p
}

func TestCLIVerify(t *testing.T) {
	keep := func(b []byte) []byte { return b }
	good := copyGolden(t, "small.ffr", keep)
	r := ffrMust(t, 0, "--json", "verify", good)
	var rep struct {
		OK      bool
		Checked int64
		Faults  []struct {
			Path  string
			Index int64
			Local int64
			Kind  string
		}
	}
	json.Unmarshal(r.stdout, &rep)
	if !rep.OK || rep.Checked != 10 {
		t.Fatalf("verify good: %s", r.stdout)
	}
	ffrMust(t, 0, "verify", filepath.Join(goldenFFR, "multi"), filepath.Join(goldenFFR, "empty-and-odd.ffr"))

	cases := []struct {
		name  string
		edit  func([]byte) []byte
		kind  string
		local int64
		text  string
	}{
		{"flipped header byte", func(b []byte) []byte { b[30] ^= 4; return b }, "header", -1, "header checksum mismatch"},
		{"flipped sample byte", func(b []byte) []byte { b[500] ^= 4; return b }, "checksum", 9, "sample 9"},
		{"truncated inside a sample", func(b []byte) []byte { return b[:200] }, "truncated", 3, "sample 3, bytes [180, 212)"},
		{"truncated inside the last sample", func(b []byte) []byte { return b[:571] }, "checksum", 9, "last sample"},
		{"garbage", func(b []byte) []byte { return []byte("not an ffrecord file at all, just text") }, "corrupt", -1, "impossible"},
		{"absurd n", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[4:], 1<<50); return b }, "corrupt", -1, "n = 1125899906842624"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := copyGolden(t, "small.ffr", c.edit)
			r := ffrMust(t, 1, "verify", p)
			if !strings.Contains(string(r.stdout), c.text) || !strings.Contains(string(r.stdout), p) || !strings.Contains(string(r.stdout), "FAILED") {
				t.Fatalf("verify output lacks %q:\n%s", c.text, r.stdout)
			}
			r = ffrMust(t, 1, "--json", "verify", p)
			rep.Faults = nil
			if err := json.Unmarshal(r.stdout, &rep); err != nil || rep.OK || len(rep.Faults) != 1 ||
				rep.Faults[0].Kind != c.kind || rep.Faults[0].Local != c.local {
				t.Fatalf("verify --json: %s", r.stdout)
			}
			// inspect and cat fail with exit 1 too where the damage is structural
			if c.kind != "checksum" {
				ffrMust(t, 1, "inspect", p)
			} else {
				ffrMust(t, 1, "cat", p, "9")
			}
		})
	}
	// Every bad sample is listed, not just the first.
	p := copyGolden(t, "small.ffr", func(b []byte) []byte { b[133] ^= 1; b[300] ^= 1; b[500] ^= 1; return b })
	r = ffrMust(t, 1, "--json", "verify", p)
	json.Unmarshal(r.stdout, &rep)
	if len(rep.Faults) != 3 || rep.Faults[0].Local != 0 || rep.Faults[1].Local != 6 || rep.Faults[2].Local != 9 {
		t.Fatalf("three bad samples: %s", r.stdout)
	}
	// A legacy file (header checksum 0) is good, with a warning.
	legacy := copyGolden(t, "small.ffr", func(b []byte) []byte { binary.LittleEndian.PutUint32(b, 0); return b })
	r = ffrMust(t, 0, "verify", legacy)
	if !strings.Contains(string(r.stderr), "legacy") {
		t.Fatalf("no legacy warning: %s", r.stderr)
	}
	ffrMust(t, 3, "verify", filepath.Join(t.TempDir(), "missing.ffr"))
	ffrMust(t, 2, "verify", good, "--workers", "0")
}

func TestCLICat(t *testing.T) {
	p := filepath.Join(goldenFFR, "small.ffr")
	s := smallSamples()
	r := ffrMust(t, 0, "cat", p, "3", "1:3", "3", ":1", "9:")
	want := bytes.Join([][]byte{s[3], s[1], s[2], s[3], s[0], s[9]}, nil)
	if !bytes.Equal(r.stdout, want) {
		t.Fatalf("cat: %q", r.stdout)
	}
	ffrMust(t, 2, "cat", p, "10")
	ffrMust(t, 2, "cat", p, "x")
	ffrMust(t, 2, "cat", p, "5:2")
	ffrMust(t, 2, "--json", "cat", p, "1")
	ffrMust(t, 2, "cat", p)
}

func TestCLIBenchRead(t *testing.T) {
	p := filepath.Join(goldenFFR, "empty-and-odd.ffr")
	r := ffrMust(t, 0, "--json", "bench", "read", p, "--duration", "200ms", "--warmup", "0s", "--batch-size", "16", "--parallelism", "4")
	var res map[string]any
	if err := json.Unmarshal(r.stdout, &res); err != nil {
		t.Fatalf("bench read --json: %v\n%s", err, r.stdout)
	}
	for _, k := range []string{"samples_per_s", "baseline_samples_per_s", "ratio", "batch_p50_ms", "batch_p99_ms"} {
		v, ok := res[k].(float64)
		if !ok || v <= 0 {
			t.Fatalf("bench read --json: %s = %v\n%s", k, res[k], r.stdout)
		}
	}
	ffrMust(t, 2, "bench", "read", p, "--batch-size", "0")
}
