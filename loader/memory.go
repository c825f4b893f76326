package loader

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// Arena hands out the buffers batches are read into. The default keeps
// reusable buffers on the Go heap; a caller that wants batches in memory it
// owns (shared memory that another process maps, pinned memory) supplies
// its own, for example a SlabArena over that memory.
//
// Alloc is called from one goroutine, in batch order; Free may be called
// from any goroutine. Alloc may block until a Free; it must return when
// ctx is done.
type Arena interface {
	// Alloc returns a buffer of at least size bytes and a slot number that
	// Free takes back (and that a Batch reports, so another process can
	// find the buffer in shared memory).
	Alloc(ctx context.Context, size int64) (buf []byte, slot int, err error)
	// Free returns a slot's buffer for reuse.
	Free(slot int)
}

// allocSizer is an optional Arena capability: the bytes Alloc really
// takes for a request of size bytes, so the budget counts them.
type allocSizer interface {
	AllocSize(size int64) int64
}

// SlabArena divides caller-provided memory into equal slots, one per
// batch. Slot i is mem[i*SlotSize : (i+1)*SlotSize].
type SlabArena struct {
	mem      []byte
	slotSize int64
	free     chan int // slot numbers ready for use
}

// NewSlabArena divides mem into slots equal slots.
func NewSlabArena(mem []byte, slots int) (*SlabArena, error) {
	if slots < 1 || int64(len(mem))/int64(slots) < 1 {
		return nil, fmt.Errorf("%w: cannot divide %d bytes into %d slots", ErrOptions, len(mem), slots)
	}
	a := &SlabArena{mem: mem, slotSize: int64(len(mem)) / int64(slots), free: make(chan int, slots)}
	for i := 0; i < slots; i++ {
		a.free <- i
	}
	return a, nil
}

// SlotSize is the size of every slot: the largest batch the arena holds.
func (a *SlabArena) SlotSize() int64 { return a.slotSize }

// Slots is the number of slots.
func (a *SlabArena) Slots() int { return cap(a.free) }

// Alloc waits for a free slot.
func (a *SlabArena) Alloc(ctx context.Context, size int64) ([]byte, int, error) {
	if size > a.slotSize {
		return nil, -1, fmt.Errorf("%w: a batch of %d bytes does not fit a slot of %d bytes", ErrBudget, size, a.slotSize)
	}
	select {
	case i := <-a.free:
		off := int64(i) * a.slotSize
		return a.mem[off : off+size : off+a.slotSize], i, nil
	case <-ctx.Done():
		return nil, -1, ctx.Err()
	}
}

// Free makes slot i available again.
func (a *SlabArena) Free(i int) { a.free <- i }

// heapArena is the default Arena: buffers on the Go heap, reused. It keeps
// released buffers for reuse only while they and the buffers batches hold
// fit in the budget together, so the loader's batch memory, cached or in
// use, stays within the budget.
type heapArena struct {
	mu      sync.Mutex
	free    [][]byte       // guarded by mu
	freeSum int64          // bytes in free; guarded by mu
	slots   map[int][]byte // buffers handed out, by slot; guarded by mu
	next    int            // guarded by mu
	budget  *budget
}

func newHeapArena(b *budget) *heapArena {
	return &heapArena{slots: map[int][]byte{}, budget: b}
}

// AllocSize rounds a request up to a size class (steps of 1/8 of the next
// power of two, at least 64 bytes), so that batches of similar size reuse
// each other's buffers instead of allocating (and zeroing) new ones.
func (h *heapArena) AllocSize(size int64) int64 {
	if size <= 64 {
		return 64
	}
	step := max(int64(1)<<bits.Len64(uint64(size-1))/8, 64)
	return (size + step - 1) / step * step
}

func (h *heapArena) Alloc(ctx context.Context, size int64) ([]byte, int, error) {
	size = h.AllocSize(size)
	h.mu.Lock()
	defer h.mu.Unlock()
	var buf []byte
	// Best fit among the free buffers.
	best := -1
	for i, b := range h.free {
		if int64(cap(b)) >= size && (best < 0 || cap(b) < cap(h.free[best])) {
			best = i
		}
	}
	if best >= 0 {
		buf = h.free[best][:size]
		h.freeSum -= int64(cap(buf))
		h.free[best] = h.free[len(h.free)-1]
		h.free = h.free[:len(h.free)-1]
	} else {
		// The budget already counts this batch: drop cached buffers
		// (none fits) until cache and held batches fit the budget.
		for h.freeSum+h.budget.held.Load() > h.budget.limit && len(h.free) > 0 {
			h.freeSum -= int64(cap(h.free[len(h.free)-1]))
			h.free = h.free[:len(h.free)-1]
		}
		buf = make([]byte, size)
	}
	h.next++
	h.slots[h.next] = buf
	return buf, h.next, nil
}

func (h *heapArena) Free(slot int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	buf, ok := h.slots[slot]
	if !ok {
		return
	}
	delete(h.slots, slot)
	// Free runs before the budget release, so held still counts buf.
	if h.freeSum+h.budget.held.Load() <= h.budget.limit {
		h.free = append(h.free, buf[:0])
		h.freeSum += int64(cap(buf))
	}
}

// budget bounds the bytes of batch buffers held at once: from the moment
// a batch's buffer is allocated until the consumer releases the batch.
type budget struct {
	sem   *semaphore.Weighted
	limit int64
	held  atomic.Int64
	peak  atomic.Int64
	count atomic.Int64 // batches holding memory
}

func newBudget(limit int64) *budget {
	return &budget{sem: semaphore.NewWeighted(limit), limit: limit}
}

// acquire takes n bytes (waiting for releases). A batch larger than the
// whole budget takes all of it: it waits until nothing else is held and is
// then the only batch in memory. It returns the weight to give back.
func (b *budget) acquire(ctx context.Context, n int64) (int64, error) {
	w := min(n, b.limit)
	if err := b.sem.Acquire(ctx, w); err != nil {
		return 0, err
	}
	h := b.held.Add(n)
	b.count.Add(1)
	for {
		p := b.peak.Load()
		if h <= p || b.peak.CompareAndSwap(p, h) {
			break
		}
	}
	return w, nil
}

func (b *budget) release(n, w int64) {
	b.held.Add(-n)
	b.count.Add(-1)
	b.sem.Release(w)
}
