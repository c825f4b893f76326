package loader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/internal/errkind"
)

func TestEpochDeliversEverySampleOnce(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 1000, 3)
	for _, shuffle := range []bool{false, true} {
		l := mustOpen(t, []string{dir}, Options{BatchSize: 32, Shuffle: shuffle, Seed: 7, Epochs: 2})
		bs := drain(t, l, -1)
		if len(bs) != 2*32 { // ceil(1000/32) = 32 per epoch
			t.Fatalf("shuffle=%v: %d batches, want 64", shuffle, len(bs))
		}
		checkContent(t, []string{"a"}, bs)
		for e := int64(0); e < 2; e++ {
			seen := map[int64]bool{}
			var order []int64
			for _, b := range bs {
				if b.Epoch != e {
					continue
				}
				for _, i := range b.Indices {
					if seen[i] {
						t.Fatalf("epoch %d: sample %d twice", e, i)
					}
					seen[i] = true
					order = append(order, i)
				}
			}
			if len(seen) != 1000 {
				t.Fatalf("epoch %d: %d distinct samples", e, len(seen))
			}
			if sorted := sort.SliceIsSorted(order, func(a, b int) bool { return order[a] < order[b] }); sorted == shuffle {
				t.Fatalf("shuffle=%v but order sorted=%v", shuffle, sorted)
			}
		}
		if last := bs[31]; len(last.Indices) != 1000-31*32 {
			t.Fatalf("last batch has %d samples, want the short remainder %d", len(last.Indices), 1000-31*32)
		}
		st := l.Stats()
		if st.Samples != 2000 || st.Batches != 64 || st.SamplesPerS <= 0 || st.FirstBatch <= 0 {
			t.Fatalf("stats %+v", st)
		}
	}
}

// hashTransform is an augmentation stand-in: it depends on the sample's
// bytes and its seed only.
func hashTransform(_ context.Context, s Sample) (any, error) {
	h := fnv.New64a()
	h.Write(s.Data)
	return fmt.Sprintf("%x/%x", h.Sum64(), s.Seed), nil
}

func TestOrderIndependentOfWorkersAndPrefetch(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 777, 4)
	var ref []got
	for i, c := range []struct{ workers, prefetch, tw, maxInFlight int }{{1, 1, 1, 0}, {64, 8, 8, 0}, {3, 2, 2, 0}, {16, 32, 3, 0}, {64, 8, 2, 5}, {8, 4, 1, 1}} {
		l := mustOpen(t, []string{dir}, Options{BatchSize: 50, Shuffle: true, Seed: 99, Epochs: 2, Rank: 1, WorldSize: 3,
			Workers: c.workers, Prefetch: c.prefetch, TransformWorkers: c.tw, MaxInFlight: c.maxInFlight, SampleTransform: hashTransform})
		bs := drain(t, l, -1)
		checkContent(t, []string{"a"}, bs)
		if i == 0 {
			ref = bs
			continue
		}
		if !reflect.DeepEqual(bs, ref) {
			t.Fatalf("workers=%d prefetch=%d max in flight=%d: batches differ from workers=1 prefetch=1", c.workers, c.prefetch, c.maxInFlight)
		}
	}
}

func TestResumeEqualsUninterrupted(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 500, 2)
	for _, o := range []Options{
		{BatchSize: 16, Shuffle: true, Seed: 3, Epochs: 3, WorldSize: 2, Rank: 1},
		{BatchSize: 7, Shuffle: true, Seed: 4, Epochs: 2, DropLast: true, WorldSize: 3},
		{BatchSize: 20, Shuffle: true, BlockSize: 16, Window: 4, Seed: 5, Epochs: 2},
		{BatchSize: 9, Epochs: 2, WorldSize: 4, Rank: 3},
	} {
		o.SampleTransform = hashTransform
		full := drain(t, mustOpen(t, []string{dir}, o), -1)
		per := len(full) / int(o.Epochs)
		for _, k := range []int{1, per - 1, per, per + 3, len(full) - 1} {
			l := mustOpen(t, []string{dir}, o)
			first := drain(t, l, k)
			st := l.State()
			l.Close()
			// Through JSON, as a checkpoint would.
			raw, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			var back State
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatal(err)
			}
			o2 := o
			o2.Workers, o2.Prefetch = 5, 1 // resume with another worker count
			l2 := mustOpen(t, []string{dir}, o2)
			if err := l2.Restore(back); err != nil {
				t.Fatal(err)
			}
			rest := drain(t, l2, -1)
			if !reflect.DeepEqual(append(first, rest...), full) {
				t.Fatalf("%+v: resume after %d batches differs from the uninterrupted run (%d+%d vs %d batches)", o, k, len(first), len(rest), len(full))
			}
		}
	}
}

func TestElasticResumeCoversEachSampleOnce(t *testing.T) {
	const n = 1003
	dir := makeDataset(t, t.TempDir(), "a", n, 3)
	for _, c := range []struct {
		w1, w2, b1, b2, k int
		drop              bool
	}{{4, 3, 16, 16, 5, false}, {2, 5, 10, 8, 20, false}, {3, 1, 32, 64, 4, false}, {1, 4, 50, 25, 3, false}, {4, 6, 8, 8, 2, true}} {
		count := make([]int, n)
		var states []State
		for r := 0; r < c.w1; r++ {
			l := mustOpen(t, []string{dir}, Options{BatchSize: c.b1, Shuffle: true, Seed: 11, Rank: r, WorldSize: c.w1, DropLast: c.drop})
			for _, b := range drain(t, l, c.k) {
				for _, i := range b.Indices {
					count[i]++
				}
			}
			states = append(states, l.State())
		}
		for r := 1; r < len(states); r++ {
			if states[r].Cursor != states[0].Cursor || states[r].Epoch != states[0].Epoch {
				t.Fatalf("ranks disagree on the position: %+v vs %+v", states[r], states[0])
			}
		}
		saved := states[c.w1-1] // any rank's state will do
		var nbatches []int
		padded := 0
		for r := 0; r < c.w2; r++ {
			l := mustOpen(t, []string{dir}, Options{BatchSize: c.b2, Shuffle: true, Seed: 11, Rank: r, WorldSize: c.w2, DropLast: c.drop})
			if err := l.Restore(saved); err != nil {
				t.Fatal(err)
			}
			bs := drain(t, l, -1)
			nbatches = append(nbatches, len(bs))
			for _, b := range bs {
				if b.Epoch != 0 {
					t.Fatalf("ran into epoch %d", b.Epoch)
				}
				padded += b.Padded
				for _, i := range b.Indices {
					count[i]++
				}
			}
		}
		for r := range nbatches {
			if nbatches[r] != nbatches[0] {
				t.Fatalf("%+v: ranks got %v batches after the elastic resume", c, nbatches)
			}
		}
		repeats, missing := 0, 0
		for _, k := range count {
			if k == 0 {
				missing++
			}
			if k > 1 {
				repeats += k - 1
			}
		}
		if c.drop {
			if repeats != 0 || missing >= c.w2*c.b2 {
				t.Fatalf("%+v: %d repeated, %d dropped", c, repeats, missing)
			}
			continue
		}
		if missing != 0 || repeats != padded || padded >= c.w2 {
			t.Fatalf("%+v: %d skipped, %d repeated (padding %d)", c, missing, repeats, padded)
		}
	}
}

func TestRankBalance(t *testing.T) {
	const n = 1001
	dir := makeDataset(t, t.TempDir(), "a", n, 2)
	for _, w := range []int{2, 3, 7} {
		var shapes []string
		count := make([]int, n)
		for r := 0; r < w; r++ {
			bs := drain(t, mustOpen(t, []string{dir}, Options{BatchSize: 24, Shuffle: true, Rank: r, WorldSize: w}), -1)
			var sizes []int
			for _, b := range bs {
				sizes = append(sizes, len(b.Indices))
				for _, i := range b.Indices {
					count[i]++
				}
			}
			shapes = append(shapes, fmt.Sprint(sizes))
		}
		for r := range shapes {
			if shapes[r] != shapes[0] {
				t.Fatalf("world %d: rank %d batch sizes %s, rank 0 %s", w, r, shapes[r], shapes[0])
			}
		}
		extra := 0
		for i, c := range count {
			if c == 0 {
				t.Fatalf("world %d: sample %d on no rank", w, i)
			}
			extra += c - 1
		}
		if want := (n+w-1)/w*w - n; extra != want {
			t.Fatalf("world %d: %d padded samples, want %d", w, extra, want)
		}
	}
}

func TestRestoreRefusesOtherDataOrOrder(t *testing.T) {
	root := t.TempDir()
	a := makeDataset(t, filepath.Join(root, "a"), "a", 300, 2)
	b := makeDataset(t, filepath.Join(root, "b"), "b", 300, 2) // same count, other bytes
	c := makeDataset(t, filepath.Join(root, "c"), "a", 301, 2)
	o := Options{BatchSize: 10, Shuffle: true, Seed: 1}
	la := mustOpen(t, []string{a}, o)
	drain(t, la, 3)
	st := la.State()
	for _, other := range []string{b, c} {
		err := mustOpen(t, []string{other}, o).Restore(st)
		if !errors.Is(err, ErrState) || errkind.Of(err) != errkind.Usage {
			t.Fatalf("state of %s restored on %s: %v", a, other, err)
		}
		if e := errorContains(err, "other data"); e != nil {
			t.Fatal(e)
		}
	}
	if err := mustOpen(t, []string{a}, Options{BatchSize: 10, Shuffle: false}).Restore(st); !errors.Is(err, ErrState) {
		t.Fatalf("state of a shuffled run restored without shuffle: %v", err)
	}
	if err := mustOpen(t, []string{a}, Options{BatchSize: 10, Shuffle: true, Seed: 2}).Restore(st); !errors.Is(err, ErrState) {
		t.Fatalf("state restored with another seed: %v", err)
	}
	// A copy of the same data elsewhere is the same dataset.
	cp := filepath.Join(root, "copy")
	os.MkdirAll(cp, 0o755)
	for _, f := range []string{"PART_00000.ffr", "PART_00001.ffr"} {
		raw, _ := os.ReadFile(filepath.Join(a, f))
		os.WriteFile(filepath.Join(cp, f), raw, 0o644)
	}
	if err := mustOpen(t, []string{cp}, o).Restore(st); err != nil {
		t.Fatalf("a copy of the data refused: %v", err)
	}
	bad := st
	bad.Cursor = 300
	if err := la.Restore(bad); !errors.Is(err, ErrState) {
		t.Fatalf("cursor past the end accepted: %v", err)
	}
}

func TestMemoryBudgetUnderSlowConsumer(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 2000, 2)
	// Samples are 12..108 bytes; a batch of 16 is at most ~1.7 KiB.
	const budget = 5000
	l := mustOpen(t, []string{dir}, Options{BatchSize: 16, Shuffle: true, Prefetch: 16, MemoryBudget: budget})
	var held []*Batch
	var maxHeld int64
	for i := 0; ; i++ {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
		// The consumer keeps up to two batches and is slow.
		if len(held) > 2 {
			held[0].Release()
			held = held[1:]
		}
		if h := l.Stats().MemoryHeld; h > maxHeld {
			maxHeld = h
		}
		if i%10 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	for _, b := range held {
		b.Release()
	}
	st := l.Stats()
	if st.MemoryPeak > budget || maxHeld > budget {
		t.Fatalf("memory peak %d (observed %d) over the budget %d", st.MemoryPeak, maxHeld, budget)
	}
	if st.MemoryPeak < budget/2 {
		t.Fatalf("memory peak %d: the prefetcher did not use the budget", st.MemoryPeak)
	}
	if st.MemoryHeld != 0 {
		t.Fatalf("%d bytes still held after releasing everything", st.MemoryHeld)
	}
	// A consumer that never releases stops the pipeline at the budget and
	// the watchdog says why instead of hanging silently.
	var logs []string
	var mu sync.Mutex
	l2 := mustOpen(t, []string{dir}, Options{BatchSize: 16, Prefetch: 16, MemoryBudget: budget, Watchdog: 50 * time.Millisecond, FailOnStall: true,
		Log: func(s string) { mu.Lock(); logs = append(logs, s); mu.Unlock() }})
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = l2.Next(context.Background()) // never released
	}
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("unreleased batches: %v", err)
	}
	if e := errorContains(err, "memory budget", "not yet released"); e != nil {
		t.Fatal(e)
	}
	if st := l2.Stats(); st.MemoryPeak > budget {
		t.Fatalf("peak %d over budget %d", st.MemoryPeak, budget)
	}
}

func TestCloseUnderLoadLeaksNothing(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 3000, 4)
	base := runtime.NumGoroutine()
	fds := openFDs(t, dir)
	for i, stopAfter := range []int{0, 1, 5, 40} {
		l, err := Open(context.Background(), []string{dir}, Options{BatchSize: 8, Shuffle: true, Prefetch: 8, Workers: 4,
			Epochs: -1, SampleTransform: func(ctx context.Context, s Sample) (any, error) {
				time.Sleep(50 * time.Microsecond)
				return nil, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		if open := openFDs(t, dir); open != 4 {
			t.Fatalf("%d descriptors on the dataset's 4 files while open", open)
		}
		var held *Batch
		for k := 0; k < stopAfter; k++ {
			b, err := l.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if k == stopAfter-1 {
				held = b // kept across Close
			} else {
				b.Release()
			}
		}
		if i%2 == 1 {
			// Close from another goroutine while Next waits.
			go func() { time.Sleep(time.Millisecond); l.Close() }()
			for {
				b, err := l.Next(context.Background())
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Fatalf("Next during Close: %v", err)
					}
					break
				}
				b.Release()
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if held != nil {
			want := string(sampleBytes("a", held.Indices[0]))
			if string(held.Samples[0]) != want {
				t.Fatal("a batch held across Close changed")
			}
			held.Release()
		}
		if _, err := l.Next(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Next after Close: %v", err)
		}
	}
	waitGoroutines(t, base)
	if now := openFDs(t, dir); now > fds {
		t.Fatalf("%d open files, %d before", now, fds)
	}
}

// corrupt flips one byte of global sample idx of a makeDataset dataset
// written as one file.
func corrupt(t *testing.T, path string, idx int64) {
	t.Helper()
	r, err := ffrecord.Open(context.Background(), []string{path}, ffrecord.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, off, _, err := r.Locate(idx)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, off+3)
	b[0] ^= 0xff
	f.WriteAt(b, off+3)
}

func TestErrorsReachTheConsumer(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 200, 1)
	path := filepath.Join(dir, "PART_00000.ffr")
	corrupt(t, path, 123)
	l := mustOpen(t, []string{path}, Options{BatchSize: 10})
	var err error
	delivered := 0
	for err == nil {
		var b *Batch
		b, err = l.Next(context.Background())
		if err == nil {
			delivered++
			b.Release()
		}
	}
	if delivered != 12 {
		t.Fatalf("%d good batches before the bad one, want 12", delivered)
	}
	var se *ffrecord.SampleError
	if !errors.As(err, &se) || se.Index != 123 || !errors.Is(err, ffrecord.ErrChecksum) || errkind.Of(err) != errkind.Data {
		t.Fatalf("error %v: want a checksum SampleError for sample 123", err)
	}
	if e := errorContains(err, "PART_00000.ffr", "123", "batch 12"); e != nil {
		t.Fatal(e)
	}
	if _, err2 := l.Next(context.Background()); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("the error is not sticky: %v", err2)
	}
	// Without verification the bytes come through.
	bs := drain(t, mustOpen(t, []string{path}, Options{BatchSize: 10, NoVerify: true}), -1)
	if len(bs) != 20 {
		t.Fatalf("NoVerify: %d batches", len(bs))
	}
	// A file cut short after the loader opened it: the error reaches the
	// consumer naming the sample.
	lt := mustOpen(t, []string{dir}, Options{BatchSize: 10, NoVerify: true})
	if err := os.Truncate(path, 3000); err != nil {
		t.Fatal(err)
	}
	_, err = drain2(lt)
	if !errors.As(err, &se) || !errors.Is(err, ffrecord.ErrTruncated) || se.Index < 0 {
		t.Fatalf("file truncated under the loader: %v", err)
	}
}

func drain2(l *Loader) (int, error) {
	n := 0
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
		b.Release()
	}
}

func TestSkipBadSamples(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 300, 1)
	path := filepath.Join(dir, "PART_00000.ffr")
	bad := []int64{0, 17, 18, 250}
	for _, i := range bad {
		corrupt(t, path, i)
	}
	var logs []string
	var mu sync.Mutex
	o := Options{BatchSize: 16, Shuffle: true, Seed: 5, WorldSize: 2, Epochs: 2, BadSamples: Skip,
		Log: func(s string) { mu.Lock(); logs = append(logs, s); mu.Unlock() }}
	ref := drain(t, mustOpen(t, []string{makeDataset(t, t.TempDir(), "a", 300, 1)}, Options{BatchSize: 16, Shuffle: true, Seed: 5, WorldSize: 2, Epochs: 2}), -1)
	l := mustOpen(t, []string{path}, o)
	bs := drain(t, l, -1)
	if len(bs) != len(ref) {
		t.Fatalf("%d batches with skipped samples, %d without", len(bs), len(ref))
	}
	isBad := map[int64]bool{}
	for _, i := range bad {
		isBad[i] = true
	}
	subs := 0
	for k, b := range bs {
		if len(b.Indices) != len(ref[k].Indices) {
			t.Fatalf("batch %d has %d samples, %d without bad samples", k, len(b.Indices), len(ref[k].Indices))
		}
		for i, idx := range b.Indices {
			if isBad[idx] {
				t.Fatalf("bad sample %d delivered", idx)
			}
			if idx != ref[k].Indices[i] {
				subs++
				if !isBad[ref[k].Indices[i]] {
					t.Fatalf("good sample %d replaced", ref[k].Indices[i])
				}
			}
		}
	}
	checkContent(t, []string{"a"}, bs)
	if subs == 0 {
		t.Fatal("nothing was substituted")
	}
	mu.Lock()
	defer mu.Unlock()
	if st := l.Stats(); st.Skipped == 0 || int(st.Skipped) != len(logs) {
		t.Fatalf("skipped %d, %d log lines", st.Skipped, len(logs))
	}
	for _, line := range logs {
		if !strings.Contains(line, "PART_00000.ffr") || !strings.Contains(line, "bad sample") {
			t.Fatalf("log line does not name file and sample: %s", line)
		}
	}
}

func TestSlabArenaHoldsBatches(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 100, 1)
	mem := make([]byte, 4*4096)
	arena, err := NewSlabArena(mem, 4)
	if err != nil {
		t.Fatal(err)
	}
	l := mustOpen(t, []string{dir}, Options{BatchSize: 10, Shuffle: true, Arena: arena})
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		base := int64(b.Slot) * arena.SlotSize()
		for i, s := range b.Samples {
			off := base + b.Offset(i)
			if string(mem[off:off+int64(len(s))]) != string(sampleBytes("a", b.Indices[i])) {
				t.Fatalf("slot %d offset %d does not hold sample %d", b.Slot, b.Offset(i), b.Indices[i])
			}
		}
		b.Release()
	}
	small, _ := NewSlabArena(make([]byte, 64), 1)
	_, err = drain2(mustOpen(t, []string{dir}, Options{BatchSize: 10, Arena: small}))
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("batch larger than a slot: %v", err)
	}
}

func TestMixtureProportionsAndResume(t *testing.T) {
	root := t.TempDir()
	a := makeDataset(t, filepath.Join(root, "a"), "a", 100, 1)
	b := makeDataset(t, filepath.Join(root, "b"), "b", 1000, 2)
	o := Options{BatchSize: 25, Shuffle: true, Seed: 2, Epochs: 3, Weights: []float64{3, 1}, MixtureEpoch: 400, SampleTransform: hashTransform}
	open := func(o Options) *Loader {
		l, err := OpenMixture(context.Background(), [][]string{{a}, {b}}, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	full := drain(t, open(o), -1)
	checkContent(t, []string{"a", "b"}, full)
	for e := int64(0); e < 3; e++ {
		n := [2]int{}
		for _, bt := range full {
			if bt.Epoch == e {
				for _, s := range bt.Sources {
					n[s]++
				}
			}
		}
		if n != [2]int{300, 100} {
			t.Fatalf("epoch %d: %v samples per source, want [300 100]", e, n)
		}
	}
	l := open(o)
	first := drain(t, l, 21)
	l2 := open(o)
	if err := l2.Restore(l.State()); err != nil {
		t.Fatal(err)
	}
	if rest := drain(t, l2, -1); !reflect.DeepEqual(append(first, rest...), full) {
		t.Fatal("mixture resume differs from the uninterrupted run")
	}
	o2 := o
	o2.Weights = []float64{1, 1}
	if err := open(o2).Restore(l.State()); !errors.Is(err, ErrState) {
		t.Fatalf("state restored with other weights: %v", err)
	}
}

func TestSetEpochAndSeedsFollowTheSample(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 64, 1)
	l := mustOpen(t, []string{dir}, Options{BatchSize: 8, Shuffle: true, Seed: 1})
	e0 := drain(t, l, -1)
	if err := l.SetEpoch(5); err != nil {
		t.Fatal(err)
	}
	e5 := drain(t, l, -1)
	if len(e5) != 8 || e5[0].Epoch != 5 || reflect.DeepEqual(e0[0].Indices, e5[0].Indices) {
		t.Fatalf("SetEpoch(5): %d batches, epoch %d", len(e5), e5[0].Epoch)
	}
	// The seed of a sample depends on (seed, epoch, index), not on where
	// it lands.
	l8 := mustOpen(t, []string{dir}, Options{BatchSize: 3, Shuffle: true, Seed: 1, WorldSize: 2, StartEpoch: 5})
	for _, b := range drain(t, l8, -1) {
		for i, idx := range b.Indices {
			if b.Seeds[i] != SampleSeed(1, 5, 0, idx) {
				t.Fatalf("seed of sample %d is not SampleSeed(1, 5, 0, %d)", idx, idx)
			}
		}
	}
}

func TestNextHonoursContextWithoutLosingBatches(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 200, 1)
	ref := drain(t, mustOpen(t, []string{dir}, Options{BatchSize: 10, Shuffle: true}), -1)
	l := mustOpen(t, []string{dir}, Options{BatchSize: 10, Shuffle: true})
	var out []got
	var cancelled atomic.Int64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(len(out)%3)*time.Microsecond)
		b, err := l.Next(ctx)
		cancel()
		if err == io.EOF {
			break
		}
		if errors.Is(err, context.DeadlineExceeded) {
			cancelled.Add(1)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, snapshot(b))
		b.Release()
	}
	if !reflect.DeepEqual(out, ref) {
		t.Fatalf("batches differ after %d cancelled Next calls", cancelled.Load())
	}
}

func TestBlockShuffleTradesRandomnessForLocality(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 4096, 1)
	measure := func(o Options) (*OrderQuality, []got) {
		l := mustOpen(t, []string{dir}, o)
		q := NewOrderQuality(l)
		q.MergeGap = 512 // about 8 samples of this dataset
		var bs []got
		for {
			b, err := l.Next(context.Background())
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			q.Observe(b)
			bs = append(bs, snapshot(b))
			b.Release()
		}
		return q, bs
	}
	global, _ := measure(Options{BatchSize: 64, Shuffle: true})
	block, bs := measure(Options{BatchSize: 64, Shuffle: true, BlockSize: 64, Window: 4})
	seq, _ := measure(Options{BatchSize: 64})
	checkContent(t, []string{"a"}, bs)
	seen := map[int64]bool{}
	for _, b := range bs {
		for _, i := range b.Indices {
			seen[i] = true
		}
	}
	if len(seen) != 4096 {
		t.Fatalf("block shuffle delivered %d distinct samples", len(seen))
	}
	t.Logf("reads/batch: global %.1f, block %.1f, sequential %.1f; neighbour share: global %.4f, block %.4f, sequential %.4f",
		global.ReadsPerBatch(), block.ReadsPerBatch(), seq.ReadsPerBatch(), global.NearFrac(), block.NearFrac(), seq.NearFrac())
	if !(block.ReadsPerBatch() < global.ReadsPerBatch()/2 && seq.ReadsPerBatch() <= block.ReadsPerBatch()) {
		t.Fatalf("locality: reads per batch global %.1f, block %.1f, sequential %.1f", global.ReadsPerBatch(), block.ReadsPerBatch(), seq.ReadsPerBatch())
	}
	if !(global.NearFrac() < block.NearFrac() && block.NearFrac() < seq.NearFrac()) {
		t.Fatalf("randomness: neighbour share global %.4f, block %.4f, sequential %.4f", global.NearFrac(), block.NearFrac(), seq.NearFrac())
	}
}

func TestOptionsAreValidated(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 10, 1)
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{BatchSize: -1}, "batch size"},
		{Options{Rank: 2, WorldSize: 2}, "rank 2"},
		{Options{Prefetch: -1}, "prefetch"},
		{Options{BlockSize: 4}, "needs shuffling"},
		{Options{BatchSize: 4, WorldSize: 3, DropLast: true}, "no full batch"},
		{Options{Workers: -3}, "workers"},
		{Options{MaxInFlight: -1}, "max in flight"},
	} {
		_, err := Open(context.Background(), []string{dir}, c.o)
		if !errors.Is(err, ErrOptions) || errkind.Of(err) != errkind.Usage {
			t.Fatalf("%+v: %v", c.o, err)
		}
		if e := errorContains(err, c.want); e != nil {
			t.Fatal(e)
		}
	}
}

func TestBatchLargerThanBudgetComesAlone(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 100, 1)
	l := mustOpen(t, []string{dir}, Options{BatchSize: 50, MemoryBudget: 100, Prefetch: 4})
	var smallest int64 = 1 << 62
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		smallest = min(smallest, b.Bytes())
		for i := range b.Samples {
			if off := b.Offset(i); string(b.Data[off:off+int64(len(b.Samples[i]))]) != string(sampleBytes("a", b.Indices[i])) {
				t.Fatalf("Offset(%d) = %d does not point at the sample", i, off)
			}
		}
		b.Release()
	}
	st := l.Stats()
	if st.Samples != 100 || st.MemoryPeak >= 2*smallest {
		t.Fatalf("stats %+v: more than one oversized batch in memory", st)
	}
}

func TestOptionsFromJSON(t *testing.T) {
	var o Options
	if err := json.Unmarshal([]byte(`{"batch_size": 8, "shuffle": true, "seed": 18446744073709551615, "rank": 1, "world_size": 2, "bad_samples": "skip", "memory_budget": 1048576}`), &o); err != nil {
		t.Fatal(err)
	}
	if o.BatchSize != 8 || !o.Shuffle || o.Seed != 1<<64-1 || o.Rank != 1 || o.WorldSize != 2 || o.BadSamples != Skip || o.MemoryBudget != 1<<20 {
		t.Fatalf("%+v", o)
	}
	if err := json.Unmarshal([]byte(`{"bad_samples": "ignore"}`), &o); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

func TestPrometheusCollector(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 100, 1)
	l := mustOpen(t, []string{dir}, Options{BatchSize: 10, Rank: 0})
	drain(t, l, -1)
	reg := prometheus.NewRegistry()
	if err := reg.Register(l.Collector()); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		m := f.GetMetric()[0]
		if m.GetCounter() != nil {
			got[f.GetName()] = m.GetCounter().GetValue()
		} else {
			got[f.GetName()] = m.GetGauge().GetValue()
		}
	}
	if got["ffkit_loader_samples_total"] != 100 || got["ffkit_loader_batches_total"] != 10 || got["ffkit_loader_memory_budget_bytes"] != DefaultMemoryBudget {
		t.Fatalf("metrics %v", got)
	}
}

// DirectAuto reads a small local dataset buffered, delivers the same
// batches as the default, and says so in Stats.DirectChoice; asked modes
// report themselves too.
func TestDirectAutoChoice(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 300, 2)
	want := drain(t, mustOpen(t, []string{dir}, Options{BatchSize: 32, Shuffle: true, Seed: 3}), -1)
	l := mustOpen(t, []string{dir}, Options{BatchSize: 32, Shuffle: true, Seed: 3, DirectAuto: true, Direct: true})
	got := drain(t, l, -1)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatal("direct=auto delivered other batches than the default")
	}
	if c := l.Stats().DirectChoice; !strings.HasPrefix(c, "buffered (auto: ") {
		t.Fatalf("direct_choice %q, want buffered by auto", c)
	}
	l = mustOpen(t, []string{dir}, Options{BatchSize: 32, Direct: true})
	if c := l.Stats().DirectChoice; !strings.HasPrefix(c, "direct (on: ") {
		t.Fatalf("direct_choice %q with Direct, want direct (on: ...)", c)
	}
	l.Close()
}
