package bench

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// throttledFile writes a real file of size bytes and opens it through a
// ThrottledFS driven by a ManualClock.
func openThrottled(t *testing.T, size int, rate float64, perOp time.Duration) (*ManualClock, fs.FS, fs.File) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "data")
	data := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	clk := NewManualClock(time.Unix(1000, 0))
	tfs := NewThrottledFS(localfs.New(), clk, rate, perOp)
	f, err := tfs.Open(context.Background(), p, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return clk, tfs, f
}

func readOp(f fs.File, block int) Op {
	return func(ctx context.Context, worker int, seq int64) (int64, error) {
		buf := make([]byte, block)
		off := (seq * int64(block)) % (f.Size() - int64(block))
		if err := localfs.ReadFull(f, buf, off); err != nil {
			return 0, err
		}
		return int64(block), nil
	}
}

func TestRunReportsThrottledRate(t *testing.T) {
	const rate = 100 * MiB
	clk, _, f := openThrottled(t, 4<<20, rate, 0)
	for _, workers := range []int{1, 4} {
		res, err := Run(context.Background(), Options{Clock: clk, Workers: workers, Count: 50, WarmupCount: 5}, readOp(f, 64<<10))
		if err != nil {
			t.Fatal(err)
		}
		if !near(res.MiBPerSec, 100) {
			t.Errorf("workers=%d: %.6f MiB/s, want 100 (the throttle's rate)", workers, res.MiBPerSec)
		}
		if res.Ops != int64(50*workers) || res.Bytes != int64(50*workers*64<<10) {
			t.Errorf("workers=%d: ops %d bytes %d", workers, res.Ops, res.Bytes)
		}
		if res.WarmupOps != int64(5*workers) {
			t.Errorf("workers=%d: warm-up ops %d, want %d", workers, res.WarmupOps, 5*workers)
		}
		if !near(res.OpsPerSec, 100*16) {
			t.Errorf("workers=%d: %.3f ops/s, want 1600", workers, res.OpsPerSec)
		}
	}
}

func TestRunDurationAndLatency(t *testing.T) {
	// 64 KiB at 100 MiB/s is 625us, plus 100us per op: 725us per op.
	clk, _, f := openThrottled(t, 4<<20, 100*MiB, 100*time.Microsecond)
	start := clk.Now()
	res, err := Run(context.Background(), Options{Clock: clk, Duration: time.Second, Warmup: 100 * time.Millisecond}, readOp(f, 64<<10))
	if err != nil {
		t.Fatal(err)
	}
	// Warm-up: ceil(100ms/725us) = 138 ops; measured: ceil(1s/725us) = 1380 ops.
	if res.WarmupOps != 138 || res.Ops != 1380 {
		t.Errorf("warm-up %d ops, measured %d ops; want 138 and 1380", res.WarmupOps, res.Ops)
	}
	wantMiB := float64(64<<10) / MiB / 725e-6
	if !near(res.MiBPerSec, wantMiB) {
		t.Errorf("%.6f MiB/s, want %.6f", res.MiBPerSec, wantMiB)
	}
	l := res.Latency
	for name, v := range map[string]float64{"min": l.MinUS, "p50": l.P50US, "p99": l.P99US, "max": l.MaxUS, "mean": l.MeanUS} {
		if !near(v, 725) {
			t.Errorf("latency %s = %v us, want 725", name, v)
		}
	}
	if got := clk.Now().Sub(start); got != time.Duration(138+1380)*725*time.Microsecond {
		t.Errorf("clock advanced %v", got)
	}
}

func TestRepeatSpread(t *testing.T) {
	// The rate changes between runs: the spread shows it.
	clk, tfs, f := openThrottled(t, 1<<20, 100*MiB, 0)
	rates := []float64{100 * MiB, 200 * MiB, 400 * MiB}
	rep, err := RepeatFunc(context.Background(), 3, func(ctx context.Context, run int) (*Result, error) {
		tfs.(*ThrottledFS).BytesPerSec = rates[run]
		return Run(ctx, Options{Clock: clk, Count: 20}, readOp(f, 64<<10))
	})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.MiBPerSec
	if s.Runs != 3 || !near(s.Min, 100) || !near(s.Mean, 700.0/3) || !near(s.Max, 400) || !near(s.Stddev, math.Sqrt(70000.0/3)) {
		t.Errorf("spread %+v", s)
	}
	if rep.Latency.Count != 60 {
		t.Errorf("merged latency count %d", rep.Latency.Count)
	}
	if got := FormatSpread(s, "%.0f"); got != "233 ±153 (100-400, n=3)" {
		t.Errorf("FormatSpread = %q", got)
	}
}

func TestRunErrorStops(t *testing.T) {
	boom := errors.New("boom")
	_, err := Run(context.Background(), Options{Workers: 3, Count: 1000}, func(ctx context.Context, w int, seq int64) (int64, error) {
		if w == 1 && seq == 10 {
			return 0, boom
		}
		return 1, nil
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "worker 1") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Run(context.Background(), Options{}, nil); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("no duration or count: err = %v", err)
	}
}

func TestAggregateArithmetic(t *testing.T) {
	t0 := time.Unix(0, 0)
	s := func(start, end float64, mib int64) Span {
		return Span{Start: t0.Add(time.Duration(start * float64(time.Second))),
			End: t0.Add(time.Duration(end * float64(time.Second))), Bytes: mib * MiB, Ops: mib}
	}
	// Two workers of 100 MiB each, one second each, but staggered by one
	// second: each alone saw 100 MiB/s, so the naive sum says 200, while
	// the storage moved 200 MiB in 2 s: 100 MiB/s.
	a := AggregateOf([]Span{s(0, 1, 100), s(1, 2, 100)})
	if !near(a.AggregateMiBPerSec, 100) || !near(a.NaiveSumMiBPerSec, 200) || !near(a.Seconds, 2) {
		t.Errorf("staggered: %+v", a)
	}
	if !near(a.StartSkewSeconds, 1) || a.TotalBytes != 200*MiB || a.Workers != 2 {
		t.Errorf("staggered: %+v", a)
	}
	// Perfectly overlapping workers: both figures agree.
	a = AggregateOf([]Span{s(0, 2, 100), s(0, 2, 300)})
	if !near(a.AggregateMiBPerSec, 200) || !near(a.NaiveSumMiBPerSec, 200) {
		t.Errorf("overlapping: %+v", a)
	}
	// A straggler: 3 workers, the last ends at 4 s.
	a = AggregateOf([]Span{s(0, 1, 100), s(0.5, 1, 50), s(0, 4, 100)})
	if !near(a.AggregateMiBPerSec, 250.0/4) || !near(a.NaiveSumMiBPerSec, 100+100+25) {
		t.Errorf("straggler: %+v", a)
	}
	if !near(a.SlowestWorkerSeconds, 4) || !near(a.FastestWorkerSeconds, 0.5) {
		t.Errorf("straggler: %+v", a)
	}
	if a := AggregateOf(nil); a.AggregateMiBPerSec != 0 || a.Workers != 0 {
		t.Errorf("empty: %+v", a)
	}
	c := Compare("MiB/s", 90, 100, "fio")
	if !near(c.Ratio, 0.9) || FormatRatio(c.Ratio) != "0.90x" || FormatRatio(Compare("x", 1, 0, "").Ratio) != "-" {
		t.Errorf("compare %+v", c)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Microsecond)
	}
	l := Summarize(s)
	if l.P50US != 50 || l.P90US != 90 || l.P99US != 99 || l.MaxUS != 100 || l.MinUS != 1 || l.MeanUS != 50.5 || l.Count != 100 {
		t.Errorf("%+v", l)
	}
	if (Summarize(nil) != Latency{}) {
		t.Error("empty summary")
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{"4K": 4096, "4k": 4096, "1M": 1 << 20, "2G": 2 << 30, "1.5G": 3 << 29,
		"4096": 4096, "64KiB": 64 << 10, "512MB": 512 << 20} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "K", "4Q", "-1M", "1..2M", "abc"} {
		if _, err := ParseSize(bad); !errors.Is(err, ErrBadArg) {
			t.Errorf("ParseSize(%q): err = %v", bad, err)
		}
	}
	if v, err := ParseSizes("4K, 64K,1M"); err != nil || len(v) != 3 || v[2] != 1<<20 {
		t.Errorf("ParseSizes: %v %v", v, err)
	}
	if _, err := ParseInts("1,0"); !errors.Is(err, ErrBadArg) {
		t.Errorf("ParseInts zero: %v", err)
	}
	if n, size, err := ParseCountSize("8x512M"); err != nil || n != 8 || size != 512<<20 {
		t.Errorf("ParseCountSize: %d %d %v", n, size, err)
	}
	for _, bad := range []string{"8", "0x1M", "8x", "x1M", "8x0"} {
		if _, _, err := ParseCountSize(bad); !errors.Is(err, ErrBadArg) {
			t.Errorf("ParseCountSize(%q): %v", bad, err)
		}
	}
	for _, n := range []int64{4096, 1 << 20, 3 << 30, 1000} {
		if got, _ := ParseSize(FormatSize(n)); got != n {
			t.Errorf("FormatSize(%d) = %q does not round-trip", n, FormatSize(n))
		}
	}
}

func TestTable(t *testing.T) {
	tb := Table{Title: "T", Header: []string{"bs", "MiB/s", "note"}, Notes: []string{"n1"}}
	tb.AddRow("4K", "12.5", "ok")
	tb.AddRow("1M", "1234.0", "best")
	var b bytes.Buffer
	if err := tb.Write(&b); err != nil {
		t.Fatal(err)
	}
	want := "T\nbs   MiB/s  note\n--  ------  ----\n4K    12.5  ok\n1M  1234.0  best\nn1\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestIOConfigRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "io.json")
	c := IOConfig{Mode: "read", BlockSize: 1 << 20, QueueDepth: 16, Threads: 4, Direct: true, MiBPerSec: 1234.5,
		MeasuredAt: time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC), Source: "ffkit bench sweep"}
	if err := WriteIOConfig(p, c); err != nil {
		t.Fatal(err)
	}
	got, err := ReadIOConfig(p)
	c.Version = IOConfigVersion
	if err != nil || got != c {
		t.Fatalf("read back %+v, %v; want %+v", got, err, c)
	}
	for _, bad := range []string{`{"version":1,"mode":"read","block_size":0,"queue_depth":1,"threads":1}`,
		`{"version":9,"mode":"read","block_size":4096,"queue_depth":1,"threads":1}`, `{not json`} {
		os.WriteFile(p, []byte(bad), 0o644)
		if _, err := ReadIOConfig(p); !errors.Is(err, ErrBadIOConfig) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: err = %v", bad, err)
		}
	}
}

func TestFinishCountsInSpan(t *testing.T) {
	// Writes at 64 MiB/s through the throttle, then a Finish (the fsync)
	// that costs 1 s: the rate counts both.
	clk := NewManualClock(time.Unix(0, 0))
	dir := t.TempDir()
	tfs := NewThrottledFS(localfs.New(), clk, 64*MiB, 0)
	wr, err := tfs.Create(context.Background(), filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer wr.Close()
	p := NewPattern(1<<20, 1)
	res, err := Run(context.Background(), Options{Clock: clk, Count: 64,
		Finish: func(ctx context.Context, w int) error { clk.Advance(time.Second); return wr.Commit() }},
		func(ctx context.Context, w int, seq int64) (int64, error) {
			n, err := wr.Write(p.Chunk(seq<<20, 1<<20))
			return int64(n), err
		})
	if err != nil {
		t.Fatal(err)
	}
	if !near(res.MiBPerSec, 32) || !near(res.Seconds, 2) {
		t.Errorf("%.6f MiB/s over %.6fs; want 32 MiB/s over 2s", res.MiBPerSec, res.Seconds)
	}
	if res.Latency.MaxUS != 1e6/64 {
		t.Errorf("write latency max %v us, want %v (Finish is not an op)", res.Latency.MaxUS, 1e6/64)
	}
	st, err := os.Stat(filepath.Join(dir, "f"))
	if err != nil || st.Size() != 64<<20 {
		t.Fatalf("committed file: %v %v", st, err)
	}
}

func TestWorkdirCleanup(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	os.WriteFile(filepath.Join(parent, "theirs"), []byte("x"), 0o644)
	w, err := OpenWorkdir(ctx, parent, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(ctx, "ours", []byte("hdr"), 10<<20+3, 1<<20); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(parent, "ours"))
	if err != nil || len(b) != 10<<20+6 || string(b[:3]) != "hdr" {
		t.Fatalf("written %d bytes, %v", len(b), err)
	}
	// Chunks differ (stamped with their offset).
	if bytes.Equal(b[3:3+1<<20], b[3+1<<20:3+2<<20]) {
		t.Error("two chunks are identical")
	}
	if st, err := w.Cold(false, "ours"); err != nil || st == CacheWarm {
		t.Errorf("cold: %v %v", st, err)
	}
	if err := w.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(parent)
	if len(ents) != 1 || ents[0].Name() != "theirs" {
		t.Errorf("after cleanup: %v", ents)
	}
	// A directory the benchmark created is removed when empty.
	sub := filepath.Join(parent, "a", "b")
	w, err = OpenWorkdir(ctx, sub, false)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteFile(ctx, "x", nil, 10, 0)
	w.Cleanup(ctx)
	if _, err := os.Stat(filepath.Join(parent, "a")); !os.IsNotExist(err) {
		t.Errorf("created directories left: %v", err)
	}
	if _, err := OpenWorkdir(ctx, filepath.Join(parent, "theirs"), false); !errors.Is(err, ErrBadArg) {
		t.Errorf("file as workdir: %v", err)
	}
}
