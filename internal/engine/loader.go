package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/loader"
)

// loaderHandle is a loader.Loader whose batches land in a shared-memory
// ring: one memfd divided into equal slots (a loader.SlabArena), mapped by
// Python once. A batch's slot is lent to Python until Python lists it in a
// later request's "release".
type loaderHandle struct {
	l        *loader.Loader
	readers  []*ffrecord.Reader
	ring     *segment
	slotSize int64

	mu   sync.Mutex            // guards held
	held map[int]*loader.Batch // batches lent to Python, by slot
}

func (h *loaderHandle) Close() error {
	err := h.l.Close()
	h.mu.Lock()
	for _, b := range h.held {
		b.Release()
	}
	h.held = nil
	h.mu.Unlock()
	for _, r := range h.readers {
		r.Close()
	}
	h.ring.close()
	return err
}

// release returns slots Python is done with.
func (h *loaderHandle) release(slots []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range slots {
		if b, ok := h.held[s]; ok {
			delete(h.held, s)
			b.Release()
		}
	}
}

type loaderOpenReq struct {
	Paths        []string `json:"paths"`
	BatchSize    int      `json:"batch_size"`
	Shuffle      bool     `json:"shuffle"`
	Seed         uint64   `json:"seed"`
	Rank         int      `json:"rank"`
	WorldSize    int      `json:"world_size"`
	DropLast     bool     `json:"drop_last"`
	Prefetch     int      `json:"prefetch"`
	Hold         int      `json:"hold"`
	Ahead        int      `json:"ahead"`
	CheckData    bool     `json:"check_data"`
	Direct       bool     `json:"direct"`
	Workers      int      `json:"workers"`
	MemoryBudget int64    `json:"memory_budget"`
	StartEpoch   int64    `json:"start_epoch"`
	SkipBad      bool     `json:"skip_bad"`
	BlockSize    int64    `json:"block_size"`
}

const pageSize = 4096

// loaderOpen opens the dataset and a loader whose batches go to a ring of
// prefetch+hold slots, each big enough for the largest possible batch
// (batch size times the largest sample, capped by the memory budget). The
// memfd is sparse: only pages a batch touches take memory.
func loaderOpen(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	var q loaderOpenReq
	if err := json.Unmarshal(hdr, &q); err != nil {
		return reply{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if q.Hold < 1 {
		q.Hold = 2
	}
	if q.Prefetch < 1 {
		q.Prefetch = loader.DefaultPrefetch
	}
	if q.BatchSize < 1 {
		return reply{}, fmt.Errorf("%w: batch size %d, want at least 1", loader.ErrOptions, q.BatchSize)
	}
	ropts := ffrecord.ReadOptions{Direct: q.Direct, NoVerify: !q.CheckData, Parallelism: q.Workers}
	r, err := ffrecord.Open(ctx, q.Paths, ropts)
	if err != nil {
		return reply{}, err
	}
	// The largest sample bounds a batch.
	var maxLen int64
	for i := int64(0); i < r.N(); i++ {
		_, _, l, err := r.Locate(i)
		if err != nil {
			r.Close()
			return reply{}, err
		}
		maxLen = max(maxLen, l)
	}
	slotSize := max(maxLen*int64(q.BatchSize), 1)
	if q.Ahead < 0 {
		q.Ahead = 0
	}
	// Slots: batches being prefetched, batches sent ahead to Python but not
	// yet taken, and batches Python holds.
	slots := q.Prefetch + q.Hold + q.Ahead
	if q.MemoryBudget > 0 && slotSize*int64(slots) > q.MemoryBudget {
		slotSize = q.MemoryBudget / int64(slots)
		if slotSize < maxLen {
			r.Close()
			return reply{}, fmt.Errorf("%w: a memory budget of %d bytes over %d slots (prefetch %d + hold %d) cannot hold the largest sample (%d bytes)",
				loader.ErrBudget, q.MemoryBudget, slots, q.Prefetch, q.Hold, maxLen)
		}
	}
	slotSize = (slotSize + pageSize - 1) / pageSize * pageSize
	ring, err := newRing(slotSize * int64(slots))
	if err != nil {
		r.Close()
		return reply{}, err
	}
	arena, err := loader.NewSlabArena(ring.mem, slots)
	if err != nil {
		ring.close()
		r.Close()
		return reply{}, err
	}
	opts := loader.Options{
		BatchSize: q.BatchSize, Shuffle: q.Shuffle, Seed: q.Seed, Rank: q.Rank, WorldSize: q.WorldSize,
		DropLast: q.DropLast, Prefetch: q.Prefetch, StartEpoch: q.StartEpoch, Epochs: -1,
		MemoryBudget: slotSize * int64(slots), Arena: arena, BlockSize: q.BlockSize,
		NoVerify: !q.CheckData, Direct: q.Direct,
	}
	if q.Workers > 0 {
		opts.Workers = q.Workers
	}
	if q.SkipBad {
		opts.BadSamples = loader.Skip
	}
	l, err := loader.New([]*ffrecord.Reader{r}, opts)
	if err != nil {
		ring.close()
		r.Close()
		return reply{}, err
	}
	h := &loaderHandle{l: l, readers: []*ffrecord.Reader{r}, ring: ring, slotSize: slotSize, held: map[int]*loader.Batch{}}
	id := s.add(h)
	// Python maps the ring; the engine keeps its own descriptor closed
	// after sending (its mapping stays).
	fd := ring.fd
	ring.fd = -1
	return reply{
		header: map[string]any{"ok": true, "handle": id, "n": r.N(), "slots": slots, "slot_size": slotSize,
			"batches_per_epoch": l.BatchesPerEpoch(), "items": l.Len(), "state": l.State()},
		fds: []int{fd},
	}, nil
}

// newRing is a segment without MAP_POPULATE: a ring is sized for the worst
// batch, and only the pages batches use should take memory.
func newRing(size int64) (*segment, error) { return newSparseSegment("ffkit-ring", size) }

type loaderReq struct {
	request
	Release []int           `json:"release"`
	Keep    []int           `json:"keep"`
	Epoch   int64           `json:"epoch"`
	State   json.RawMessage `json:"state"`
}

func loaderArgs(s *Server, hdr []byte) (*loaderHandle, loaderReq, error) {
	var q loaderReq
	if err := json.Unmarshal(hdr, &q); err != nil {
		return nil, q, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	h, err := lookup[*loaderHandle](s, q.Handle)
	if err != nil {
		return nil, q, err
	}
	if _, early := earlyOps[q.Op]; !early {
		h.release(q.Release)
	}
	return h, q, nil
}

// releaseEarly applies a request's releases when it is read (see earlyOps).
func releaseEarly(s *Server, hdr []byte) {
	var q loaderReq
	if json.Unmarshal(hdr, &q) != nil || len(q.Release) == 0 {
		return
	}
	if h, err := lookup[*loaderHandle](s, q.Handle); err == nil {
		h.release(q.Release)
	}
}

// loaderNext returns the next batch: the header names its slot, epoch,
// step and the state after it; the body holds n int64 sample indices and
// then n [start, end) pairs of int64 byte positions in the ring.
func loaderNext(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	h, _, err := loaderArgs(s, hdr)
	if err != nil {
		return reply{}, err
	}
	b, err := h.l.Next(ctx)
	if errors.Is(err, io.EOF) {
		return reply{header: map[string]any{"ok": true, "end": true}}, nil
	}
	if err != nil {
		return reply{}, err
	}
	h.mu.Lock()
	if h.held == nil { // closed meanwhile
		h.mu.Unlock()
		b.Release()
		return reply{}, fmt.Errorf("%w: loader closed", ErrBadRequest)
	}
	h.held[b.Slot] = b
	h.mu.Unlock()
	n := len(b.Samples)
	out := make([]int64, 3*n)
	copy(out, b.Indices)
	base := int64(b.Slot) * h.slotSize
	for i, smp := range b.Samples {
		start := base + b.Offset(i)
		out[n+2*i], out[n+2*i+1] = start, start+int64(len(smp))
	}
	st := b.State()
	return reply{header: map[string]any{"ok": true, "slot": b.Slot, "n": n, "epoch": b.Epoch, "step": b.Step,
		"padded": b.Padded, "state": map[string]int64{"epoch": st.Epoch, "cursor": st.Cursor, "step": st.Step}},
		body: putInt64s(out)}, nil
}

func loaderRelease(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	if _, _, err := loaderArgs(s, hdr); err != nil {
		return reply{}, err
	}
	return okReply(), nil
}

// loaderReclaim releases every lent slot except those Python still holds
// (after Python abandoned replies it never read, e.g. on Ctrl-C).
func loaderReclaim(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	h, q, err := loaderArgs(s, hdr)
	if err != nil {
		return reply{}, err
	}
	keep := map[int]bool{}
	for _, k := range q.Keep {
		keep[k] = true
	}
	var drop []int
	h.mu.Lock()
	for slot := range h.held {
		if !keep[slot] {
			drop = append(drop, slot)
		}
	}
	h.mu.Unlock()
	h.release(drop)
	return okReply(), nil
}

func loaderSetEpoch(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	h, q, err := loaderArgs(s, hdr)
	if err != nil {
		return reply{}, err
	}
	if err := h.l.SetEpoch(q.Epoch); err != nil {
		return reply{}, err
	}
	return reply{header: map[string]any{"ok": true, "state": h.l.State()}}, nil
}

func loaderRestore(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	h, q, err := loaderArgs(s, hdr)
	if err != nil {
		return reply{}, err
	}
	var st loader.State
	if err := json.Unmarshal(q.State, &st); err != nil {
		return reply{}, fmt.Errorf("%w: not a loader state: %v", loader.ErrState, err)
	}
	if err := h.l.Restore(st); err != nil {
		return reply{}, err
	}
	return reply{header: map[string]any{"ok": true, "state": h.l.State()}}, nil
}

func loaderStats(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	h, _, err := loaderArgs(s, hdr)
	if err != nil {
		return reply{}, err
	}
	return reply{header: map[string]any{"ok": true, "stats": h.l.Stats()}}, nil
}

func init() {
	ops["loader_open"] = loaderOpen
	ops["loader_next"] = loaderNext
	ops["loader_release"] = loaderRelease
	ops["loader_reclaim"] = loaderReclaim
	earlyOps["loader_next"] = releaseEarly
	earlyOps["loader_release"] = releaseEarly
	ops["loader_set_epoch"] = loaderSetEpoch
	ops["loader_restore"] = loaderRestore
	ops["loader_stats"] = loaderStats
	addCode(loader.ErrState, "state")
	addCode(loader.ErrOptions, "options")
	addCode(loader.ErrBudget, "budget")
}
