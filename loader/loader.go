package loader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/internal/errkind"
)

// Loader delivers batches of one rank's share of a dataset (or of a
// weighted mixture of datasets), epoch after epoch, in an order that is a
// pure function of the options (see doc.go).
type Loader struct {
	opts    Options
	readers []*ffrecord.Reader
	owned   bool // Close closes the readers
	mix     *mixture
	items   int64 // length of an epoch's stream
	spec    OrderSpec
	fp      json.RawMessage
	arena   Arena
	budget  *budget
	start   time.Time

	// mu guards the fields below. Next, SetEpoch, Restore, State and Close
	// take it briefly; the pipeline goroutines never do.
	mu       sync.Mutex
	pos      position // after the last batch returned by Next
	endEpoch int64    // first epoch not to deliver (< 0: unlimited)
	run      *run     // the pipeline producing from pos, or nil
	inNext   bool     // a Next is waiting for a batch without holding mu
	err      error    // sticky error, returned by every Next
	closed   bool

	bad badSet
	st  counters
}

// position is where the consumer stands: epoch, cursor into the epoch's
// global stream, and batches taken this epoch.
type position struct {
	epoch, cursor, step int64
}

// Open opens a dataset (ffrecord paths: files or directories of *.ffr,
// local or ffkit:// URLs) and returns a Loader over it. Close closes it.
func Open(ctx context.Context, paths []string, opts Options) (*Loader, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	r, err := ffrecord.Open(ctx, paths, readOptions(&opts))
	if err != nil {
		return nil, err
	}
	l, err := newLoader([]*ffrecord.Reader{r}, opts, true)
	if err != nil {
		r.Close()
		return nil, err
	}
	return l, nil
}

// OpenMixture opens several datasets, each a list of ffrecord paths, and
// mixes them with opts.Weights.
func OpenMixture(ctx context.Context, datasets [][]string, opts Options) (*Loader, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if len(opts.Weights) != len(datasets) {
		return nil, fmt.Errorf("%w: %d datasets but %d weights", ErrOptions, len(datasets), len(opts.Weights))
	}
	var rs []*ffrecord.Reader
	closeAll := func() {
		for _, r := range rs {
			r.Close()
		}
	}
	for _, paths := range datasets {
		r, err := ffrecord.Open(ctx, paths, readOptions(&opts))
		if err != nil {
			closeAll()
			return nil, err
		}
		rs = append(rs, r)
	}
	l, err := newLoader(rs, opts, true)
	if err != nil {
		closeAll()
		return nil, err
	}
	return l, nil
}

// New returns a Loader over readers the caller opened (one dataset, or a
// mixture when opts.Weights is set). Close does not close them. The
// readers' own options (Direct, NoVerify, parallelism) apply; the
// corresponding Options fields are ignored.
func New(readers []*ffrecord.Reader, opts Options) (*Loader, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return newLoader(readers, opts, false)
}

func readOptions(o *Options) ffrecord.ReadOptions {
	o.fill()
	warn := o.Log
	// Under the Skip policy a damaged file does not stop the dataset: its
	// unreadable samples are skipped like bad samples.
	return ffrecord.ReadOptions{Direct: o.Direct, DirectAuto: o.DirectAuto, NoVerify: o.NoVerify, Parallelism: o.Workers, MaxInFlight: o.MaxInFlight,
		MergeGap: o.MergeGap, Warn: func(s string) { warn("ffrecord: warning: " + s) }, AllowDamaged: o.BadSamples == Skip}
}

// datasetFingerprint is what State.Dataset holds.
type datasetFingerprint struct {
	Sources      []ffrecord.Fingerprint `json:"sources"`
	Weights      []float64              `json:"weights,omitempty"`
	MixtureEpoch int64                  `json:"mixture_epoch,omitempty"`
}

func newLoader(readers []*ffrecord.Reader, opts Options, owned bool) (*Loader, error) {
	opts.fill()
	if len(readers) == 0 {
		return nil, fmt.Errorf("%w: no dataset", ErrOptions)
	}
	l := &Loader{opts: opts, readers: readers, owned: owned, start: time.Now()}
	fp := datasetFingerprint{}
	for _, r := range readers {
		fp.Sources = append(fp.Sources, r.Fingerprint())
	}
	if opts.Weights != nil || len(readers) > 1 {
		sizes := make([]int64, len(readers))
		for i, r := range readers {
			sizes[i] = r.N()
		}
		if opts.BlockSize > 0 {
			return nil, fmt.Errorf("%w: block shuffle works on one dataset, not a mixture", ErrOptions)
		}
		m, err := newMixture(sizes, opts.Weights, opts.MixtureEpoch, opts.Seed, opts.Shuffle)
		if err != nil {
			return nil, err
		}
		l.mix = m
		l.items = m.len
		fp.Weights = opts.Weights
		fp.MixtureEpoch = m.len
	} else {
		l.items = readers[0].N()
	}
	if l.items == 0 {
		return nil, fmt.Errorf("%w: the dataset has no samples", ErrOptions)
	}
	l.spec = opts.spec(l.items)
	if err := l.spec.Validate(); err != nil {
		return nil, err
	}
	if lay := l.layout(0); lay.Batches() == 0 {
		return nil, fmt.Errorf("%w: %d samples give no full batch of %d on each of %d ranks (drop-last)",
			ErrOptions, l.items, opts.BatchSize, opts.WorldSize)
	}
	b, err := json.Marshal(fp)
	if err != nil {
		return nil, err
	}
	l.fp = b
	l.budget = newBudget(opts.MemoryBudget)
	l.arena = opts.Arena
	if l.arena == nil {
		l.arena = newHeapArena(l.budget)
	}
	l.pos = position{epoch: opts.StartEpoch}
	l.endEpoch = l.epochEnd(opts.StartEpoch)
	l.bad.m = map[sampleKey]bool{}
	for src, r := range readers {
		for _, d := range r.Damaged() {
			l.opts.Log(fmt.Sprintf("loader: %s of dataset %d is damaged: its samples %d..%d (%d of %d) will be skipped like bad samples: %v",
				d.Path, src, d.First+d.Readable, d.First+d.Samples-1, d.Samples-d.Readable, d.Samples, d.Err))
		}
	}
	return l, nil
}

func (l *Loader) epochEnd(from int64) int64 {
	if l.opts.Epochs < 0 {
		return -1
	}
	return from + l.opts.Epochs
}

func (l *Loader) layout(start int64) Layout {
	return Layout{N: l.items, World: int64(l.opts.WorldSize), Rank: int64(l.opts.Rank),
		Batch: int64(l.opts.BatchSize), DropLast: l.opts.DropLast, Start: start}
}

// Len is the number of samples of one epoch's stream (the dataset's
// sample count, or a mixture's epoch length).
func (l *Loader) Len() int64 { return l.items }

// BatchesPerEpoch is the number of batches each rank gets in a full epoch.
func (l *Loader) BatchesPerEpoch() int64 { return l.layout(0).Batches() }

// Readers returns the datasets the loader reads.
func (l *Loader) Readers() []*ffrecord.Reader { return l.readers }

// Batch is one batch of samples, in delivery order. All samples are
// subslices of Data, which the Loader owns: they stay valid and unchanged
// until Release, after which the memory is reused. A Batch belongs to the
// goroutine that got it from Next.
type Batch struct {
	Epoch int64
	// Step is the batch's number in the epoch on this rank.
	Step    int64
	Indices []int64  // sample index of each entry in its dataset
	Sources []int    // dataset of each entry (a mixture), else nil
	Seeds   []uint64 // per-sample augmentation seeds
	Samples [][]byte // the samples, subslices of Data
	Data    []byte   // the buffer holding the samples
	// Slot is the Arena slot of Data (for a SlabArena: the slot index).
	Slot int
	// Padded counts the entries at the end that repeat earlier samples to
	// make the epoch divisible by the world size.
	Padded int
	// Substituted lists the positions whose bad sample was replaced by
	// another sample of the batch (BadSamples: Skip).
	Substituted []int
	// Outputs holds SampleTransform's results; Value BatchTransform's.
	Outputs []any
	Value   any

	state    State
	bytes    int64
	weight   int64
	released atomic.Bool
	l        *Loader
}

// Release hands the batch's memory back for reuse. Calling it twice, or
// after Close, is harmless. Samples must not be used afterwards.
func (b *Batch) Release() {
	if b == nil || b.l == nil || !b.released.CompareAndSwap(false, true) {
		return
	}
	b.l.arena.Free(b.Slot)
	b.l.budget.release(b.bytes, b.weight)
}

// Offset is the byte offset of sample i inside Data (for handing the batch
// to another process as one buffer plus offsets and lengths). A
// substituted sample has the offset of the sample it repeats.
func (b *Batch) Offset(i int) int64 {
	s := b.Samples[i]
	if len(s) == 0 {
		return 0
	}
	return int64(uintptr(unsafe.Pointer(unsafe.SliceData(s))) - uintptr(unsafe.Pointer(unsafe.SliceData(b.Data))))
}

// Bytes is the total size of the samples.
func (b *Batch) Bytes() int64 {
	var n int64
	for _, s := range b.Samples {
		n += int64(len(s))
	}
	return n
}

// State is the loader state once this batch is consumed: checkpoint it
// together with the model step that consumed the batch.
func (b *Batch) State() State { return b.state }

// job is one batch on its way through the pipeline.
type job struct {
	b       *Batch
	pos     position // the consumer's position after this batch
	items   []int64  // sample index per entry
	sources []int
	done    chan struct{}
	err     error
	stage   atomic.Value // string: what the job is doing
	started time.Time
}

// run is one pipeline: a producer goroutine that plans batches in order
// and takes memory for them in order, at most 2*Prefetch batches ahead of
// the consumer, and Prefetch reader goroutines that read the planned
// batches, each taking the next one as soon as it is done.
type run struct {
	ctx    context.Context
	cancel context.CancelFunc
	queue  chan *job // batches in order, for the consumer; closed when the producer ends
	work   chan *job // the same batches, for the readers; closed when the producer ends
	wg     sync.WaitGroup
	err    error        // the producer's error, set before queue is closed
	stage  atomic.Value // plannerStage: what the producer is doing
	// pending is the job taken from the queue that Next waits for; only
	// the consumer (Next, under no lock but one at a time) and stopLocked
	// touch it.
	pending *job
}

func (l *Loader) startRunLocked() {
	ctx, cancel := context.WithCancel(context.Background())
	ahead := 2 * l.opts.Prefetch
	r := &run{ctx: ctx, cancel: cancel, queue: make(chan *job, ahead), work: make(chan *job, ahead+1)}
	r.stage.Store(plannerStage{what: "starting"})
	from, end := l.pos, l.endEpoch
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(r.queue)
		defer close(r.work)
		r.err = l.produce(r, from, end)
	}()
	// Readers take planned batches in order and go straight on to the
	// next one, so the device gets new reads without waiting for the
	// consumer, the planner or a new goroutine to be scheduled.
	for range l.opts.Prefetch {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for j := range r.work {
				if err := r.ctx.Err(); err != nil {
					j.err = err
				} else {
					j.err = l.fill(r.ctx, j)
				}
				close(j.done)
			}
		}()
	}
	l.run = r
}

// stopLocked cancels the pipeline, waits for its goroutines and frees the
// memory of batches it prepared that the consumer never got.
func (l *Loader) stopLocked() {
	r := l.run
	if r == nil {
		return
	}
	l.run = nil
	r.cancel()
	// A Next waiting in await owns r.pending and frees it when it returns
	// (it sees that the run was stopped); otherwise it is ours to free.
	if !l.inNext && r.pending != nil {
		j := r.pending
		r.pending = nil
		<-j.done
		l.freeUndelivered(j)
	}
	// Drain while waiting so a producer blocked on a full queue ends.
	for j := range r.queue {
		<-j.done
		l.freeUndelivered(j)
	}
	r.wg.Wait()
}

func (l *Loader) produce(r *run, from position, end int64) error {
	var positions []int64
	for epoch := from.epoch; end < 0 || epoch < end; epoch++ {
		start, step := int64(0), int64(0)
		if epoch == from.epoch {
			start, step = from.cursor, from.step
		}
		lay := l.layout(start)
		order := l.spec.Epoch(epoch)
		nb := lay.Batches()
		for k := int64(0); k < nb; k++ {
			if r.ctx.Err() != nil {
				return r.ctx.Err()
			}
			var padded int
			positions, padded = lay.BatchPositions(positions[:0], k)
			j := &job{done: make(chan struct{}), started: time.Now()}
			j.items = make([]int64, len(positions))
			if l.mix != nil {
				j.sources = make([]int, len(positions))
			}
			for i, p := range positions {
				v := order.At(p)
				if l.mix != nil {
					j.sources[i], j.items[i] = l.mix.at(epoch, v)
				} else {
					j.items[i] = v
				}
			}
			j.pos = position{epoch: epoch, cursor: lay.CursorAfter(k + 1), step: step + k + 1}
			if j.pos.cursor >= l.items {
				j.pos = position{epoch: epoch + 1}
			}
			b := &Batch{Epoch: epoch, Step: step + k, Indices: j.items, Sources: j.sources, Padded: padded, Slot: -1}
			b.Seeds = make([]uint64, len(j.items))
			for i, idx := range j.items {
				src := 0
				if j.sources != nil {
					src = j.sources[i]
				}
				b.Seeds[i] = SampleSeed(l.opts.Seed, epoch, src, idx)
			}
			j.b = b
			j.stage.Store("waiting to be planned")
			if err := l.prepare(r, j); err != nil {
				return err
			}
			j.stage.Store("waiting for a reader")
			r.stage.Store(plannerStage{what: "consumer"})
			select {
			case r.queue <- j:
			case <-r.ctx.Done():
				l.freeUndelivered(j)
				return r.ctx.Err()
			}
			// work has room for every job in the queue and the one Next
			// waits for, so this does not block for long; readers close
			// done even after cancellation, so Next and stopLocked never
			// wait forever.
			select {
			case r.work <- j:
			case <-r.ctx.Done():
				j.err = r.ctx.Err()
				close(j.done)
				return r.ctx.Err()
			}
		}
	}
	return nil
}

func (l *Loader) freeUndelivered(j *job) {
	if j.b != nil && j.b.l != nil {
		j.b.Release()
	}
}

// prepare sizes the batch, then takes memory for it from the budget and
// the arena. It runs on the producer, in batch order, which is what keeps
// the budget deadlock-free: memory goes to batches in the order the
// consumer takes them.
func (l *Loader) prepare(r *run, j *job) error {
	size, err := l.batchSize(j.items, j.sources)
	if err != nil {
		return err
	}
	take := size
	if a, ok := l.arena.(allocSizer); ok {
		take = a.AllocSize(size)
	}
	r.stage.Store(plannerStage{what: "budget", epoch: j.b.Epoch, step: j.b.Step, bytes: take})
	w, err := l.budget.acquire(r.ctx, take)
	if err != nil {
		return err
	}
	r.stage.Store(plannerStage{what: "arena", epoch: j.b.Epoch, step: j.b.Step, bytes: size})
	buf, slot, err := l.arena.Alloc(r.ctx, size)
	if err != nil {
		l.budget.release(take, w)
		return err
	}
	j.b.Data, j.b.Slot, j.b.bytes, j.b.weight, j.b.l = buf[:size], slot, take, w, l
	return nil
}

func (l *Loader) batchSize(items []int64, sources []int) (int64, error) {
	if sources == nil {
		return l.readers[0].BatchSize(items)
	}
	var total int64
	for i, idx := range items {
		_, _, n, err := l.readers[sources[i]].Locate(idx)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// fill reads the batch into its buffer and runs the transforms.
func (l *Loader) fill(ctx context.Context, j *job) error {
	b := j.b
	b.Samples = make([][]byte, len(j.items))
	j.stage.Store("reading")
	t0 := time.Now()
	err := l.read(ctx, j)
	l.st.readNanos.Add(int64(time.Since(t0)))
	if err != nil {
		return err
	}
	if l.opts.SampleTransform != nil {
		j.stage.Store("running the sample transform")
		t1 := time.Now()
		b.Outputs = make([]any, len(b.Samples))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(l.opts.TransformWorkers)
		for i := range b.Samples {
			g.Go(func() error {
				src := 0
				if b.Sources != nil {
					src = b.Sources[i]
				}
				out, err := l.opts.SampleTransform(gctx, Sample{Pos: i, Source: src, Index: b.Indices[i], Seed: b.Seeds[i], Data: b.Samples[i]})
				if err != nil {
					return fmt.Errorf("loader: transform of sample %d (epoch %d, batch %d, position %d): %w", b.Indices[i], b.Epoch, b.Step, i, err)
				}
				b.Outputs[i] = out
				return nil
			})
		}
		err := g.Wait()
		l.st.transformNanos.Add(int64(time.Since(t1)))
		if err != nil {
			return err
		}
	}
	if l.opts.BatchTransform != nil {
		j.stage.Store("running the batch transform")
		t1 := time.Now()
		err := l.opts.BatchTransform(ctx, b)
		l.st.transformNanos.Add(int64(time.Since(t1)))
		if err != nil {
			return fmt.Errorf("loader: batch transform (epoch %d, batch %d): %w", b.Epoch, b.Step, err)
		}
	}
	j.stage.Store("done")
	return nil
}

type sampleKey struct {
	source int
	index  int64
}

// badSet remembers samples found bad (BadSamples: Skip), so later batches
// substitute them without reading them again.
type badSet struct {
	mu sync.Mutex
	m  map[sampleKey]bool // guarded by mu
}

func (s *badSet) has(k sampleKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k]
}

// add records k and reports whether it was new.
func (s *badSet) add(k sampleKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[k] {
		return false
	}
	s.m[k] = true
	return true
}

// read fills b.Samples. Each dataset's part goes through the ffrecord
// batch planner (file-offset order, merged neighbours, parallel reads) and
// comes back in request order. With the Skip policy a bad sample is
// dropped from the request and its position later points at a good sample
// of the same batch.
func (l *Loader) read(ctx context.Context, j *job) error {
	b := j.b
	n := len(j.items)
	key := func(i int) sampleKey {
		if j.sources == nil {
			return sampleKey{0, j.items[i]}
		}
		return sampleKey{j.sources[i], j.items[i]}
	}
	for attempt := 0; ; attempt++ {
		// Which positions to read: all, less known-bad samples.
		good := make([]bool, n)
		anyGood := false
		for i := range good {
			good[i] = l.opts.BadSamples != Skip || !l.bad.has(key(i))
			anyGood = anyGood || good[i]
		}
		if !anyGood {
			return errkind.Wrap(errkind.Data, fmt.Errorf("loader: every sample of batch %d of epoch %d is bad (see the skipped-sample log)", b.Step, b.Epoch))
		}
		err := l.readPositions(ctx, j, good)
		if err == nil {
			l.substitute(j, good)
			return nil
		}
		var se *ffrecord.SampleError
		if ctx.Err() != nil {
			return ctx.Err()
		}
		src := 0
		if errors.As(err, &se) && j.sources != nil {
			src = sourceOf(err)
		}
		if l.opts.BadSamples != Skip || se == nil || se.Index < 0 || attempt > n {
			return l.batchError(j, err)
		}
		// Another batch may have found the same sample bad meanwhile; then
		// the next attempt leaves it out all the same.
		if l.bad.add(sampleKey{src, se.Index}) {
			l.st.skipped.Add(1)
			l.opts.Log(fmt.Sprintf("loader: skipping bad sample %d of dataset %d (%s, sample %d of the file, bytes [%d, %d)): %v",
				se.Index, src, se.Path, se.Local, se.Off, se.Off+se.Len, se.Err))
		}
	}
}

// sourceErr tags an error with the mixture source it came from.
type sourceErr struct {
	source int
	err    error
}

func (e *sourceErr) Error() string { return e.err.Error() }
func (e *sourceErr) Unwrap() error { return e.err }

func sourceOf(err error) int {
	var s *sourceErr
	if errors.As(err, &s) {
		return s.source
	}
	return 0
}

func (l *Loader) batchError(j *job, err error) error {
	return fmt.Errorf("loader: epoch %d batch %d: %w", j.b.Epoch, j.b.Step, err)
}

// readPositions reads the positions marked good into b.Data.
func (l *Loader) readPositions(ctx context.Context, j *job, good []bool) error {
	b := j.b
	nsrc := len(l.readers)
	var off int64
	for src := 0; src < nsrc; src++ {
		var idx []int64
		var at []int
		for i, g := range good {
			if g && (j.sources == nil || j.sources[i] == src) {
				idx = append(idx, j.items[i])
				at = append(at, i)
			}
		}
		if len(idx) == 0 {
			continue
		}
		r := l.readers[src]
		size, err := r.BatchSize(idx)
		if err != nil {
			return &sourceErr{src, err}
		}
		out, err := r.ReadBatchInto(ctx, idx, b.Data[off:off+size:off+size])
		if err != nil {
			return &sourceErr{src, err}
		}
		for k, i := range at {
			b.Samples[i] = out[k]
		}
		off += size
	}
	b.Data = b.Data[:off]
	return nil
}

// substitute points every position that was not read at the nearest
// following (cyclically) good position of the same batch.
func (l *Loader) substitute(j *job, good []bool) {
	b := j.b
	n := len(good)
	for i, g := range good {
		if g {
			continue
		}
		for d := 1; d < n; d++ {
			s := (i + d) % n
			if good[s] {
				b.Samples[i] = b.Samples[s]
				b.Indices[i] = b.Indices[s]
				if b.Sources != nil {
					b.Sources[i] = b.Sources[s]
				}
				b.Seeds[i] = b.Seeds[s]
				b.Substituted = append(b.Substituted, i)
				break
			}
		}
	}
}

// Next returns the next batch, or io.EOF after the last epoch. The caller
// owns the batch until it calls Release. Next is called from one goroutine
// at a time. An error other than io.EOF stops the loader: every later Next
// returns it (SetEpoch or Restore start afresh).
func (l *Loader) Next(ctx context.Context) (*Batch, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return nil, err
	}
	if l.run == nil {
		l.startRunLocked()
	}
	r := l.run
	l.inNext = true
	l.mu.Unlock()

	t0 := time.Now()
	j, err := l.await(ctx, r)
	wait := time.Since(t0)
	l.st.waitNanos.Add(int64(wait))

	l.mu.Lock()
	defer l.mu.Unlock()
	l.inNext = false
	if l.run != r {
		// Close, SetEpoch or Restore stopped the run while we waited: the
		// batch is stale, and the run's pending job is ours to free (its
		// goroutines have ended).
		if j != nil {
			l.freeUndelivered(j)
		}
		if p := r.pending; p != nil {
			r.pending = nil
			<-p.done
			l.freeUndelivered(p)
		}
		if l.closed {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("loader: SetEpoch or Restore was called while Next was waiting")
	}
	if err != nil {
		if err == io.EOF {
			l.stopLocked()
			return nil, io.EOF
		}
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			// The caller gave up; the pipeline goes on.
			return nil, err
		}
		l.err = err
		l.stopLocked()
		return nil, err
	}
	l.pos = j.pos
	b := j.b
	b.state = l.stateLocked()
	l.st.batches.Add(1)
	l.st.samples.Add(int64(len(b.Samples)))
	l.st.bytes.Add(b.Bytes())
	if l.st.firstNanos.Load() == 0 {
		l.st.firstNanos.Store(int64(time.Since(l.start)))
	}
	return b, nil
}

// await waits for the next job of r to be complete, reporting stalls. A
// job taken from the queue but not yet complete is kept in r.pending, so a
// Next abandoned by its caller's context loses nothing.
func (l *Loader) await(ctx context.Context, r *run) (*job, error) {
	var timer <-chan time.Time
	var t *time.Timer
	if l.opts.Watchdog > 0 {
		t = time.NewTimer(l.opts.Watchdog)
		defer t.Stop()
		timer = t.C
	}
	waited := time.Duration(0)
	for {
		var queue <-chan *job
		var done <-chan struct{}
		if r.pending == nil {
			queue = r.queue
		} else {
			done = r.pending.done
		}
		select {
		case j, ok := <-queue:
			if !ok {
				if r.err != nil {
					if errors.Is(r.err, context.Canceled) && r.ctx.Err() != nil {
						return nil, ErrClosed
					}
					return nil, r.err
				}
				return nil, io.EOF
			}
			r.pending = j
		case <-done:
			j := r.pending
			r.pending = nil
			if j.err != nil {
				l.freeUndelivered(j)
				return nil, j.err
			}
			return j, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer:
			waited += l.opts.Watchdog
			report := l.stallReport(r, r.pending, waited)
			l.opts.Log(report)
			l.st.stalls.Add(1)
			if l.opts.FailOnStall {
				return nil, fmt.Errorf("%w: %s", ErrStalled, report)
			}
			t.Reset(l.opts.Watchdog)
		}
	}
}

// plannerStage is what the producer is doing, formatted only for a
// watchdog report.
type plannerStage struct {
	what        string
	epoch, step int64
	bytes       int64
}

func (l *Loader) describe(s plannerStage) string {
	switch s.what {
	case "consumer":
		return fmt.Sprintf("waiting for the consumer: %d batches prefetched", l.opts.Prefetch)
	case "budget":
		return fmt.Sprintf("waiting for the memory budget: batch %d of epoch %d needs %d bytes; %d of %d bytes are held by %d batches not yet released",
			s.step, s.epoch, s.bytes, l.budget.held.Load(), l.budget.limit, l.budget.count.Load())
	case "arena":
		return fmt.Sprintf("waiting for a buffer of %d bytes from the arena for batch %d of epoch %d (batches not yet released hold its slots)", s.bytes, s.step, s.epoch)
	}
	return s.what
}

// stallReport says which stage holds up the next batch, and on which
// files.
func (l *Loader) stallReport(r *run, j *job, waited time.Duration) string {
	if j == nil {
		st, _ := r.stage.Load().(plannerStage)
		return fmt.Sprintf("loader: watchdog: no batch for %v; the planner is %s", waited, l.describe(st))
	}
	st, _ := j.stage.Load().(string)
	msg := fmt.Sprintf("loader: watchdog: no batch for %v; batch %d of epoch %d (%d samples) is %s for %v",
		waited, j.b.Step, j.b.Epoch, len(j.items), st, time.Since(j.started).Round(time.Millisecond))
	if st == "reading" {
		msg += "; files: " + l.filesOf(j)
	}
	return msg
}

// filesOf names the files a job reads, first in offset order.
func (l *Loader) filesOf(j *job) string {
	type fk struct{ src, file int }
	seen := map[fk]bool{}
	var names []string
	for i, idx := range j.items {
		src := 0
		if j.sources != nil {
			src = j.sources[i]
		}
		f, _, _, err := l.readers[src].Locate(idx)
		if err != nil || seen[fk{src, f}] {
			continue
		}
		seen[fk{src, f}] = true
		names = append(names, l.readers[src].Files()[f].Path)
	}
	sort.Strings(names)
	if len(names) > 4 {
		names = append(names[:4], fmt.Sprintf("and %d more", len(names)-4))
	}
	return strings.Join(names, ", ")
}

// State returns the state after the last batch Next returned.
func (l *Loader) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stateLocked()
}

func (l *Loader) stateLocked() State {
	s := State{Version: StateVersion, Seed: l.opts.Seed, Epoch: l.pos.epoch, Cursor: l.pos.cursor, Step: l.pos.step,
		Items: l.items, Shuffle: l.spec.Mode.String(), World: int64(l.opts.WorldSize), Rank: int64(l.opts.Rank),
		BatchSize: int64(l.opts.BatchSize), Dataset: l.fp}
	if l.spec.Mode == Block {
		s.BlockSize, s.Window = l.spec.BlockSize, l.spec.Window
	}
	return s
}

// Restore continues from a saved state, possibly saved by another rank or
// with another world size, batch size or worker count: the next batch
// starts at the state's cursor. Batches already prefetched are dropped;
// batches the caller holds stay valid. The loader runs until the end of
// the state's epoch or of StartEpoch+Epochs, whichever is later. A state
// of other data, another seed's or another shuffle's order is refused.
func (l *Loader) Restore(s State) error {
	if err := l.checkState(s); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.stopLocked()
	l.err = nil
	l.pos = position{epoch: s.Epoch, cursor: s.Cursor, step: s.Step}
	l.endEpoch = -1
	if l.opts.Epochs >= 0 {
		l.endEpoch = max(l.opts.StartEpoch+l.opts.Epochs, s.Epoch+1)
	}
	return nil
}

func (l *Loader) checkState(s State) error {
	if s.Version != StateVersion {
		return fmt.Errorf("%w: state version %d, this loader reads version %d", ErrState, s.Version, StateVersion)
	}
	if d := compareDatasets(s.Dataset, l.fp); d != "" {
		return fmt.Errorf("%w: the state was saved for other data: %s", ErrState, d)
	}
	if s.Items != l.items {
		return fmt.Errorf("%w: the state's epoch has %d samples, this loader's %d", ErrState, s.Items, l.items)
	}
	mode := l.spec.Mode.String()
	if s.Shuffle != mode || (l.spec.Mode == Block && (s.BlockSize != l.spec.BlockSize || s.Window != l.spec.Window)) {
		return fmt.Errorf("%w: the state was saved with shuffle %q (block size %d, window %d), this loader uses %q (block size %d, window %d)",
			ErrState, s.Shuffle, s.BlockSize, s.Window, mode, l.spec.BlockSize, l.spec.Window)
	}
	if s.Seed != l.opts.Seed && l.spec.Mode != Sequential {
		return fmt.Errorf("%w: the state was saved with seed %d, this loader uses seed %d", ErrState, s.Seed, l.opts.Seed)
	}
	if s.Epoch < 0 || s.Cursor < 0 || s.Cursor >= s.Items || s.Step < 0 {
		return fmt.Errorf("%w: epoch %d, cursor %d of %d, step %d is not a position", ErrState, s.Epoch, s.Cursor, s.Items, s.Step)
	}
	return nil
}

// compareDatasets compares the saved and current dataset fingerprints by
// content (sample counts, file sizes, header checksums through each
// source's hash; mixture weights and length), ignoring file names.
func compareDatasets(saved, current json.RawMessage) string {
	var a, b datasetFingerprint
	if err := json.Unmarshal(saved, &a); err != nil {
		return "the state holds no dataset fingerprint"
	}
	if err := json.Unmarshal(current, &b); err != nil {
		return "cannot read the current fingerprint"
	}
	same := len(a.Sources) == len(b.Sources) && a.MixtureEpoch == b.MixtureEpoch && len(a.Weights) == len(b.Weights)
	for i := 0; same && i < len(a.Sources); i++ {
		same = a.Sources[i].Equal(b.Sources[i])
	}
	for i := 0; same && i < len(a.Weights); i++ {
		same = a.Weights[i] == b.Weights[i]
	}
	if same {
		return ""
	}
	if d := compareFingerprints(saved, current); d != "" {
		return d
	}
	return "the fingerprints differ"
}

// SetEpoch restarts the loader at the beginning of epoch e (like
// DistributedSampler.set_epoch), to run Epochs epochs from there.
// Prefetched batches are dropped; batches the caller holds stay valid.
func (l *Loader) SetEpoch(e int64) error {
	if e < 0 {
		return fmt.Errorf("%w: epoch %d is negative", ErrOptions, e)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.stopLocked()
	l.err = nil
	l.pos = position{epoch: e}
	l.endEpoch = l.epochEnd(e)
	return nil
}

// Close stops the pipeline and waits for its goroutines; it closes the
// datasets the loader opened. Batches the caller holds stay readable until
// released. Close may be called at any time, more than once.
func (l *Loader) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.stopLocked()
	var first error
	if l.owned {
		for _, r := range l.readers {
			if err := r.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// MaxBatchBytes is the memory the largest possible batch takes: the
// BatchSize largest samples of the datasets (repeated when a batch is
// larger than the datasets), rounded as the arena allocates. A memory
// budget below it cannot be kept.
func (l *Loader) MaxBatchBytes() int64 {
	k := l.opts.BatchSize
	var lens []int64
	for _, r := range l.readers {
		lens = append(lens, r.LargestSamples(k)...)
	}
	if len(lens) == 0 {
		return 0
	}
	slices.Sort(lens)
	slices.Reverse(lens)
	var total int64
	for i := 0; i < k; i++ {
		total += lens[i%len(lens)]
	}
	if a, ok := l.arena.(allocSizer); ok {
		total = a.AllocSize(total)
	}
	return total
}
