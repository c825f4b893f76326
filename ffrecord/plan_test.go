package ffrecord

import (
	"bytes"
	"context"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
)

// Plans are pooled (plan.go): batches of different sizes read at the same
// time from several goroutines, through the integer-key sort and through
// the comparison sort, each get exactly their samples.
func TestPooledPlansConcurrent(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 3))
	samples := randSamples(rng, 500, 3000)
	dir := t.TempDir()
	sw, err := NewShardedWriter(ctx, filepath.Join(dir, "ds"), ShardOptions{TargetSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if err := sw.Write(s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := Open(ctx, []string{filepath.Join(dir, "ds")}, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(r.Files()) < 3 {
		t.Fatalf("want several shards, got %d", len(r.Files()))
	}
	for _, keys := range []bool{true, false} {
		noKeySortForTesting = !keys
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 9))
				for range 40 {
					idx := make([]int64, rng.IntN(300))
					for k := range idx {
						idx[k] = rng.Int64N(r.N())
						if k > 0 && rng.IntN(6) == 0 {
							idx[k] = idx[rng.IntN(k)] // duplicates
						}
					}
					if rng.IntN(4) == 0 {
						for k := range idx {
							idx[k] = int64(k) % r.N() // sorted: no sort at all
						}
					}
					got, err := r.ReadBatch(ctx, idx)
					if err != nil {
						t.Errorf("ReadBatch: %v", err)
						return
					}
					for k, i := range idx {
						if !bytes.Equal(got[k], samples[i]) {
							t.Errorf("keys %v: request %d (sample %d): %d bytes, want %d", keys, k, i, len(got[k]), len(samples[i]))
							return
						}
					}
				}
			}()
		}
		wg.Wait()
	}
	noKeySortForTesting = false
}

// A warm batch allocates only what it returns (the [][]byte): the plan and
// its slices come from a pool.
func TestReadBatchIntoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled items at random")
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(4, 4))
	samples := randSamples(rng, 2000, 4096)
	p := filepath.Join(t.TempDir(), "one.ffr")
	writeFile(t, p, samples)
	r, err := Open(ctx, []string{p}, ReadOptions{MergeGap: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	idx := make([]int64, 256)
	for k := range idx {
		idx[k] = rng.Int64N(r.N())
	}
	size, _ := r.BatchSize(idx)
	buf := make([]byte, size)
	if _, err := r.ReadBatchInto(ctx, idx, buf); err != nil { // fills the pool, warms the file
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := r.ReadBatchInto(ctx, idx, buf); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.0f allocations per batch of %d", allocs, len(idx))
	if allocs > 1 { // the returned [][]byte
		t.Fatalf("%.0f allocations per batch of %d, want at most 1", allocs, len(idx))
	}
}
