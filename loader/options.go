package loader

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// Defaults of Options.
const (
	DefaultBatchSize    = 32
	DefaultWorkers      = 64
	DefaultPrefetch     = 4
	DefaultMemoryBudget = 1 << 30
	DefaultWindow       = 16
	DefaultWatchdog     = 5 * time.Minute
)

// BadSamplePolicy says what to do with a sample that cannot be read (bad
// checksum, truncated file, read error).
type BadSamplePolicy int

const (
	// Fail stops the loader: Next returns the error naming the sample.
	Fail BadSamplePolicy = iota
	// Skip logs the bad sample (file and index) and substitutes another
	// sample of the same batch for it, so epoch length, batch sizes and
	// rank balance stay intact.
	Skip
)

func (p BadSamplePolicy) String() string {
	switch p {
	case Fail:
		return "fail"
	case Skip:
		return "skip"
	}
	return fmt.Sprintf("BadSamplePolicy(%d)", int(p))
}

// MarshalText writes "fail" or "skip".
func (p BadSamplePolicy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads "fail" or "skip".
func (p *BadSamplePolicy) UnmarshalText(b []byte) error {
	switch string(b) {
	case "fail", "":
		*p = Fail
	case "skip":
		*p = Skip
	default:
		return fmt.Errorf("%w: bad-sample policy %q, want fail or skip", ErrOptions, b)
	}
	return nil
}

// Sample is what a SampleTransform receives.
type Sample struct {
	Pos    int    // position in the batch
	Source int    // dataset of a mixture (0 for one dataset)
	Index  int64  // sample index in its dataset
	Seed   uint64 // SampleSeed(seed, epoch, source, index)
	Data   []byte // the sample's bytes: read-only (a substitute shares another position's bytes)
}

// Options configure a Loader. The zero value of each field is its default.
// The plain fields have JSON names, so a front end in another process (the
// Python package) can send them as a JSON object.
type Options struct {
	// BatchSize is the number of samples per batch on each rank. Default 32.
	BatchSize int `json:"batch_size"`
	// Shuffle delivers each epoch in a pseudorandom order (an exact
	// permutation of the samples) instead of index order. Default off.
	Shuffle bool `json:"shuffle"`
	// BlockSize > 0 turns the shuffle into a block shuffle: the order of
	// blocks of BlockSize consecutive samples is permuted, then samples are
	// permuted within windows of Window consecutive blocks (see doc.go).
	// Needs Shuffle. Default 0 (shuffle single samples).
	BlockSize int64 `json:"block_size"`
	// Window is the number of blocks shuffled together. Default 16.
	Window int64 `json:"window"`
	// Seed keys the shuffle and the per-sample seeds. Default 0.
	Seed uint64 `json:"seed"`
	// DropLast drops what does not fill a whole batch on every rank;
	// otherwise the last batch of an epoch may be short. Default off.
	DropLast bool `json:"drop_last"`
	// Rank and WorldSize: this process's share. Default rank 0 of 1.
	Rank      int `json:"rank"`
	WorldSize int `json:"world_size"`
	// StartEpoch is the first epoch; Epochs the number of epochs (< 0:
	// unlimited). Defaults 0 and 1.
	StartEpoch int64 `json:"start_epoch"`
	Epochs     int64 `json:"epochs"`
	// Workers is the number of reads in flight per batch. Default 64.
	Workers int `json:"workers"`
	// MaxInFlight bounds the reads in flight of all prefetched batches
	// together, shared without dividing it (see ffrecord.ReadOptions). 0:
	// Workers per batch, Prefetch batches at once, nothing shared.
	MaxInFlight int `json:"max_in_flight,omitempty"`
	// Prefetch is the number of batches read at once; up to twice as many
	// are planned (and hold memory) ahead of the consumer. Default 4.
	Prefetch int `json:"prefetch"`
	// MemoryBudget bounds the bytes of batch buffers held at once, from
	// the read until Release (see doc.go). Default 1 GiB.
	MemoryBudget int64 `json:"memory_budget"`
	// NoVerify skips the per-sample CRC-32 checks. Default: verify.
	NoVerify bool `json:"no_verify"`
	// Direct reads with O_DIRECT (no page cache). Default off.
	Direct bool `json:"direct"`
	// DirectAuto chooses buffered or direct reads per dataset at Open, by
	// ffrecord's rule (O_DIRECT only for a dataset much larger than the
	// memory the page cache can use; see ffrecord/direct.go); Direct is
	// then ignored. Stats.DirectChoice reports the choice. Default off.
	DirectAuto bool `json:"direct_auto,omitempty"`
	// MergeGap is ffrecord's gap for merging neighbouring reads (0:
	// ffrecord's default, < 0: never merge).
	MergeGap int64 `json:"merge_gap"`
	// SampleTransform, when set, runs on every sample of a batch, on up to
	// TransformWorkers goroutines; its result lands in Batch.Outputs.
	SampleTransform func(ctx context.Context, s Sample) (any, error) `json:"-"`
	// BatchTransform, when set, runs once per batch after the sample
	// transforms, and may set Batch.Value.
	BatchTransform func(ctx context.Context, b *Batch) error `json:"-"`
	// TransformWorkers bounds parallel sample transforms. Default GOMAXPROCS.
	TransformWorkers int `json:"transform_workers"`
	// BadSamples is the bad-sample policy. Default Fail.
	BadSamples BadSamplePolicy `json:"bad_samples"`
	// Log receives skipped-sample notices and watchdog reports. Default:
	// discard.
	Log func(msg string) `json:"-"`
	// Watchdog: when Next has waited this long for a batch, the loader
	// logs which stage is stuck and on which file, and again after every
	// further period. Default 5 minutes; < 0 disables.
	Watchdog time.Duration `json:"watchdog_ns"`
	// FailOnStall makes Next return ErrStalled (with the report) instead
	// of waiting on after the first watchdog report.
	FailOnStall bool `json:"fail_on_stall"`
	// Arena, when set, provides the batch buffers (e.g. shared memory).
	Arena Arena `json:"-"`
	// Weights makes a weighted mixture of several datasets (OpenMixture,
	// NewMixture): one positive weight per dataset.
	Weights []float64 `json:"weights"`
	// MixtureEpoch is a mixture epoch's length in samples. Default: the
	// sum of the datasets' sizes.
	MixtureEpoch int64 `json:"mixture_epoch"`
}

func (o *Options) fill() {
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.WorldSize == 0 {
		o.WorldSize = 1
	}
	if o.Epochs == 0 {
		o.Epochs = 1
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.Prefetch == 0 {
		o.Prefetch = DefaultPrefetch
	}
	if o.MemoryBudget == 0 {
		o.MemoryBudget = DefaultMemoryBudget
	}
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	if o.TransformWorkers == 0 {
		o.TransformWorkers = runtime.GOMAXPROCS(0)
	}
	if o.Watchdog == 0 {
		o.Watchdog = DefaultWatchdog
	}
	if o.Log == nil {
		o.Log = func(string) {}
	}
}

// Validate checks the options (defaults filled in for zero fields).
func (o Options) Validate() error {
	o.fill()
	switch {
	case o.BatchSize < 1:
		return fmt.Errorf("%w: batch size %d, want at least 1", ErrOptions, o.BatchSize)
	case o.WorldSize < 1:
		return fmt.Errorf("%w: world size %d, want at least 1", ErrOptions, o.WorldSize)
	case o.Rank < 0 || o.Rank >= o.WorldSize:
		return fmt.Errorf("%w: rank %d outside world size %d (want 0..%d)", ErrOptions, o.Rank, o.WorldSize, o.WorldSize-1)
	case o.StartEpoch < 0:
		return fmt.Errorf("%w: start epoch %d is negative", ErrOptions, o.StartEpoch)
	case o.Workers < 1:
		return fmt.Errorf("%w: workers %d, want at least 1", ErrOptions, o.Workers)
	case o.MaxInFlight < 0:
		return fmt.Errorf("%w: max in flight %d is negative", ErrOptions, o.MaxInFlight)
	case o.Prefetch < 1:
		return fmt.Errorf("%w: prefetch %d, want at least 1 batch", ErrOptions, o.Prefetch)
	case o.MemoryBudget < 1:
		return fmt.Errorf("%w: memory budget %d bytes", ErrOptions, o.MemoryBudget)
	case o.BlockSize < 0:
		return fmt.Errorf("%w: block size %d is negative", ErrOptions, o.BlockSize)
	case o.BlockSize > 0 && !o.Shuffle:
		return fmt.Errorf("%w: a block size needs shuffling on", ErrOptions)
	case o.Window < 1:
		return fmt.Errorf("%w: window %d blocks, want at least 1", ErrOptions, o.Window)
	case o.TransformWorkers < 1:
		return fmt.Errorf("%w: transform workers %d", ErrOptions, o.TransformWorkers)
	case o.BadSamples != Fail && o.BadSamples != Skip:
		return fmt.Errorf("%w: unknown bad-sample policy %d", ErrOptions, int(o.BadSamples))
	case o.MixtureEpoch < 0:
		return fmt.Errorf("%w: mixture epoch %d is negative", ErrOptions, o.MixtureEpoch)
	}
	return nil
}

// spec is the order spec for a stream of n items.
func (o *Options) spec(n int64) OrderSpec {
	s := OrderSpec{N: n, Seed: o.Seed, BlockSize: o.BlockSize, Window: o.Window}
	switch {
	case !o.Shuffle:
		s.Mode = Sequential
	case o.BlockSize > 0:
		s.Mode = Block
	default:
		s.Mode = Global
	}
	return s
}
