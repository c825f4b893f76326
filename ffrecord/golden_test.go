package ffrecord

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The reference vectors in testdata/golden were written by HFAiLab's
// FFRecord 1.4.0 (see testdata/golden/README.md); expected.json holds
// their ground truth.

type goldenFile struct {
	FileSize    int64    `json:"file_size"`
	N           int64    `json:"n"`
	HeaderCRC32 uint32   `json:"header_crc32"`
	HeaderLen   int64    `json:"header_len"`
	Lengths     []int64  `json:"lengths"`
	Offsets     []int64  `json:"offsets"`
	CRC32       []uint32 `json:"crc32"`
	SHA256      string   `json:"sha256"`
}

const goldenDir = "testdata/golden"

func loadGolden(t testing.TB) map[string]goldenFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]goldenFile
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m) != 5 {
		t.Fatalf("expected.json has %d files, want 5", len(m))
	}
	return m
}

// goldenSamples regenerates each vector's samples from the README's rules.
func goldenSamples(name string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		switch name {
		case "small.ffr":
			out[i] = bytes.Repeat([]byte(fmt.Sprintf("sample-%d", i)), i+1)
		case "empty-and-odd.ffr":
			l := []int{0, 1, 4095, 4096, 4097}[i]
			b := make([]byte, l)
			for j := range b {
				b[j] = byte((i*37 + j) % 251)
			}
			out[i] = b
		case "multi/PART_00000.ffr":
			out[i] = []byte(fmt.Sprintf("file0-sample%d", i))
		case "multi/PART_00002.ffr":
			out[i] = []byte(fmt.Sprintf("file2-sample%d", i))
		}
	}
	return out
}

func TestGoldenRead(t *testing.T) {
	ctx := context.Background()
	for name, g := range loadGolden(t) {
		for _, direct := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/direct=%v", name, direct), func(t *testing.T) {
				r, err := Open(ctx, []string{filepath.Join(goldenDir, name)}, ReadOptions{Direct: direct})
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				if r.N() != g.N {
					t.Fatalf("N = %d, want %d", r.N(), g.N)
				}
				fm := r.Files()[0]
				if fm.Size != g.FileSize || fm.HeaderCRC != g.HeaderCRC32 || fm.Legacy {
					t.Fatalf("file meta %+v, want size %d crc %d", fm, g.FileSize, g.HeaderCRC32)
				}
				want := goldenSamples(name, int(g.N))
				idx := make([]int64, g.N)
				for i := range idx {
					_, off, l, err := r.Locate(int64(i))
					if err != nil || off != g.Offsets[i] || l != g.Lengths[i] {
						t.Fatalf("Locate(%d) = %d, %d, %v; want %d, %d", i, off, l, err, g.Offsets[i], g.Lengths[i])
					}
					if Checksum(want[i]) != g.CRC32[i] {
						t.Fatalf("regenerated sample %d does not match expected.json", i)
					}
					idx[i] = int64(len(idx) - 1 - i) // reversed
				}
				got, err := r.ReadBatch(ctx, idx)
				if err != nil {
					t.Fatal(err)
				}
				for k, i := range idx {
					if !bytes.Equal(got[k], want[i]) {
						t.Fatalf("sample %d = %q, want %q", i, got[k], want[i])
					}
				}
				for i := range want {
					one, err := r.ReadOne(ctx, int64(i))
					if err != nil || !bytes.Equal(one, want[i]) {
						t.Fatalf("ReadOne(%d) = %q, %v", i, one, err)
					}
				}
			})
		}
	}
}

func TestGoldenDirectory(t *testing.T) {
	ctx := context.Background()
	r, err := Open(ctx, []string{filepath.Join(goldenDir, "multi")}, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.N() != 12 || len(r.Files()) != 3 {
		t.Fatalf("N = %d files = %d, want 12 and 3", r.N(), len(r.Files()))
	}
	var want [][]byte
	want = append(want, goldenSamples("multi/PART_00000.ffr", 7)...)
	want = append(want, goldenSamples("multi/PART_00002.ffr", 5)...)
	idx := []int64{11, 0, 7, 6, 6, 3, 11}
	got, err := r.ReadBatch(ctx, idx)
	if err != nil {
		t.Fatal(err)
	}
	for k, i := range idx {
		if !bytes.Equal(got[k], want[i]) {
			t.Fatalf("sample %d = %q, want %q", i, got[k], want[i])
		}
	}
	if f := r.Files(); f[2].First != 7 || f[1].N != 0 || f[1].First != 7 {
		t.Fatalf("files %+v", f)
	}
	// The same files listed one by one are the same dataset.
	r2, err := Open(ctx, []string{filepath.Join(goldenDir, "multi/PART_00000.ffr"),
		filepath.Join(goldenDir, "multi/PART_00001.ffr"), filepath.Join(goldenDir, "multi/PART_00002.ffr")}, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if !r.Fingerprint().Equal(r2.Fingerprint()) {
		t.Fatal("fingerprints differ")
	}
}

func TestGoldenWrite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for name, g := range loadGolden(t) {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, filepath.Base(name))
			w, err := Create(ctx, p, g.N)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range goldenSamples(name, int(g.N)) {
				if err := w.WriteOne(s); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(b)
			if hex.EncodeToString(sum[:]) != g.SHA256 {
				ref, _ := os.ReadFile(filepath.Join(goldenDir, name))
				t.Fatalf("sha256 %x, want %s (len %d vs %d, equal=%v)", sum, g.SHA256, len(b), len(ref), bytes.Equal(b, ref))
			}
		})
	}
}

// WriteFrom (the one-copy path pack uses) writes the reference's bytes too,
// and a source that ends early fails the file instead of publishing it.
func TestGoldenWriteFrom(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for name, g := range loadGolden(t) {
		p := filepath.Join(dir, filepath.Base(name))
		w, err := Create(ctx, p, g.N)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range goldenSamples(name, int(g.N)) {
			if err := w.WriteFrom(bytes.NewReader(s), int64(len(s))); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != g.SHA256 {
			t.Fatalf("%s: WriteFrom bytes differ from the reference", name)
		}
	}
	p := filepath.Join(dir, "short.ffr")
	w, _ := Create(ctx, p, 1)
	if err := w.WriteFrom(bytes.NewReader([]byte("abc")), 5); err == nil {
		t.Fatal("short source accepted")
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close after a failed WriteFrom succeeded")
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatal("a failed file was published")
	}
}

// Reserve with out-of-order fills writes the reference's bytes; sharded
// reservations give the same shards as plain writes.
func TestGoldenReserve(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for name, g := range loadGolden(t) {
		p := filepath.Join(dir, filepath.Base(name))
		w, err := Create(ctx, p, g.N)
		if err != nil {
			t.Fatal(err)
		}
		if !w.CanReserve() {
			t.Fatal("local files cannot reserve")
		}
		type fill struct {
			bufs [][]byte
			done func(uint32)
			data []byte
		}
		var fills []fill
		for _, s := range goldenSamples(name, int(g.N)) {
			bufs, done, err := w.Reserve(int64(len(s)))
			if err != nil {
				t.Fatal(err)
			}
			fills = append(fills, fill{bufs, done, s})
		}
		for k := len(fills) - 1; k >= 0; k-- { // last first
			f := fills[k]
			n := 0
			for _, b := range f.bufs {
				n += copy(b, f.data[n:])
			}
			f.done(Checksum(f.data))
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != g.SHA256 {
			t.Fatalf("%s: Reserve bytes differ from the reference", name)
		}
	}
	// sharded: reserve every sample, fill them from goroutines, compare with Write
	samples := goldenSamples("small.ffr", 10)
	sizes := make([]int64, len(samples))
	for i, s := range samples {
		sizes[i] = int64(len(s))
	}
	a, _ := NewShardedWriter(ctx, filepath.Join(dir, "a"), ShardOptions{TargetSize: 200, Sizes: sizes})
	bw, _ := NewShardedWriter(ctx, filepath.Join(dir, "b"), ShardOptions{TargetSize: 200, Sizes: sizes})
	done := make(chan struct{})
	count := 0
	for i, s := range samples {
		a.Write(s)
		bufs, fin, err := bw.Reserve(int64(len(s)))
		if err != nil {
			t.Fatal(err)
		}
		count++
		go func() {
			n := 0
			for _, b := range bufs {
				n += copy(b, samples[i][n:])
			}
			fin(Checksum(samples[i]))
			done <- struct{}{}
		}()
	}
	pa, err := a.Close()
	if err != nil {
		t.Fatal(err)
	}
	pb, err := bw.Close()
	if err != nil {
		t.Fatal(err)
	}
	for range count {
		<-done
	}
	if len(pa) != len(pb) || len(pa) < 2 {
		t.Fatalf("%d vs %d shards", len(pa), len(pb))
	}
	for i := range pa {
		x, _ := os.ReadFile(pa[i])
		y, _ := os.ReadFile(pb[i])
		if !bytes.Equal(x, y) {
			t.Fatalf("shard %d differs", i)
		}
	}
}
