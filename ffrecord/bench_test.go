package ffrecord

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// Benchmarks of the batch read path on a warm (page-cached) file, next to a
// plain pread loop over the same samples. go test -bench . -run '^$' ./ffrecord

func benchDataset(b *testing.B) (string, [][]byte) {
	b.Helper()
	p := filepath.Join(b.TempDir(), "bench.ffr")
	rng := rand.New(rand.NewPCG(1, 1))
	samples := make([][]byte, 20000)
	for i := range samples {
		samples[i] = make([]byte, 1024+rng.IntN(15*1024))
	}
	w, err := Create(context.Background(), p, int64(len(samples)))
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range samples {
		w.WriteOne(s)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return p, samples
}

func BenchmarkReadBatchWarm(b *testing.B) {
	p, samples := benchDataset(b)
	for _, o := range []struct {
		name string
		opts ReadOptions
	}{{"default", ReadOptions{}}, {"noverify", ReadOptions{NoVerify: true}}} {
		b.Run(o.name, func(b *testing.B) {
			r, err := Open(context.Background(), []string{p}, o.opts)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			rng := rand.New(rand.NewPCG(2, 2))
			idx := make([]int64, 256)
			buf := make([]byte, 256*16*1024)
			b.ResetTimer()
			var bytes int64
			for b.Loop() {
				for k := range idx {
					idx[k] = rng.Int64N(int64(len(samples)))
				}
				n, _ := r.BatchSize(idx)
				if _, err := r.ReadBatchInto(context.Background(), idx, buf[:n]); err != nil {
					b.Fatal(err)
				}
				bytes += n
			}
			b.ReportMetric(float64(b.N*len(idx))/b.Elapsed().Seconds(), "samples/s")
		})
	}
	b.Run("plain-pread", func(b *testing.B) {
		r, _ := Open(context.Background(), []string{p}, ReadOptions{})
		defer r.Close()
		f, _ := os.Open(p)
		defer f.Close()
		rng := rand.New(rand.NewPCG(2, 2))
		buf := make([]byte, 16*1024)
		for b.Loop() {
			for range 256 {
				_, off, l, _ := r.Locate(rng.Int64N(int64(len(samples))))
				f.ReadAt(buf[:l], off)
			}
		}
		b.ReportMetric(float64(b.N*256)/b.Elapsed().Seconds(), "samples/s")
	})
}
