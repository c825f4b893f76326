package clusterfs

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
)

// randWrite4K writes n random 4 KiB blocks of a size-byte file with depth
// writers in flight, then syncs, and returns the IOPS over the whole span
// (the final sync included), as `ffkit bench fs`'s rand write row does.
func randWrite4K(tb testing.TB, writeAt func([]byte, int64) error, syncFn func() error, size int64, n, depth int) float64 {
	tb.Helper()
	const bs = 4096
	blocks := size / bs
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for w := range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			data := make([]byte, bs)
			for next.Add(1) <= int64(n) {
				data[0] = byte(w)
				if err := writeAt(data, rng.Int64N(blocks)*bs); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		tb.Fatal(err)
	}
	if err := syncFn(); err != nil {
		tb.Fatal(err)
	}
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkRandomWrite4K: random 4 KiB writes at depth 128 on a 64 MiB file
// through clusterfs (in-process cluster, 3 storage servers, 3 replicas,
// 256 KiB chunks) with write-behind and without it (WriteBehind -1: every
// write a chain write), beside the same pattern on a local file (pwrite,
// fsync at the end) in the same run:
//
//	go test -run XXX -bench RandomWrite4K -benchtime 1x ./fs/clusterfs/
func BenchmarkRandomWrite4K(b *testing.B) {
	const size, n, depth = 64 << 20, 2048, 128
	ctx := context.Background()
	c := startCluster(b, nil, 1)
	wb := c.open(b)
	direct, err := Open(ctx, c.m.Addr(), Options{Token: token, RetryTimeout: 20 * time.Second, WriteBehind: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	run := func(f *FS, name string) float64 {
		w, err := f.OpenWrite(ctx, name, fs.OCreate)
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Truncate(size); err != nil {
			b.Fatal(err)
		}
		iops := randWrite4K(b, func(p []byte, off int64) error { _, err := w.WriteAt(p, off); return err }, w.Sync, size, n, depth)
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
		f.Remove(ctx, name)
		return iops
	}
	for range b.N {
		without := run(direct, "/randw-direct")
		with := run(wb, "/randw-wb")
		lp := filepath.Join(b.TempDir(), "randw")
		lf, err := os.Create(lp)
		if err != nil {
			b.Fatal(err)
		}
		lf.Truncate(size)
		lf.Sync()
		local := randWrite4K(b, func(p []byte, off int64) error { _, err := lf.WriteAt(p, off); return err }, lf.Sync, size, n, depth)
		lf.Close()
		b.ReportMetric(with, "wb-IOPS")
		b.ReportMetric(without, "direct-IOPS")
		b.ReportMetric(local, "local-IOPS")
		b.Logf("rand write 4KiB x%d depth %d, %d MiB file: clusterfs write-behind %.0f IOPS, write-through %.0f IOPS (%.1fx); local file %.0f IOPS (ratio %.4f)",
			n, depth, size>>20, with, without, with/without, local, with/local)
	}
}
