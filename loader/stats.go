package loader

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// counters are the loader's running statistics, updated atomically by the
// pipeline and Next.
type counters struct {
	batches, samples, bytes atomic.Int64
	skipped, stalls         atomic.Int64
	firstNanos              atomic.Int64 // time to first batch, from Open
	waitNanos               atomic.Int64 // time Next blocked
	readNanos               atomic.Int64 // time spent in dataset reads, summed over batches
	transformNanos          atomic.Int64
}

// Stats is a snapshot of what the loader has done since it was opened.
type Stats struct {
	Batches int64 `json:"batches"`
	Samples int64 `json:"samples"`
	Bytes   int64 `json:"bytes"`
	// Elapsed is the time since the loader was opened.
	Elapsed      time.Duration `json:"elapsed_ns"`
	SamplesPerS  float64       `json:"samples_per_s"`
	BytesPerS    float64       `json:"bytes_per_s"`
	FirstBatch   time.Duration `json:"time_to_first_batch_ns"`
	ConsumerWait time.Duration `json:"consumer_wait_ns"` // time Next spent blocked
	// ReadTime and TransformTime add up the time batches spent in reads
	// and transforms; with several batches in flight they can exceed
	// Elapsed.
	ReadTime      time.Duration `json:"read_ns"`
	TransformTime time.Duration `json:"transform_ns"`
	Skipped       int64         `json:"skipped_samples"`
	Stalls        int64         `json:"watchdog_reports"`
	MemoryHeld    int64         `json:"memory_held"`
	MemoryPeak    int64         `json:"memory_peak"`
	MemoryBudget  int64         `json:"memory_budget"`
	// DirectChoice says whether the dataset is read buffered or with
	// O_DIRECT, and why ("direct (auto: ...)", see Options.DirectAuto);
	// for a mixture, each dataset's in turn.
	DirectChoice string `json:"direct_choice"`
}

// Stats returns the loader's statistics so far.
func (l *Loader) Stats() Stats {
	s := Stats{
		Batches:       l.st.batches.Load(),
		Samples:       l.st.samples.Load(),
		Bytes:         l.st.bytes.Load(),
		Elapsed:       time.Since(l.start),
		FirstBatch:    time.Duration(l.st.firstNanos.Load()),
		ConsumerWait:  time.Duration(l.st.waitNanos.Load()),
		ReadTime:      time.Duration(l.st.readNanos.Load()),
		TransformTime: time.Duration(l.st.transformNanos.Load()),
		Skipped:       l.st.skipped.Load(),
		Stalls:        l.st.stalls.Load(),
		MemoryHeld:    l.budget.held.Load(),
		MemoryPeak:    l.budget.peak.Load(),
		MemoryBudget:  l.budget.limit,
		DirectChoice:  l.directChoice(),
	}
	if sec := s.Elapsed.Seconds(); sec > 0 {
		s.SamplesPerS = float64(s.Samples) / sec
		s.BytesPerS = float64(s.Bytes) / sec
	}
	return s
}

func (l *Loader) directChoice() string {
	if len(l.readers) == 1 {
		return l.readers[0].DirectChoice().String()
	}
	parts := make([]string, len(l.readers))
	for i, r := range l.readers {
		parts[i] = fmt.Sprintf("dataset %d: %s", i, r.DirectChoice())
	}
	return strings.Join(parts, "; ")
}
