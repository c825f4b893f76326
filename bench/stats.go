package bench

import (
	"math"
	"slices"
	"sync"
	"time"
)

// MiB is 2^20 bytes; every MiB/s figure in ffkit uses it.
const MiB = 1 << 20

// GiB is 2^30 bytes.
const GiB = 1 << 30

// Latency summarises per-operation latencies, in microseconds.
type Latency struct {
	Count  int     `json:"count"`
	MinUS  float64 `json:"min_us"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P90US  float64 `json:"p90_us"`
	P99US  float64 `json:"p99_us"`
	MaxUS  float64 `json:"max_us"`
}

// Recorder collects operation latencies. It keeps every sample (8 bytes
// each), so percentiles are exact. Safe for concurrent use; Run gives each
// worker its own and merges them, so the lock is uncontended there.
type Recorder struct {
	mu      sync.Mutex
	samples []time.Duration // guarded by mu
}

// Add records one operation's latency.
func (r *Recorder) Add(d time.Duration) {
	r.mu.Lock()
	r.samples = append(r.samples, d)
	r.mu.Unlock()
}

// Merge adds every sample of o to r.
func (r *Recorder) Merge(o *Recorder) {
	o.mu.Lock()
	s := slices.Clone(o.samples)
	o.mu.Unlock()
	r.mu.Lock()
	r.samples = append(r.samples, s...)
	r.mu.Unlock()
}

// Len is the number of samples recorded.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.samples)
}

// Summary computes the latency percentiles of the samples so far.
func (r *Recorder) Summary() Latency {
	r.mu.Lock()
	s := slices.Clone(r.samples)
	r.mu.Unlock()
	return Summarize(s)
}

// Summarize computes percentiles of samples (which it sorts in place).
// Percentiles use the nearest-rank method: p50 of 1..100 is 50.
func Summarize(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return Latency{
		Count:  len(samples),
		MinUS:  us(samples[0]),
		MeanUS: us(sum) / float64(len(samples)),
		P50US:  us(Percentile(samples, 50)),
		P90US:  us(Percentile(samples, 90)),
		P99US:  us(Percentile(samples, 99)),
		MaxUS:  us(samples[len(samples)-1]),
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted samples; 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

// Spread describes one figure over repeated runs.
type Spread struct {
	Runs   int     `json:"runs"`
	Min    float64 `json:"min"`
	Mean   float64 `json:"mean"`
	Max    float64 `json:"max"`
	Stddev float64 `json:"stddev"` // sample standard deviation (n-1); 0 for one run
}

// SpreadOf summarises values.
func SpreadOf(values []float64) Spread {
	if len(values) == 0 {
		return Spread{}
	}
	s := Spread{Runs: len(values), Min: values[0], Max: values[0]}
	var sum float64
	for _, v := range values {
		s.Min = min(s.Min, v)
		s.Max = max(s.Max, v)
		sum += v
	}
	s.Mean = sum / float64(len(values))
	if len(values) > 1 {
		var ss float64
		for _, v := range values {
			ss += (v - s.Mean) * (v - s.Mean)
		}
		s.Stddev = math.Sqrt(ss / float64(len(values)-1))
	}
	return s
}

// String formats the spread as "mean (min–max, n runs)".
func (s Spread) String() string { return FormatSpread(s, "%.1f") }

// Span is what one worker (a goroutine, a process, a client) did: the time
// its measured work started and ended and how much it moved.
type Span struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Bytes int64     `json:"bytes"`
	Ops   int64     `json:"ops"`
}

// Seconds is the span's length.
func (s Span) Seconds() float64 { return s.End.Sub(s.Start).Seconds() }

// Aggregate is the combined rate of parallel workers.
//
// The honest aggregate is total bytes over (last end - first start): the
// time the storage was actually busy serving the whole job. The naive sum
// of per-worker rates overstates it whenever workers do not run exactly
// together (a worker that ran alone for a moment had the device to itself);
// both are reported so the gap is visible.
type Aggregate struct {
	Workers              int     `json:"workers"`
	TotalBytes           int64   `json:"total_bytes"`
	TotalOps             int64   `json:"total_ops"`
	Seconds              float64 `json:"seconds"` // last end - first start
	AggregateBytesPerSec float64 `json:"aggregate_bytes_s"`
	AggregateMiBPerSec   float64 `json:"aggregate_mib_s"`
	AggregateOpsPerSec   float64 `json:"aggregate_ops_s"`
	NaiveSumMiBPerSec    float64 `json:"naive_sum_mib_s"`
	NaiveSumOpsPerSec    float64 `json:"naive_sum_ops_s"`
	SlowestWorkerSeconds float64 `json:"slowest_worker_seconds"`
	FastestWorkerSeconds float64 `json:"fastest_worker_seconds"`
	StartSkewSeconds     float64 `json:"start_skew_seconds"` // last start - first start
}

// AggregateOf combines the spans of parallel workers. Spans with zero
// length contribute their bytes to the aggregate but nothing to the naive
// sum (their own rate is undefined).
func AggregateOf(spans []Span) Aggregate {
	a := Aggregate{Workers: len(spans)}
	if len(spans) == 0 {
		return a
	}
	first, last := spans[0].Start, spans[0].End
	lastStart := spans[0].Start
	a.FastestWorkerSeconds = math.Inf(1)
	for _, s := range spans {
		a.TotalBytes += s.Bytes
		a.TotalOps += s.Ops
		if s.Start.Before(first) {
			first = s.Start
		}
		if s.Start.After(lastStart) {
			lastStart = s.Start
		}
		if s.End.After(last) {
			last = s.End
		}
		sec := s.Seconds()
		a.SlowestWorkerSeconds = max(a.SlowestWorkerSeconds, sec)
		a.FastestWorkerSeconds = min(a.FastestWorkerSeconds, sec)
		if sec > 0 {
			a.NaiveSumMiBPerSec += float64(s.Bytes) / MiB / sec
			a.NaiveSumOpsPerSec += float64(s.Ops) / sec
		}
	}
	a.Seconds = last.Sub(first).Seconds()
	a.StartSkewSeconds = lastStart.Sub(first).Seconds()
	if a.Seconds > 0 {
		a.AggregateBytesPerSec = float64(a.TotalBytes) / a.Seconds
		a.AggregateMiBPerSec = a.AggregateBytesPerSec / MiB
		a.AggregateOpsPerSec = float64(a.TotalOps) / a.Seconds
	}
	return a
}

// Comparison is our figure next to a baseline measured in the same run.
type Comparison struct {
	Metric   string  `json:"metric"` // what is compared, with its unit ("MiB/s", "IOPS", "p99 us")
	Ours     float64 `json:"ours"`
	Baseline float64 `json:"baseline"`
	// BaselineName says what the baseline is ("fio io_uring O_DIRECT", "plain pread").
	BaselineName string `json:"baseline_name"`
	// Ratio is Ours / Baseline; 0 when there is no baseline figure.
	Ratio float64 `json:"ratio"`
	// HigherIsBetter is false for latencies: a ratio below 1 is then good.
	HigherIsBetter bool `json:"higher_is_better"`
}

// Compare returns ours vs baseline for a figure where higher is better.
func Compare(metric string, ours, baseline float64, baselineName string) Comparison {
	c := Comparison{Metric: metric, Ours: ours, Baseline: baseline, BaselineName: baselineName, HigherIsBetter: true}
	if baseline > 0 {
		c.Ratio = ours / baseline
	}
	return c
}

// CompareLatency returns ours vs baseline for a figure where lower is better.
func CompareLatency(metric string, ours, baseline float64, baselineName string) Comparison {
	c := Compare(metric, ours, baseline, baselineName)
	c.HigherIsBetter = false
	return c
}
