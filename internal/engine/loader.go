package engine

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

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
	arena    *ringArena

	streams sync.WaitGroup // running loaderStream calls

	prefetch int // the loader's Prefetch: batches read at once

	mu      sync.Mutex        // guards held, nextSeq and fence; streams.Add
	held    map[int]lentBatch // batches lent to Python, by slot
	nextSeq uint32
	// fence is the highest stream number a reclaim named: streams numbered
	// up to it are over, and one whose request is read only now must not
	// start (Python closed it before the engine got to it).
	fence uint64
}

// lentBatch is a batch Python has; seq is the lend's number, which Python
// writes into the slot's release word when it is done.
type lentBatch struct {
	b   *loader.Batch
	seq uint32
}

// The ring's first page is the release board: one little-endian uint32
// per slot, then (in the page's last two words) the words a producer
// waiting for a slot sleeps on. Slots follow the page.
const (
	ringBoard = 4096
	// boardWaiting is the index of the word that is 0 unless the producer
	// waits for a slot; then it is a lend number W: Python wakes the
	// producer when it releases a batch lent as W or later, so the
	// producer sleeps until several lent batches are back (see wakeAt)
	// and then plans them in one go, instead of waking (and preempting
	// Python) for every release.
	boardWaiting = ringBoard/4 - 2
	// boardWake is the index of the futex word the waiting producer sleeps
	// on: a release that wakes the producer adds one to it first (Python
	// with the futex system call, the engine with ringArena.notify).
	boardWake = ringBoard/4 - 1
	// maxSlots is how many slots the board has words for.
	maxSlots = boardWaiting
)

// releaseWord is slot i's release word on the board.
func (h *loaderHandle) releaseWord(i int) *uint32 {
	return (*uint32)(unsafe.Pointer(&h.ring.mem[4*i]))
}

// lend records b as lent to Python and returns the lend's number.
func (h *loaderHandle) lend(b *loader.Batch) (uint32, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		return 0, false
	}
	h.nextSeq++
	if h.nextSeq == 0 { // 0 means "not waiting" on the board
		h.nextSeq = 1
	}
	h.held[b.Slot] = lentBatch{b: b, seq: h.nextSeq}
	return h.nextSeq, true
}

// wakeAt is the lend number whose release (or a later one's) should wake
// a producer that found no free slot: that of the k-th oldest lent batch,
// k = min(prefetch, half the lent batches). On waking, the producer then
// plans as many batches as the readers take at once, while Python still
// has the other lent batches to work through.
func (h *loaderHandle) wakeAt() uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var seqs [maxSlots]uint32
	n := 0
	for _, lb := range h.held {
		seqs[n] = lb.seq
		n++
	}
	if n == 0 { // only the engine can free a slot (notify wakes regardless)
		return 1
	}
	// Lend numbers wrap around: order them oldest first by their distance
	// past the newest one.
	order := func(s uint32) uint32 { return s - h.nextSeq - 1 }
	slices.SortFunc(seqs[:n], func(a, b uint32) int { return cmp.Compare(order(a), order(b)) })
	return seqs[min(h.prefetch, (n+1)/2)-1]
}

// poll releases every lent batch whose release word Python has set.
func (h *loaderHandle) poll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for slot, lb := range h.held {
		if atomic.LoadUint32(h.releaseWord(slot)) == lb.seq {
			delete(h.held, slot)
			lb.b.Release()
		}
	}
}

// ringArena hands out the ring's slots. Python gives slots back by writing
// release words in shared memory, without a request; a producer that finds
// no free slot reads the board, and if nothing was released it sleeps on
// the board's wake word (a futex) until a release wakes it.
type ringArena struct {
	mem      []byte
	slotSize int64
	free     chan int
	h        *loaderHandle
	waiting  *uint32 // board word boardWaiting
	wake     *uint32 // board word boardWake
	touched  []bool  // slots whose pages are in; used by Alloc only

	// unmapped guards the board words against a Free that comes after
	// Close unmapped the ring (a batch the loader frees on its way out).
	mu       sync.RWMutex
	unmapped bool // guarded by mu
}

// wakeTimeout bounds one sleep of a waiting producer. Wake-ups are not
// lost in practice (see Alloc), so this only bounds the cost of one that
// is: Python's release is a plain store, with no fence between writing
// the release word and reading boardWaiting.
//
// FFKIT_ENGINE_WAKE_TIMEOUT (a Go duration) overrides it: tests make it
// long to show that wake-ups, not the timeout, bring released slots back.
var wakeTimeout = 2 * time.Millisecond

func init() {
	if v := os.Getenv("FFKIT_ENGINE_WAKE_TIMEOUT"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			wakeTimeout = d
		}
	}
}

func (a *ringArena) slot(i int, size int64) []byte {
	off := ringBoard + int64(i)*a.slotSize
	if !a.touched[i] {
		// The first batch in a slot: fault its pages in with one call
		// rather than one fault at a time inside the reads.
		a.touched[i] = true
		unix.Madvise(a.mem[off:off+a.slotSize], unix.MADV_POPULATE_WRITE)
	}
	return a.mem[off : off+size : off+a.slotSize]
}

func (a *ringArena) Alloc(ctx context.Context, size int64) ([]byte, int, error) {
	if size > a.slotSize {
		return nil, -1, fmt.Errorf("%w: a batch of %d bytes does not fit a ring slot of %d bytes", loader.ErrBudget, size, a.slotSize)
	}
	for {
		select {
		case i := <-a.free:
			return a.slot(i, size), i, nil
		default:
		}
		a.h.poll()
		select {
		case i := <-a.free:
			return a.slot(i, size), i, nil
		default:
		}
		// Announce the wait, then look once more: a release from now on
		// either shows in this poll or changes the wake word before the
		// futex compares it with v (and wakes the sleeper).
		atomic.StoreUint32(a.waiting, a.h.wakeAt())
		v := atomic.LoadUint32(a.wake)
		a.h.poll()
		select {
		case i := <-a.free:
			atomic.StoreUint32(a.waiting, 0)
			return a.slot(i, size), i, nil
		default:
		}
		if err := ctx.Err(); err != nil {
			atomic.StoreUint32(a.waiting, 0)
			return nil, -1, err
		}
		stop := context.AfterFunc(ctx, a.notify)
		futexWait(a.wake, v, wakeTimeout)
		stop()
		atomic.StoreUint32(a.waiting, 0)
	}
}

// notify wakes a producer sleeping in Alloc, if there is one.
func (a *ringArena) notify() {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.unmapped {
		return
	}
	atomic.AddUint32(a.wake, 1)
	if atomic.LoadUint32(a.waiting) != 0 {
		futexWake(a.wake)
	}
}

// Free takes a slot back (a batch released by a request, by a reclaim or
// on Close; board releases come back through poll).
func (a *ringArena) Free(i int) {
	a.free <- i
	a.notify()
}

func (h *loaderHandle) Close() error {
	err := h.l.Close()
	h.mu.Lock()
	for _, lb := range h.held {
		lb.b.Release()
	}
	h.held = nil
	h.mu.Unlock()
	for _, r := range h.readers {
		r.Close()
	}
	h.arena.mu.Lock()
	h.arena.unmapped = true
	h.ring.close()
	h.arena.mu.Unlock()
	return err
}

// release returns slots Python is done with.
func (h *loaderHandle) release(slots []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range slots {
		if lb, ok := h.held[s]; ok {
			delete(h.held, s)
			lb.b.Release()
		}
	}
}

const pageSize = 4096

// loaderOpen opens the dataset and a loader whose batches go to a ring of
// 2*prefetch+2+hold+ahead slots (see doc.go), each big enough for the largest possible batch
// (batch size times the largest sample, capped by the memory budget). The
// memfd is sparse: only pages a batch touches take memory.
func loaderOpen(ctx context.Context, s *Server, q *loaderOpenRequest, in input) (reply, error) {
	closeFDs(in.fds)
	if q.Hold < 1 {
		q.Hold = 2
	}
	if q.Prefetch < 1 {
		q.Prefetch = loader.DefaultPrefetch
	}
	if q.BatchSize < 1 {
		return reply{}, fmt.Errorf("%w: batch size %d, want at least 1", loader.ErrOptions, q.BatchSize)
	}
	direct, err := ffrecord.ParseDirectMode(q.Direct)
	if err != nil {
		return reply{}, err
	}
	ropts := ffrecord.ReadOptions{Direct: direct == ffrecord.DirectOn, DirectAuto: direct == ffrecord.DirectAuto,
		NoVerify: !q.CheckData, Parallelism: q.Workers}
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
	// Slots: the batches the Go loader plans ahead (up to 2*prefetch
	// queued, the one Next waits for and the one being planned), batches
	// sent ahead to Python but not yet taken, and batches Python holds; so
	// the producer waits for a slot only when Python holds more than hold
	// batches. A memory budget too small for that takes slots off the
	// planned ones first (down to prefetch), then shrinks the slots.
	fewest := q.Prefetch + q.Hold + q.Ahead
	slots := 2*q.Prefetch + 2 + q.Hold + q.Ahead
	if q.MemoryBudget > 0 && slotSize*int64(slots) > q.MemoryBudget {
		slots = int(max(int64(fewest), q.MemoryBudget/slotSize))
		if slotSize*int64(slots) > q.MemoryBudget {
			slotSize = q.MemoryBudget / int64(slots)
		}
		if slotSize < maxLen {
			r.Close()
			return reply{}, fmt.Errorf("%w: a memory budget of %d bytes over %d slots (prefetch %d + hold %d + ahead %d) cannot hold the largest sample (%d bytes)",
				loader.ErrBudget, q.MemoryBudget, slots, q.Prefetch, q.Hold, q.Ahead, maxLen)
		}
	}
	slotSize = (slotSize + pageSize - 1) / pageSize * pageSize
	if slots > maxSlots {
		r.Close()
		return reply{}, fmt.Errorf("%w: %d ring slots (prefetch %d, hold %d, ahead %d), at most %d", loader.ErrOptions, slots, q.Prefetch, q.Hold, q.Ahead, maxSlots)
	}
	ring, err := newRing(ringBoard + slotSize*int64(slots))
	if err != nil {
		r.Close()
		return reply{}, err
	}
	arena := &ringArena{mem: ring.mem, slotSize: slotSize, free: make(chan int, slots), touched: make([]bool, slots),
		waiting: (*uint32)(unsafe.Pointer(&ring.mem[4*boardWaiting])), wake: (*uint32)(unsafe.Pointer(&ring.mem[4*boardWake]))}
	for i := 0; i < slots; i++ {
		arena.free <- i
	}
	// The ring bounds memory (slots x slot size); the loader's own budget
	// must not, or a producer could wait on it for a batch Python released
	// on the board without a request, where only the arena looks.
	opts := loader.Options{
		BatchSize: q.BatchSize, Shuffle: q.Shuffle, Seed: q.Seed, Rank: q.Rank, WorldSize: q.WorldSize,
		DropLast: q.DropLast, Prefetch: q.Prefetch, StartEpoch: q.StartEpoch, Epochs: -1,
		MemoryBudget: 1 << 62, Arena: arena, BlockSize: q.BlockSize,
		NoVerify: !q.CheckData, Direct: r.Options().Direct,
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
	h := &loaderHandle{l: l, readers: []*ffrecord.Reader{r}, ring: ring, slotSize: slotSize, arena: arena, held: map[int]lentBatch{},
		prefetch: q.Prefetch}
	arena.h = h
	id := s.add(h)
	// Python maps the ring; the engine keeps its own descriptor closed
	// after sending (its mapping stays).
	fd := ring.fd
	ring.fd = -1
	return reply{
		header: loaderOpenReply{okField: ok(), Handle: id, N: r.N(), Slots: slots, SlotSize: slotSize, Board: ringBoard,
			WaitingWord: boardWaiting, WakeWord: boardWake,
			BatchesPerEpoch: l.BatchesPerEpoch(), Items: l.Len(), State: l.State()},
		fds: []int{fd},
	}, nil
}

// newRing is a segment without MAP_POPULATE: a ring is sized for the worst
// batch, and only the pages batches use should take memory.
func newRing(size int64) (*segment, error) { return newSparseSegment("ffkit-ring", size) }

func loaderArgs(s *Server, q *loaderRequest) (*loaderHandle, error) {
	h, err := lookup[*loaderHandle](s, q.Handle)
	if err != nil {
		return nil, err
	}
	if _, early := earlyOps[q.Op]; !early {
		h.release(q.Release)
	}
	return h, nil
}

// releaseEarly applies a request's releases when it is read (see earlyOps).
func releaseEarly(s *Server, hdr []byte) {
	var q loaderRequest
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
func loaderNext(ctx context.Context, s *Server, q *loaderRequest, in input) (reply, error) {
	closeFDs(in.fds)
	h, err := loaderArgs(s, q)
	if err != nil {
		return reply{}, err
	}
	b, err := h.l.Next(ctx)
	if errors.Is(err, io.EOF) {
		return reply{header: loaderEndReply{okField: ok(), End: true}}, nil
	}
	if err != nil {
		return reply{}, err
	}
	hdr2, out, err := h.lendReply(b)
	if err != nil {
		return reply{}, err
	}
	return reply{header: hdr2, body: out}, nil
}

// batchHeader is the header of every batch reply: the batch itself is
// described in the body, so that neither side handles JSON per batch.
var batchHeader = json.RawMessage(`{"batch":true,"ok":true}`)

// lendReply lends b to Python and describes it. The header is batchHeader;
// the body is little-endian int64s: slot, lend number, n, epoch, step,
// padded, then the state after the batch (epoch, cursor, step), then the
// grid (L when every sample is L > 0 bytes long and starts at a multiple
// of L in the slot, else 0: Python then makes the samples' views as rows
// of one 2-D view), then n sample indices, then n [start, end) pairs of
// positions within the slot.
func (h *loaderHandle) lendReply(b *loader.Batch) (any, []byte, error) {
	body, err := h.appendBatch(nil, b)
	return batchHeader, body, err
}

// appendBatch lends b to Python and appends its reply body (see lendReply)
// to dst.
func (h *loaderHandle) appendBatch(dst []byte, b *loader.Batch) ([]byte, error) {
	seq, ok := h.lend(b)
	if !ok { // closed meanwhile
		b.Release()
		return dst, fmt.Errorf("%w: loader closed", ErrBadRequest)
	}
	n := len(b.Samples)
	st := b.State()
	at := len(dst)
	for _, v := range [batchMeta]int64{int64(b.Slot), int64(seq), int64(n), b.Epoch, b.Step, int64(b.Padded), st.Epoch, st.Cursor, st.Step, 0} {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(v))
	}
	for _, v := range b.Indices {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(v))
	}
	var grid int64
	if n > 0 {
		grid = int64(len(b.Samples[0]))
	}
	for i, smp := range b.Samples {
		start := b.Offset(i)
		if grid > 0 && (int64(len(smp)) != grid || start%grid != 0) {
			grid = 0
		}
		dst = binary.LittleEndian.AppendUint64(dst, uint64(start))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(start+int64(len(smp))))
	}
	binary.LittleEndian.PutUint64(dst[at+8*(batchMeta-1):], uint64(grid))
	return dst, nil
}

// appendBatchFrame appends a whole batch reply frame to dst.
func (h *loaderHandle) appendBatchFrame(dst []byte, b *loader.Batch) ([]byte, error) {
	at := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(batchHeader)))
	dst = binary.LittleEndian.AppendUint32(dst, 0) // body length, below
	dst = append(dst, batchHeader...)
	dst, err := h.appendBatch(dst, b)
	if err != nil {
		return dst[:at], err
	}
	binary.LittleEndian.PutUint32(dst[at+4:], uint32(len(dst)-at-8-len(batchHeader)))
	return dst, nil
}

// loaderStream pushes batches to Python as they are ready, one reply frame
// each, until Python closes the connection or the loader fails. The ring
// bounds how far it runs ahead: a batch stays lent until Python sets its
// release word (or lists it in a request).
func (s *Server) loaderStream(ctx context.Context, c *net.UnixConn, hdr []byte) error {
	var sq loaderStreamRequest
	if err := decodeRequest("loader_stream", hdr, &sq); err != nil {
		return writeFrame(c, errorHeader(err), nil, nil)
	}
	q := sq.args()
	h, err := loaderArgs(s, &q)
	if err != nil {
		return writeFrame(c, errorHeader(err), nil, nil)
	}
	h.mu.Lock()
	if q.Stream != 0 && q.Stream <= h.fence {
		h.mu.Unlock()
		return writeFrame(c, errorHeader(fmt.Errorf("%w: stream %d was reclaimed before it started", ErrBadRequest, q.Stream)), nil, nil)
	}
	h.streams.Add(1)
	h.mu.Unlock()
	defer h.streams.Done()
	var frame []byte
	for {
		h.poll()
		b, err := h.l.Next(ctx)
		if errors.Is(err, io.EOF) {
			return writeFrame(c, loaderEndReply{okField: ok(), End: true}, nil, nil)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return writeFrame(c, errorHeader(err), nil, nil)
		}
		// One buffer, reused, holds each batch's frame: the stream
		// allocates nothing per batch (a helper's heap is small, so
		// garbage turns straight into collections).
		if frame, err = h.appendBatchFrame(frame[:0], b); err != nil {
			return writeFrame(c, errorHeader(err), nil, nil)
		}
		if _, err := c.Write(frame); err != nil {
			return err
		}
	}
}

func loaderRelease(ctx context.Context, s *Server, q *loaderRequest, in input) (reply, error) {
	closeFDs(in.fds)
	if _, err := loaderArgs(s, q); err != nil {
		return reply{}, err
	}
	return okReply(), nil
}

// loaderReclaim releases every lent slot except those Python still holds
// (after Python abandoned replies it never read, e.g. on Ctrl-C).
func loaderReclaim(ctx context.Context, s *Server, q *loaderRequest, in input) (reply, error) {
	closeFDs(in.fds)
	h, err := loaderArgs(s, q)
	if err != nil {
		return reply{}, err
	}
	// Python closed the stream before asking: wait until it has stopped, so
	// that no batch is lent after the reclaim, and fence off a stream whose
	// request is still unread on its closed connection.
	h.mu.Lock()
	h.fence = max(h.fence, q.Stream)
	h.mu.Unlock()
	h.streams.Wait()
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

func loaderSetEpoch(ctx context.Context, s *Server, q *loaderRequest, in input) (reply, error) {
	closeFDs(in.fds)
	h, err := loaderArgs(s, q)
	if err != nil {
		return reply{}, err
	}
	if err := h.l.SetEpoch(q.Epoch); err != nil {
		return reply{}, err
	}
	return reply{header: loaderStateReply{okField: ok(), State: h.l.State()}}, nil
}

func loaderRestore(ctx context.Context, s *Server, q *loaderRequest, in input) (reply, error) {
	closeFDs(in.fds)
	h, err := loaderArgs(s, q)
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
	return reply{header: loaderStateReply{okField: ok(), State: h.l.State()}}, nil
}

func loaderStats(ctx context.Context, s *Server, q *loaderRequest, in input) (reply, error) {
	closeFDs(in.fds)
	h, err := loaderArgs(s, q)
	if err != nil {
		return reply{}, err
	}
	return reply{header: loaderStatsReply{okField: ok(), Stats: h.l.Stats()}}, nil
}

func init() {
	earlyOps["loader_next"] = releaseEarly
	earlyOps["loader_release"] = releaseEarly
	addCode(loader.ErrState, "state")
	addCode(loader.ErrOptions, "options")
	addCode(loader.ErrBudget, "budget")
}
