package ffrecord

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/ffkit/ffkit/internal/errkind"
)

func randSamples(rng *rand.Rand, n int, maxLen int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		l := rng.IntN(maxLen + 1)
		if rng.IntN(10) == 0 {
			l = 0
		}
		b := make([]byte, l)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		out[i] = b
	}
	return out
}

func writeFile(t testing.TB, p string, samples [][]byte) {
	t.Helper()
	w, err := Create(context.Background(), p, int64(len(samples)))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if err := w.WriteOne(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func checkBatch(t *testing.T, r *Reader, all [][]byte, idx []int64, opts string) {
	t.Helper()
	got, err := r.ReadBatch(context.Background(), idx)
	if err != nil {
		t.Fatalf("%s: ReadBatch: %v", opts, err)
	}
	for k, i := range idx {
		if !bytes.Equal(got[k], all[i]) {
			t.Fatalf("%s: request %d (sample %d): %d bytes, want %d", opts, k, i, len(got[k]), len(all[i]))
		}
	}
}

// Property: random samples written as one file and as shards (buffered and
// streaming) read back equal through every read path.
func TestProperty(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 7))
		dir := t.TempDir()
		samples := randSamples(rng, 1+rng.IntN(300), []int{16, 5000, 70000}[seed%3])
		single := filepath.Join(dir, "one.ffr")
		writeFile(t, single, samples)

		target := int64(8 << 10)
		sw, err := NewShardedWriter(ctx, filepath.Join(dir, "buffered"), ShardOptions{TargetSize: target})
		if err != nil {
			t.Fatal(err)
		}
		sizes := make([]int64, len(samples))
		for i, s := range samples {
			sizes[i] = int64(len(s))
			if err := sw.Write(s); err != nil {
				t.Fatal(err)
			}
		}
		p1, err := sw.Close()
		if err != nil {
			t.Fatal(err)
		}
		sw2, err := NewShardedWriter(ctx, filepath.Join(dir, "streamed"), ShardOptions{TargetSize: target, Sizes: sizes})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range samples {
			if err := sw2.Write(s); err != nil {
				t.Fatal(err)
			}
		}
		p2, err := sw2.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(p1) != len(p2) || len(p1) != len(PlanShards(sizes, target, 0)) {
			t.Fatalf("shards: %d buffered, %d streamed, plan %d", len(p1), len(p2), len(PlanShards(sizes, target, 0)))
		}
		for i := range p1 {
			a, _ := os.ReadFile(p1[i])
			b, _ := os.ReadFile(p2[i])
			if !bytes.Equal(a, b) {
				t.Fatalf("shard %d differs between buffered and streamed writers", i)
			}
			if int64(len(a)) > target && HeaderLen(1)+int64(len(a)) > target {
				if r, err := Open(ctx, []string{p1[i]}, ReadOptions{}); err != nil || r.N() != 1 {
					t.Fatalf("shard %d is %d bytes over target with more than one sample", i, len(a))
				}
			}
		}
		for _, paths := range [][]string{{single}, {filepath.Join(dir, "buffered")}, {filepath.Join(dir, "streamed")}} {
			for _, o := range []ReadOptions{{}, {Direct: true}, {MergeGap: -1}, {MergeGap: 1 << 20, Parallelism: 3}, {Direct: true, MergeGap: -1}, {NoVerify: true}} {
				r, err := Open(ctx, paths, o)
				if err != nil {
					t.Fatal(err)
				}
				if r.N() != int64(len(samples)) {
					t.Fatalf("N = %d, want %d", r.N(), len(samples))
				}
				name := paths[0] + " " + fmtOpts(o)
				for range 5 {
					idx := make([]int64, rng.IntN(100))
					for k := range idx {
						idx[k] = rng.Int64N(r.N())
						if k > 0 && rng.IntN(4) == 0 {
							idx[k] = idx[k-1] + 1 // neighbours, to merge
							if idx[k] >= r.N() {
								idx[k] = 0
							}
						}
						if k > 0 && rng.IntN(8) == 0 {
							idx[k] = idx[rng.IntN(k)] // duplicates
						}
					}
					checkBatch(t, r, samples, idx, name)
				}
				all := make([]int64, r.N())
				for i := range all {
					all[i] = int64(i)
				}
				checkBatch(t, r, samples, all, name)
				// ReadBatchInto: subslices of the caller's buffer.
				size, _ := r.BatchSize(all)
				buf := make([]byte, size+10)
				got, err := r.ReadBatchInto(ctx, all, buf)
				if err != nil {
					t.Fatal(err)
				}
				for i, g := range got {
					if !bytes.Equal(g, samples[i]) || (len(g) > 0 && offsetIn(buf, g) < 0) {
						t.Fatalf("ReadBatchInto sample %d wrong", i)
					}
				}
				if _, err := r.ReadBatchInto(ctx, all, buf[:size-1]); size > 0 && !errors.Is(err, ErrIndex) {
					t.Fatalf("short buffer: %v", err)
				}
				r.Close()
			}
		}
	}
}

func fmtOpts(o ReadOptions) string {
	var b strings.Builder
	if o.Direct {
		b.WriteString("direct ")
	}
	if o.NoVerify {
		b.WriteString("noverify ")
	}
	if o.MergeGap != 0 {
		b.WriteString("gap ")
	}
	return b.String()
}

// offsetIn returns where sub starts inside buf (sub must be a subslice).
func offsetIn(buf, sub []byte) int64 {
	b, p := uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&sub[:1][0]))
	if p < b || p >= b+uintptr(len(buf)) {
		return -1
	}
	return int64(p - b)
}

func TestIndexErrors(t *testing.T) {
	ctx := context.Background()
	r, err := Open(ctx, []string{filepath.Join(goldenDir, "small.ffr")}, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, i := range []int64{-1, 10, 1 << 60} {
		_, err := r.ReadOne(ctx, i)
		if !errors.Is(err, ErrIndex) || errkind.Of(err) != errkind.Usage {
			t.Fatalf("ReadOne(%d): %v", i, err)
		}
	}
	if _, err := Open(ctx, nil, ReadOptions{}); !errors.Is(err, ErrNoFiles) {
		t.Fatalf("no paths: %v", err)
	}
	if _, err := Open(ctx, []string{t.TempDir()}, ReadOptions{}); !errors.Is(err, ErrNoFiles) {
		t.Fatalf("empty dir: %v", err)
	}
	if _, err := Open(ctx, []string{"/nonexistent/x.ffr"}, ReadOptions{}); errkind.Of(err) != errkind.Unavailable {
		t.Fatalf("missing file: %v (kind %v)", err, errkind.Of(err))
	}
}

func TestWriterCountMismatch(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "x.ffr")
	w, err := Create(ctx, p, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteOne([]byte("a"))
	if err := w.Close(); !errors.Is(err, ErrIndex) {
		t.Fatalf("Close with 1 of 3: %v", err)
	}
	w, _ = Create(ctx, p, 1)
	w.WriteOne([]byte("a"))
	if err := w.WriteOne([]byte("b")); !errors.Is(err, ErrIndex) {
		t.Fatalf("second of 1: %v", err)
	}
	w.Close()
	w, _ = Create(ctx, p, 1)
	w.WriteOne([]byte("a"))
	w.Abort()
	// Nothing was ever published, and no temporary file is left behind.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}

// A sharded writer that dies before Close publishes nothing that opens.
func TestShardedWriterCrashLeavesNoDataset(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "ds")
	w, err := NewShardedWriter(ctx, dir, ShardOptions{TargetSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := w.Write(bytes.Repeat([]byte{byte(i)}, 50)); err != nil {
			t.Fatal(err)
		}
	}
	// shards were written (staged) but Close never ran: nothing at dir
	if _, err := Open(ctx, []string{dir}, ReadOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open before Close: %v", err)
	}
	w.Abort()
	ents, _ := os.ReadDir(filepath.Dir(dir))
	if len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
	// Refuses a directory with a dataset, unless told to overwrite.
	w, _ = NewShardedWriter(ctx, dir, ShardOptions{})
	w.Write([]byte("x"))
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := NewShardedWriter(ctx, dir, ShardOptions{}); err == nil {
		t.Fatal("second writer into a dataset directory accepted")
	}
	// Overwrite with fewer shards removes the stale ones.
	os.WriteFile(filepath.Join(dir, "PART_00007.ffr"), []byte("stale"), 0o644)
	w, _ = NewShardedWriter(ctx, dir, ShardOptions{Overwrite: true})
	w.Write([]byte("y"))
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := Open(ctx, []string{dir}, ReadOptions{})
	if err != nil || r.N() != 1 || len(r.Files()) != 1 {
		t.Fatalf("after overwrite: %v", err)
	}
	r.Close()
}

func TestEmptyDatasetShard(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "ds")
	w, _ := NewShardedWriter(ctx, dir, ShardOptions{})
	paths, err := w.Close()
	if err != nil || len(paths) != 1 {
		t.Fatal(paths, err)
	}
	r, err := Open(ctx, []string{dir}, ReadOptions{})
	if err != nil || r.N() != 0 {
		t.Fatal(err)
	}
	got, err := r.ReadBatch(ctx, nil)
	if err != nil || len(got) != 0 {
		t.Fatal(got, err)
	}
}

func TestLegacyHeader(t *testing.T) {
	ctx := context.Background()
	b, _ := os.ReadFile(filepath.Join(goldenDir, "small.ffr"))
	binary.LittleEndian.PutUint32(b[0:4], 0)
	p := filepath.Join(t.TempDir(), "legacy.ffr")
	os.WriteFile(p, b, 0o644)
	var warned []string
	r, err := Open(ctx, []string{p}, ReadOptions{Warn: func(m string) { warned = append(warned, m) }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(warned) != 1 || !strings.Contains(warned[0], "legacy") || !r.Files()[0].Legacy {
		t.Fatalf("warnings %q", warned)
	}
	if s, err := r.ReadOne(ctx, 3); err != nil || string(s) != strings.Repeat("sample-3", 4) {
		t.Fatal(s, err)
	}
	rep, err := Verify(ctx, []string{p}, VerifyOptions{})
	if err != nil || !rep.OK || !rep.Files[0].Legacy {
		t.Fatalf("verify legacy: %+v %v", rep, err)
	}
}

// Aligned files: the data starts on a page boundary, every FFRecord reader
// reads them, and page-sized samples are each one aligned read.
func TestAlignedWriter(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(9, 9))
	samples := make([][]byte, 37)
	for i := range samples {
		samples[i] = make([]byte, 4096)
		for j := range samples[i] {
			samples[i][j] = byte(rng.Uint32())
		}
	}
	p := filepath.Join(dir, "a.ffr")
	w, err := CreateWith(ctx, p, int64(len(samples)), WriterOptions{Align: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		w.WriteOne(s)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, direct := range []bool{false, true} {
		r, err := Open(ctx, []string{p}, ReadOptions{Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		for i := range r.N() {
			_, off, _, _ := r.Locate(i)
			if off%4096 != 0 {
				t.Fatalf("sample %d at %d, not aligned", i, off)
			}
		}
		checkBatch(t, r, samples, []int64{36, 0, 5, 6, 7, 5}, "aligned")
		// Into a caller's buffer: page-aligned (O_DIRECT reads land in it
		// directly) and one byte off (they go through scratch); neighbours,
		// duplicates and the last sample, both ways the same bytes.
		idx := []int64{36, 0, 5, 6, 7, 5, 20, 19}
		need, _ := r.BatchSize(idx)
		slab := alignedBuffer(need + directAlign)
		for _, off := range []int64{0, 1} {
			buf := slab[off : off+need]
			clear(buf)
			got, err := r.ReadBatchInto(ctx, idx, buf)
			if err != nil {
				t.Fatalf("direct=%v: ReadBatchInto: %v", direct, err)
			}
			for k, i := range idx {
				if !bytes.Equal(got[k], samples[i]) {
					t.Fatalf("direct=%v, buffer offset %d: request %d (sample %d) differs", direct, off, k, i)
				}
			}
		}
		r.Close()
	}
	if _, err := CreateWith(ctx, p, 1, WriterOptions{Align: 3000}); !errors.Is(err, ErrIndex) {
		t.Fatalf("alignment 3000: %v", err)
	}
	// sharded, aligned: every shard's data starts on a page
	sw, _ := NewShardedWriter(ctx, filepath.Join(dir, "ds"), ShardOptions{TargetSize: 20000, Align: 4096})
	for _, s := range samples {
		sw.Write(s)
	}
	paths, err := sw.Close()
	if err != nil || len(paths) < 2 {
		t.Fatal(paths, err)
	}
	r, err := Open(ctx, []string{filepath.Join(dir, "ds")}, ReadOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range r.N() {
		if _, off, _, _ := r.Locate(i); off%4096 != 0 {
			t.Fatalf("sharded sample %d at %d", i, off)
		}
	}
	checkBatch(t, r, samples, []int64{0, 36, 20, 1}, "aligned shards")
}

// A file that shrinks after Open fails the read with ErrTruncated naming the sample.
func TestFileShrinksAfterOpen(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "s.ffr")
	b, _ := os.ReadFile(filepath.Join(goldenDir, "small.ffr"))
	os.WriteFile(p, b, 0o644)
	for _, direct := range []bool{false, true} {
		os.WriteFile(p, b, 0o644)
		r, err := Open(ctx, []string{p}, ReadOptions{Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		os.Truncate(p, 400) // inside sample 7 [356, 420)
		_, err = r.ReadBatch(ctx, []int64{2, 8})
		if !errors.Is(err, ErrTruncated) || errkind.Of(err) != errkind.Data {
			t.Fatalf("direct=%v: %v", direct, err)
		}
		var se *SampleError
		if !errors.As(err, &se) || se.Index != 8 {
			t.Fatalf("direct=%v: sample error %+v", direct, se)
		}
		r.Close()
	}
}

// A header larger than the read chunk is decoded across chunk boundaries
// (fields straddling them), and still validated.
func TestLargeHeader(t *testing.T) {
	ctx := context.Background()
	const n = 100000 // header 1.2 MB: several reads, an offset field split across two
	p := filepath.Join(t.TempDir(), "big.ffr")
	w, err := Create(ctx, p, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		w.WriteOne([]byte{byte(i), byte(i >> 8), byte(i >> 16)}[:i%4])
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := Open(ctx, []string{p}, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.N() != n || HeaderLen(n) <= headerChunk {
		t.Fatalf("N = %d", r.N())
	}
	idx := []int64{0, 1, 2, 3, 81069, 81070, 81071, 87380, 87381, 99999}
	got, err := r.ReadBatch(ctx, idx)
	if err != nil {
		t.Fatal(err)
	}
	for k, i := range idx {
		want := []byte{byte(i), byte(i >> 8), byte(i >> 16)}[:i%4]
		if !bytes.Equal(got[k], want) {
			t.Fatalf("sample %d = %v, want %v", i, got[k], want)
		}
	}
	// every offset decoded: the whole dataset verifies
	rep, err := Verify(ctx, []string{p}, VerifyOptions{})
	if err != nil || !rep.OK || rep.Checked != n {
		t.Fatalf("verify: %v %+v", err, rep.Faults)
	}
	// a flipped byte deep in the header (second chunk) fails the header checksum
	b, _ := os.ReadFile(p)
	b[headerChunk+100] ^= 1
	os.WriteFile(p, b, 0o644)
	if _, err := Open(ctx, []string{p}, ReadOptions{}); !errors.Is(err, ErrChecksum) {
		t.Fatalf("flipped byte in the second header chunk: %v", err)
	}
}
