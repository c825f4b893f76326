package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrBadOptions: benchmark options that make no sense.
var ErrBadOptions = errkind.New(errkind.Usage, "bench: bad options")

// Op is one measured operation. worker is 0..Workers-1; seq counts the
// worker's operations from 0, warm-up included (so an op can walk a file).
// It returns the bytes it moved (0 for operations without a payload).
type Op func(ctx context.Context, worker int, seq int64) (bytes int64, err error)

// Options say how long and how wide Run measures.
type Options struct {
	// Clock to read time from. Default Wall.
	Clock Clock
	// Workers run Op concurrently. Default 1.
	Workers int
	// Duration of each worker's measured phase. Zero: stop on Count only.
	// With a ManualClock, the ops must advance the clock (ThrottledFS
	// does) or the run never ends.
	Duration time.Duration
	// Count of measured ops per worker. Zero: stop on Duration only. When
	// both are set a worker stops at whichever comes first.
	Count int64
	// Warmup runs ops for this long before measuring; excluded from every figure.
	Warmup time.Duration
	// WarmupCount runs at least this many ops per worker before measuring.
	WarmupCount int64
	// Finish, if set, runs on each worker after its last measured op and
	// counts in its measured span (a writer's flush and fsync belong to
	// the cost of writing). Its time is not an op latency.
	Finish func(ctx context.Context, worker int) error
}

// Validate checks the options.
func (o Options) Validate() error {
	switch {
	case o.Workers < 0:
		return fmt.Errorf("%w: workers %d < 0", ErrBadOptions, o.Workers)
	case o.Duration < 0 || o.Warmup < 0:
		return fmt.Errorf("%w: negative duration", ErrBadOptions)
	case o.Count < 0 || o.WarmupCount < 0:
		return fmt.Errorf("%w: negative count", ErrBadOptions)
	case o.Duration == 0 && o.Count == 0:
		return fmt.Errorf("%w: neither a duration nor a count to run for", ErrBadOptions)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Clock == nil {
		o.Clock = Wall
	}
	if o.Workers == 0 {
		o.Workers = 1
	}
	return o
}

// Result is one measurement.
type Result struct {
	Workers int   `json:"workers"`
	Ops     int64 `json:"ops"`
	Bytes   int64 `json:"bytes"`
	// Seconds is the measured span: first worker's start to last worker's end.
	Seconds     float64 `json:"seconds"`
	OpsPerSec   float64 `json:"ops_s"`
	BytesPerSec float64 `json:"bytes_s"`
	MiBPerSec   float64 `json:"mib_s"`
	// NaiveSumMiBPerSec is the sum of per-worker rates, for comparison only.
	NaiveSumMiBPerSec float64 `json:"naive_sum_mib_s"`
	WarmupOps         int64   `json:"warmup_ops"`
	Latency           Latency `json:"latency"`
	// Spans has one entry per worker.
	Spans []Span `json:"-"`

	samples []time.Duration // every measured latency, for Repeat's merged percentiles
}

// ResultOf builds a Result from worker spans and latency samples, for
// benchmarks that time their workers themselves (processes, clients).
func ResultOf(spans []Span, samples []time.Duration, warmupOps int64) *Result {
	a := AggregateOf(spans)
	r := &Result{
		Workers:           a.Workers,
		Ops:               a.TotalOps,
		Bytes:             a.TotalBytes,
		Seconds:           a.Seconds,
		OpsPerSec:         a.AggregateOpsPerSec,
		BytesPerSec:       a.AggregateBytesPerSec,
		MiBPerSec:         a.AggregateMiBPerSec,
		NaiveSumMiBPerSec: a.NaiveSumMiBPerSec,
		WarmupOps:         warmupOps,
		Spans:             spans,
		samples:           samples,
	}
	r.Latency = Summarize(append([]time.Duration(nil), samples...))
	return r
}

// Aggregate returns the aggregate-bandwidth figures of the result's workers.
func (r *Result) Aggregate() Aggregate { return AggregateOf(r.Spans) }

// Run runs op on opts.Workers goroutines: first the warm-up (not
// measured), then, once every worker has warmed up, the measured phase.
// The first error stops every worker and is returned.
func Run(ctx context.Context, opts Options, op Op) (*Result, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	clk := opts.Clock
	spans := make([]Span, opts.Workers)
	lats := make([][]time.Duration, opts.Workers)
	warm := make([]int64, opts.Workers)

	// warmed is closed when every worker has finished its warm-up, so no
	// worker's measured phase overlaps another's warm-up.
	warmed := make(chan struct{})
	var pending atomic.Int64

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Workers)
	for w := range opts.Workers {
		g.Go(func() error {
			var seq int64
			if opts.Warmup > 0 || opts.WarmupCount > 0 {
				ws := clk.Now()
				for seq < opts.WarmupCount || (opts.Warmup > 0 && clk.Now().Sub(ws) < opts.Warmup) {
					if err := gctx.Err(); err != nil {
						return err
					}
					if _, err := op(gctx, w, seq); err != nil {
						return fmt.Errorf("warm-up op %d of worker %d: %w", seq, w, err)
					}
					seq++
				}
			}
			warm[w] = seq
			if pending.Add(1) == int64(opts.Workers) {
				close(warmed)
			}
			select {
			case <-warmed:
			case <-gctx.Done():
				return gctx.Err()
			}

			var bytes, ops int64
			lat := make([]time.Duration, 0, 1024)
			start := clk.Now()
			end := start
			for {
				if opts.Count > 0 && ops >= opts.Count {
					break
				}
				if opts.Duration > 0 && end.Sub(start) >= opts.Duration {
					break
				}
				if err := gctx.Err(); err != nil {
					return err
				}
				t0 := clk.Now()
				n, err := op(gctx, w, seq)
				t1 := clk.Now()
				if err != nil {
					return fmt.Errorf("op %d of worker %d: %w", seq, w, err)
				}
				lat = append(lat, t1.Sub(t0))
				bytes += n
				ops++
				seq++
				end = t1
			}
			if opts.Finish != nil {
				if err := opts.Finish(gctx, w); err != nil {
					return fmt.Errorf("finish worker %d: %w", w, err)
				}
				end = clk.Now()
			}
			spans[w] = Span{Start: start, End: end, Bytes: bytes, Ops: ops}
			lats[w] = lat
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var all []time.Duration
	var warmOps int64
	for w := range opts.Workers {
		all = append(all, lats[w]...)
		warmOps += warm[w]
	}
	return ResultOf(spans, all, warmOps), nil
}

// Repeated is a measurement taken several times.
type Repeated struct {
	Runs []*Result `json:"-"`
	// MiBPerSec, OpsPerSec: spread of the per-run figures.
	MiBPerSec Spread `json:"mib_s"`
	OpsPerSec Spread `json:"ops_s"`
	// Latency is over the samples of all runs together.
	Latency Latency `json:"latency"`
	// NaiveSumMiBPerSec: mean over runs of the naive per-worker sum.
	NaiveSumMiBPerSec float64 `json:"naive_sum_mib_s"`
}

// Repeat runs the same measurement runs times (at least once).
func Repeat(ctx context.Context, runs int, opts Options, op Op) (*Repeated, error) {
	return RepeatFunc(ctx, runs, func(ctx context.Context, run int) (*Result, error) {
		return Run(ctx, opts, op)
	})
}

// RepeatFunc calls measure runs times (at least once) and summarises the
// results; measure may prepare each run (drop caches, rewrite a file).
func RepeatFunc(ctx context.Context, runs int, measure func(ctx context.Context, run int) (*Result, error)) (*Repeated, error) {
	if runs < 1 {
		runs = 1
	}
	var results []*Result
	for i := range runs {
		r, err := measure(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("run %d of %d: %w", i+1, runs, err)
		}
		results = append(results, r)
	}
	return Combine(results), nil
}

// Combine summarises results of the same measurement taken several times.
func Combine(results []*Result) *Repeated {
	rep := &Repeated{Runs: results}
	var mibs, opss []float64
	var all []time.Duration
	for _, r := range results {
		mibs = append(mibs, r.MiBPerSec)
		opss = append(opss, r.OpsPerSec)
		rep.NaiveSumMiBPerSec += r.NaiveSumMiBPerSec / float64(len(results))
		all = append(all, r.samples...)
	}
	rep.MiBPerSec = SpreadOf(mibs)
	rep.OpsPerSec = SpreadOf(opss)
	rep.Latency = Summarize(all)
	return rep
}
