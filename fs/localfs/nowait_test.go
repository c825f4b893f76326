package localfs

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

// evict drops the file's pages from the page cache, or skips the test
// where this file system keeps them (tmpfs).
func evict(t *testing.T, l *FS, p string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unix.Fdatasync(int(f.Fd()))
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Skipf("fadvise: %v", err)
	}
	if c, _, err := l.CachedBytes(context.Background(), p); err != nil || c > 0 {
		t.Skipf("cannot evict %s here (%d bytes stay cached, %v)", p, c, err)
	}
}

// Reads of cached bytes are served by the RWF_NOWAIT probe, without the
// ring; reads of evicted bytes go past it to the ring or preads; every
// read returns the file's bytes, whole or in part cached, and a read past
// the end still fails with ErrShortRead.
func TestReadBatchNowait(t *testing.T) {
	if noNowaitEnv {
		t.Skip("FFKIT_NO_NOWAIT=1")
	}
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "data")
	data := make([]byte, 4<<20)
	rng := rand.New(rand.NewPCG(9, 10))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	l := New()
	f, err := l.Open(ctx, p, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	batch := func(n int) []fs.ReadRequest {
		reqs := make([]fs.ReadRequest, n)
		for i := range reqs {
			off := rng.Int64N(int64(len(data)) - 70000)
			reqs[i] = fs.ReadRequest{File: f, Off: off, Buf: make([]byte, 1+rng.IntN(70000))}
		}
		return reqs
	}
	check := func(what string, reqs []fs.ReadRequest) {
		t.Helper()
		for i, q := range reqs {
			if !bytes.Equal(q.Buf, data[q.Off:q.Off+int64(len(q.Buf))]) {
				t.Fatalf("%s: request %d [%d, +%d) differs", what, i, q.Off, len(q.Buf))
			}
		}
	}

	// Warm (just written, then read once whole): every read is a hit.
	if _, err := f.ReadAt(make([]byte, len(data)), 0); err != nil {
		t.Fatal(err)
	}
	if c, _, err := l.CachedBytes(ctx, p); err != nil || c != int64(len(data)) {
		t.Fatalf("CachedBytes of a file just read whole: %d of %d (%v)", c, len(data), err)
	}
	h0, _, m0 := ReadCounts()
	reqs := batch(64)
	if err := l.ReadBatchN(ctx, reqs, 16); err != nil {
		t.Fatal(err)
	}
	check("warm", reqs)
	h1, _, m1 := ReadCounts()
	if nowaitOff.Load() {
		t.Skip("this kernel refuses RWF_NOWAIT on buffered reads")
	}
	if h1-h0 != 64 || m1 != m0 {
		t.Fatalf("warm batch of 64: %d served from the cache, %d probes missed; want 64 and 0", h1-h0, m1-m0)
	}

	// Cold: the probe misses, gives up after a few, and the reads still land.
	evict(t, l, p)
	reqs = batch(64)
	if err := l.ReadBatchN(ctx, reqs, 16); err != nil {
		t.Fatal(err)
	}
	check("cold", reqs)
	h2, _, m2 := ReadCounts()
	if m2-m1 < 1 || m2-m1 > probeGiveUp+(h2-h1) {
		t.Fatalf("cold batch: %d probes missed, %d hit; want between 1 and %d+hits", m2-m1, h2-h1, probeGiveUp)
	}

	// Half cached: the first 8 KiB of a 16 KiB range is read first, so
	// the probe serves it and the rest goes on as a shorter request.
	evict(t, l, p)
	off := int64(1 << 20)
	if _, err := f.ReadAt(make([]byte, 8192), off); err != nil {
		t.Fatal(err)
	}
	reqs = []fs.ReadRequest{{File: f, Off: off, Buf: make([]byte, 16384)}}
	_, b0, _ := ReadCounts()
	if err := l.ReadBatchN(ctx, reqs, 4); err != nil {
		t.Fatal(err)
	}
	check("half cached", reqs)
	if _, b1, _ := ReadCounts(); b1-b0 < 8192 {
		t.Fatalf("half-cached read: %d bytes served from the cache, want at least 8192", b1-b0)
	}

	// Past the end: ErrShortRead, as without the probe.
	bad := []fs.ReadRequest{{File: f, Off: int64(len(data)) - 5, Buf: make([]byte, 10)}}
	if err := l.ReadBatchN(ctx, bad, 4); !errors.Is(err, fs.ErrShortRead) {
		t.Fatalf("read past the end: %v", err)
	}
}

// Cached reads of a mapped file are copies from the mapping (no system
// call); a file cut shorter after the look fails with ErrShortRead instead
// of crashing the process with SIGBUS; Close unmaps.
func TestReadBatchMapped(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "data")
	data := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	l := &FS{Parallelism: 16, NoNowait: true, Mmap: true} // mapped copies only
	f, err := l.Open(ctx, p, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lf := f.(*File)
	if _, err := f.ReadAt(make([]byte, len(data)), 0); err != nil {
		t.Fatal(err)
	}
	m0 := MappedReads()
	reqs := make([]fs.ReadRequest, 100)
	for i := range reqs {
		off := rng.Int64N(int64(len(data)) - 20000)
		reqs[i] = fs.ReadRequest{File: f, Off: off, Buf: make([]byte, 1+rng.IntN(20000))}
	}
	if err := l.ReadBatchN(ctx, reqs, 8); err != nil {
		t.Fatal(err)
	}
	for i, q := range reqs {
		if !bytes.Equal(q.Buf, data[q.Off:q.Off+int64(len(q.Buf))]) {
			t.Fatalf("request %d [%d, +%d) differs", i, q.Off, len(q.Buf))
		}
	}
	if got := MappedReads() - m0; got != 100 {
		t.Fatalf("%d of 100 warm reads were copies from the mapping", got)
	}

	// Cut the file: the last look still says the tail is cached, the copy
	// faults, and the read falls through to ReadFull's error.
	if err := os.Truncate(p, 4096); err != nil {
		t.Fatal(err)
	}
	if !lf.m.cached(int64(len(data))-8192, 4096) {
		t.Fatal("the look was refreshed before the test could read a cut page")
	}
	bad := []fs.ReadRequest{{File: f, Off: int64(len(data)) - 8192, Buf: make([]byte, 4096)}}
	if err := l.ReadBatchN(ctx, bad, 4); !errors.Is(err, fs.ErrShortRead) {
		t.Fatalf("read of a cut page: %v, want ErrShortRead", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if lf.m.data != nil {
		t.Fatal("Close left the mapping")
	}
}

// A warm batch allocates nothing in this package (the scratch space is
// pooled), and after a run of probe hits its reads are plain preads that
// still return the file's bytes.
func TestReadBatchWarmPlainNoAllocs(t *testing.T) {
	if noNowaitEnv || noPlainEnv {
		t.Skip("FFKIT_NO_NOWAIT=1 or FFKIT_NO_PLAIN_PREAD=1")
	}
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "data")
	data := make([]byte, 2<<20)
	rng := rand.New(rand.NewPCG(13, 14))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	l := New()
	f, err := l.Open(ctx, p, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(make([]byte, len(data)), 0); err != nil {
		t.Fatal(err)
	}
	reqs := make([]fs.ReadRequest, 256)
	for i := range reqs {
		reqs[i] = fs.ReadRequest{File: f, Off: rng.Int64N(int64(len(data)) - 4096), Buf: make([]byte, 4096)}
	}
	// A preempted read looks slow and ends a batch's plain reads: retry
	// until one batch has read plainly (a warm file's batch does, unless
	// every one of its runs is preempted).
	p0 := PlainReads()
	for PlainReads() == p0 {
		for i := range reqs {
			clear(reqs[i].Buf)
		}
		if err := l.ReadBatch(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		if nowaitOff.Load() {
			t.Skip("this kernel refuses RWF_NOWAIT on buffered reads")
		}
		for i, q := range reqs {
			if !bytes.Equal(q.Buf, data[q.Off:q.Off+int64(len(q.Buf))]) {
				t.Fatalf("request %d [%d, +%d) differs", i, q.Off, len(q.Buf))
			}
		}
	}
	if raceEnabled {
		return // the race detector drops pooled items at random
	}
	allocs := testing.AllocsPerRun(20, func() {
		if err := l.ReadBatch(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Fatalf("%.1f allocations per warm batch of %d, want 0", allocs, len(reqs))
	}
}

// BenchmarkReadBatchWarm4K: one goroutine reading batches of 256 random
// 4 KiB ranges of a warm 64 MiB file, every read probed with preadv2
// ("probe") or plain preads after a run of probe hits ("plain").
func BenchmarkReadBatchWarm4K(b *testing.B) {
	ctx := context.Background()
	p := filepath.Join(b.TempDir(), "data")
	data := make([]byte, 64<<20)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		b.Fatal(err)
	}
	l := New()
	f, err := l.Open(ctx, p, fs.OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(data, 0); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 256*4096)
	reqs := make([]fs.ReadRequest, 256)
	for _, mode := range []string{"probe", "plain"} {
		b.Run(mode, func(b *testing.B) {
			defer func(v bool) { noPlainEnv = v }(noPlainEnv)
			noPlainEnv = mode == "probe"
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				for i := range reqs {
					reqs[i] = fs.ReadRequest{File: f, Off: rng.Int64N(int64(len(data))-4096) &^ 4095, Buf: buf[i*4096 : (i+1)*4096]}
				}
				slices.SortFunc(reqs, func(a, b fs.ReadRequest) int { return cmp.Compare(a.Off, b.Off) })
				if err := l.ReadBatch(ctx, reqs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
