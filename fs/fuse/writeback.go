package fuse

import (
	"fmt"
	"sync"

	"github.com/ffkit/ffkit/fs"
)

// writeBuffer gathers the FUSE writes of one open file into large writes
// to the storage (write-behind). The kernel sends writes of at most
// MaxRequest bytes, and the pieces of one large O_DIRECT write in
// parallel, out of order; each would otherwise be one synchronous
// storage write (on the cluster, a chain round trip with an fsync on
// every replica). Writes that fall in the current window, an aligned
// range of Options.WriteBuffer bytes, are copied into it; a write outside
// it sends the window to storage in the background (up to
// Options.WriteBehind windows at once) and opens a new one. Everything is
// stored before FLUSH (close), FSYNC, a truncate, a read through the
// handle, or RELEASE returns, so close-to-open consistency holds; a
// failed background write is reported by the next write, flush or fsync.
//
// Ordering: a window is never sent while an earlier one overlapping it is
// still in flight, so a rewrite of the same bytes lands last.
type writeBuffer struct {
	wf   fs.WriteFile
	size int64 // window size
	sem  chan struct{}

	mu     sync.Mutex
	win    *window              // the window being filled; nil if none. Guarded by mu.
	flying map[*window]struct{} // windows being sent. Guarded by mu.
	done   *sync.Cond           // signalled when a window lands; uses mu
	err    error                // first background failure; guarded by mu
	end    int64                // largest end written through the buffer; guarded by mu
}

// window is an aligned range [base, base+len(buf)) of the file with the
// parts written so far (sorted, merged extents).
type window struct {
	base int64
	buf  []byte
	ext  []extent
}

type extent struct{ lo, hi int64 } // offsets inside the window

var windowPool sync.Pool // of *[]byte

func newWriteBuffer(wf fs.WriteFile, size, behind int) *writeBuffer {
	b := &writeBuffer{wf: wf, size: int64(size), sem: make(chan struct{}, behind), flying: map[*window]struct{}{}}
	b.done = sync.NewCond(&b.mu)
	return b
}

// write takes p at off. It returns an earlier background failure, if any.
func (b *writeBuffer) write(p []byte, off int64) error {
	end := off + int64(len(p))
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	b.end = max(b.end, end)
	if w := b.win; w != nil && off >= w.base && end <= w.base+int64(len(w.buf)) {
		w.add(off-w.base, p)
		return nil
	}
	// Outside the window: start the one holding off, then send the old
	// one (which may wait for a slot).
	old := b.win
	b.win = nil
	base := off / b.size * b.size
	if end <= base+b.size {
		w := &window{base: base, buf: getWindowBuf(int(b.size))}
		w.add(off-base, p)
		b.win = w
	}
	if old != nil {
		b.sendLocked(old)
	}
	if end <= base+b.size {
		return nil
	}
	// Larger than a window or straddling two: write it directly, after
	// any overlapping window in flight.
	b.waitOverlapLocked(off, end)
	b.mu.Unlock()
	_, err := b.wf.WriteAt(p, off)
	b.mu.Lock()
	if err != nil {
		return fmt.Errorf("write at %d: %w", off, err)
	}
	return nil
}

func (w *window) add(in int64, p []byte) {
	copy(w.buf[in:], p)
	e := extent{in, in + int64(len(p))}
	out := make([]extent, 0, len(w.ext)+1)
	placed := false
	for _, x := range w.ext {
		switch {
		case x.hi < e.lo:
			out = append(out, x)
		case e.hi < x.lo:
			if !placed {
				out = append(out, e)
				placed = true
			}
			out = append(out, x)
		default: // overlapping or touching: merge
			e = extent{min(e.lo, x.lo), max(e.hi, x.hi)}
		}
	}
	if !placed {
		out = append(out, e)
	}
	w.ext = out
}

func (w *window) span() (int64, int64) {
	return w.base + w.ext[0].lo, w.base + w.ext[len(w.ext)-1].hi
}

func overlaps(w *window, lo, hi int64) bool {
	a, b := w.span()
	return a < hi && lo < b
}

// waitOverlapLocked waits until no window in flight overlaps [lo, hi).
func (b *writeBuffer) waitOverlapLocked(lo, hi int64) {
	for {
		busy := false
		for w := range b.flying {
			if overlaps(w, lo, hi) {
				busy = true
				break
			}
		}
		if !busy {
			return
		}
		b.done.Wait()
	}
}

// sendLocked stores w in the background. It waits (releasing mu) for a
// free slot and for overlapping windows in flight.
func (b *writeBuffer) sendLocked(w *window) {
	lo, hi := w.span()
	b.waitOverlapLocked(lo, hi)
	// Registered before it may wait for a slot: a later window over the
	// same bytes now waits for this one.
	b.flying[w] = struct{}{}
	for {
		select {
		case b.sem <- struct{}{}:
			go b.store(w)
			return
		default:
			b.done.Wait()
		}
	}
}

func (b *writeBuffer) store(w *window) {
	var err error
	for _, e := range w.ext {
		if _, err = b.wf.WriteAt(w.buf[e.lo:e.hi], w.base+e.lo); err != nil {
			err = fmt.Errorf("write behind at %d: %w", w.base+e.lo, err)
			break
		}
	}
	putWindowBuf(w.buf)
	<-b.sem
	b.mu.Lock()
	delete(b.flying, w)
	if err != nil && b.err == nil {
		b.err = err
	}
	b.done.Broadcast()
	b.mu.Unlock()
}

// flush stores everything written so far and returns the first failure.
func (b *writeBuffer) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.win; w != nil {
		b.win = nil
		b.sendLocked(w)
	}
	for len(b.flying) > 0 {
		b.done.Wait()
	}
	return b.err
}

// length is the largest end written through the buffer.
func (b *writeBuffer) length() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.end
}

// truncated notes a truncate to size (after a flush).
func (b *writeBuffer) truncated(size int64) {
	b.mu.Lock()
	b.end = min(b.end, size)
	b.mu.Unlock()
}

func getWindowBuf(n int) []byte {
	if p, ok := windowPool.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putWindowBuf(buf []byte) { windowPool.Put(&buf) }
