package fuse

import (
	"context"
	"sync"
	"unsafe"

	"github.com/ffkit/ffkit/fs"
)

// readahead keeps a window of blocks ahead of a handle that is read
// sequentially. Blocks are fetched in parallel, each with its own
// ReadBatch, so that a single-threaded reader finds its next bytes in
// memory while the storage works on the following blocks. Memory is
// bounded per handle (Options.ReadAhead) and for the whole mount
// (Server.raSem, one token per block).
type readahead struct {
	s      *Server
	f      fs.File
	size   int64
	bs     int64
	window int64
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	next   int64              // end of the last read; guarded by mu
	streak int                // sequential reads in a row; guarded by mu
	blocks map[int64]*raBlock // by block offset; guarded by mu
	closed bool               // guarded by mu
}

// raBlock is one block of read-ahead. Its buffer is freed (its token
// returned) when it is dropped from the window, fetched, and no reader is
// copying from it.
type raBlock struct {
	off  int64
	buf  []byte
	done chan struct{} // closed when the fetch ended
	err  error         // set before done is closed

	fetched bool // guarded by readahead.mu
	dropped bool // guarded by readahead.mu
	readers int  // readers copying out; guarded by readahead.mu
}

var raBufPool sync.Pool // of *[]byte, Options.ReadAheadBlock long

func newReadahead(s *Server, f fs.File) *readahead {
	ctx, cancel := context.WithCancel(s.ctx)
	return &readahead{
		s: s, f: f, size: f.Size(),
		bs:     int64(s.opts.ReadAheadBlock),
		window: int64(max(s.opts.ReadAhead, s.opts.ReadAheadBlock)),
		ctx:    ctx, cancel: cancel,
		blocks: map[int64]*raBlock{},
	}
}

// read fills buf from the window if the access is sequential and the
// window covers it; false means the caller must read it itself.
func (ra *readahead) read(buf []byte, off int64) bool {
	end := off + int64(len(buf))
	ra.mu.Lock()
	if ra.closed {
		ra.mu.Unlock()
		return false
	}
	first := off / ra.bs * ra.bs
	_, inWindow := ra.blocks[first]
	// Near the stream's head: at most one block past it, or behind it
	// inside the window (the kernel sends the pieces of a large request,
	// and its own read-ahead, in parallel, so they arrive out of order).
	near := off <= ra.next+ra.bs && off >= ra.next-ra.window
	switch {
	case near || inWindow:
		ra.streak++
		ra.next = max(ra.next, end)
	default:
		ra.streak = 0
		ra.next = end
		for _, b := range ra.blocks {
			ra.dropLocked(b)
		}
	}
	if ra.streak < 2 && !inWindow {
		ra.mu.Unlock()
		return false
	}
	// Drop blocks wholly behind the one before this read (kernel reads
	// may arrive slightly out of order, so keep one behind).
	for o, b := range ra.blocks {
		if o+ra.bs <= first-ra.bs {
			ra.dropLocked(b)
		}
	}
	// Fill the window [first, off+window).
	for o := first; o < off+ra.window && o < ra.size; o += ra.bs {
		if _, ok := ra.blocks[o]; ok {
			continue
		}
		if !ra.startLocked(o) {
			break // no memory left for read-ahead: read what we have
		}
	}
	var need []*raBlock
	for o := first; o < end; o += ra.bs {
		b, ok := ra.blocks[o]
		if !ok {
			for _, b := range need {
				b.readers--
			}
			ra.mu.Unlock()
			return false
		}
		b.readers++
		need = append(need, b)
	}
	ra.mu.Unlock()

	ok := true
	for _, b := range need {
		<-b.done
		if b.err != nil {
			ok = false
			continue
		}
		if ok {
			lo := max(off, b.off)
			hi := min(end, b.off+int64(len(b.buf)))
			if hi > lo {
				copy(buf[lo-off:hi-off], b.buf[lo-b.off:hi-b.off])
			}
		}
	}
	ra.mu.Lock()
	for _, b := range need {
		b.readers--
		if b.err != nil {
			ra.dropLocked(b) // refetch on the next try
		}
		ra.maybeFreeLocked(b)
	}
	ra.mu.Unlock()
	return ok
}

// startLocked starts fetching the block at off; false if the mount's
// read-ahead memory is used up.
func (ra *readahead) startLocked(off int64) bool {
	select {
	case ra.s.raSem <- struct{}{}:
	default:
		return false
	}
	n := min(ra.bs, ra.size-off)
	var buf []byte
	if p, ok := raBufPool.Get().(*[]byte); ok && int64(cap(*p)) >= ra.bs {
		buf = (*p)[:n]
	} else {
		buf = alignedBuffer(int(ra.bs))[:n]
	}
	b := &raBlock{off: off, buf: buf, done: make(chan struct{})}
	ra.blocks[off] = b
	ra.s.wg.Add(1)
	go func() {
		defer ra.s.wg.Done()
		ctx, cancel := context.WithTimeout(ra.ctx, ra.s.opts.Timeout)
		b.err = ra.s.backend.ReadBatch(ctx, []fs.ReadRequest{{File: ra.f, Off: off, Buf: buf}})
		cancel()
		if b.err == nil {
			ra.s.stats.raBytes.Add(int64(len(buf)))
		}
		ra.mu.Lock()
		b.fetched = true
		close(b.done)
		ra.maybeFreeLocked(b)
		ra.mu.Unlock()
	}()
	return true
}

func (ra *readahead) dropLocked(b *raBlock) {
	if ra.blocks[b.off] == b {
		delete(ra.blocks, b.off)
	}
	b.dropped = true
	ra.maybeFreeLocked(b)
}

func (ra *readahead) maybeFreeLocked(b *raBlock) {
	if !b.dropped || !b.fetched || b.readers > 0 || b.buf == nil {
		return
	}
	buf := b.buf[:0]
	b.buf = nil
	raBufPool.Put(&buf)
	<-ra.s.raSem
}

// close cancels the fetches in flight and frees the window.
func (ra *readahead) close() {
	ra.cancel()
	ra.mu.Lock()
	ra.closed = true
	for _, b := range ra.blocks {
		ra.dropLocked(b)
	}
	ra.mu.Unlock()
}

// alignedBuffer returns n bytes starting at a 4 KiB boundary, so that a
// backend reading with O_DIRECT fills it without a bounce copy.
func alignedBuffer(n int) []byte {
	const align = 4096
	b := make([]byte, n+align)
	o := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % align)
	if o != 0 {
		o = align - o
	}
	return b[o : o+n : o+n]
}
