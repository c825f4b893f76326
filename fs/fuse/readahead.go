package fuse

import (
	"context"
	"sync"
	"time"
	"unsafe"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

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
	last   int64              // end of the last read; guarded by mu
	streak int                // sequential reads in a row; guarded by mu
	blocks map[int64]*raBlock // by block offset; guarded by mu
	closed bool               // guarded by mu
	// whole: the whole file was fetched at open (Options.ReadWhole); its
	// blocks stay until the handle is released and serve every read, in
	// any order. Guarded by mu.
	whole bool
	// wholeTokens are the raSem tokens a whole-file fetch took (one per
	// ReadAheadBlock of the file, as the window's blocks take), given
	// back when the last of its blocks, wholeLive, is freed. Guarded by mu.
	wholeTokens, wholeLive int
	// [keepLo, keepHi) is the window around where the reader was before
	// its last jump, kept so that coming back finds it (numpy reads the
	// head of a file, then its tail, then the head again; Parquet readers
	// the footer, then the columns). Guarded by mu.
	keepLo, keepHi int64
	// fetched counts the bytes read ahead, served those returned from
	// the window. Guarded by mu.
	fetched, served int64
}

// raStart is how many reads in a row must be sequential (each within a
// block of the previous one's end) before read-ahead fetches: random reads
// land that close by chance, but rarely 4 times in a row. Once less than
// half of what was read ahead has been used (random reads inside a small
// file, where most reads are "near"), raRestart reads in a row are needed.
const (
	raStart   = 4
	raRestart = 64
)

// raBlock is one block of read-ahead. Its buffer is freed (its token
// returned) when it is dropped from the window, fetched, and no reader is
// copying from it.
type raBlock struct {
	off  int64
	buf  []byte
	done chan struct{} // closed when the fetch ended
	err  error         // set before done is closed

	fetched bool // guarded by readahead.mu
	used    bool // served a read; guarded by readahead.mu
	// served has a bit per page of buf that a read was served from (the
	// kernel has the page then); guarded by readahead.mu.
	served  []uint64
	dropped bool // guarded by readahead.mu
	readers int  // readers copying out; guarded by readahead.mu
	token   bool // holds a token of Server.raSem (else its whole-file fetch does)
}

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

// result returns bytes [off, off+n) from the window if the access is
// sequential and the window covers it; false means the caller must read
// them itself. The result points into the read-ahead blocks (no copy):
// they stay allocated until go-fuse has sent the reply and calls Done.
func (ra *readahead) result(off int64, n int) (gofuse.ReadResult, bool) {
	end := off + int64(n)
	ra.mu.Lock()
	if ra.closed {
		ra.mu.Unlock()
		return nil, false
	}
	first := off / ra.bs * ra.bs
	_, inWindow := ra.blocks[first]
	// Near the previous read: within a block of its end, either side
	// (the kernel sends the pieces of a large request, and its own
	// read-ahead, in parallel, so they arrive out of order).
	near := off <= ra.last+ra.bs && off >= ra.last-ra.bs
	// The window [first, off+window), shrunk to a fair share of the
	// mount's read-ahead memory when many handles read ahead at once
	// (else the first ones take it all and the others read block by
	// block). A handle holds the window, the block the window starts in
	// part-way, and the block before: share - 2 blocks.
	window := ra.window
	if active := ra.s.raActive.Load(); active > 1 {
		share := int64(cap(ra.s.raSem)) / active
		window = min(window, max(1, share-2)*ra.bs)
	}
	switch {
	case ra.whole:
	case near || inWindow:
		ra.streak++
	default:
		// A jump: random reads start no read-ahead, but the window of a
		// reader that was sequential is kept, so that one that comes
		// back (to where it was, or to what it read ahead) resumes with
		// it. The window kept at the jump before is dropped below.
		ra.streak = 0
		lastFirst := ra.last / ra.bs * ra.bs
		ra.keepLo, ra.keepHi = lastFirst-ra.bs, ra.last+ra.window
	}
	ra.last = end
	if !ra.whole {
		// Drop the blocks outside the window, counting one block behind
		// the read (kernel reads may arrive slightly out of order), and
		// outside the window kept from before the last jump. (The whole
		// window, not the fair share: blocks fetched before more handles
		// shared the memory are used, not thrown away.)
		for o, b := range ra.blocks {
			if o+ra.bs > first-ra.bs && o < off+ra.window {
				continue
			}
			if o+ra.bs > ra.keepLo && o < ra.keepHi {
				continue
			}
			ra.dropLocked(b)
		}
	}
	start := raStart
	if ra.fetched > 2*ra.window && 2*ra.served < ra.fetched {
		start = raRestart
	}
	fill := ra.streak >= start && !ra.whole
	if !fill && !inWindow {
		ra.mu.Unlock()
		return nil, false
	}
	for o := first; fill && o < off+window && o < ra.size; o += ra.bs {
		if _, ok := ra.blocks[o]; ok {
			continue
		}
		if !ra.startLocked(o, true) {
			break // no memory left for read-ahead: read what we have
		}
	}
	var need []*raBlock
	for o := first; o < end; o += ra.bs {
		b, ok := ra.blocks[o]
		if !ok {
			for _, b := range need {
				b.readers--
				ra.maybeFreeLocked(b)
			}
			ra.mu.Unlock()
			return nil, false
		}
		b.readers++
		b.used = true
		if ra.whole { // for the store of the fetch (kcache.go)
			b.markServed(max(off, b.off)-b.off, min(end, b.off+int64(len(b.buf)))-b.off)
		}
		need = append(need, b)
	}
	ra.served += int64(n)
	ra.mu.Unlock()

	r := &raResult{ra: ra, blocks: need, size: n}
	for _, b := range need {
		select {
		case <-b.done:
		default:
			// The reader caught up with the read-ahead: the storage is
			// the bottleneck (Stats.ReadAheadWaits tells how often).
			t := time.Now()
			<-b.done
			ra.s.stats.raWaits.Add(1)
			ra.s.stats.raWaitNanos.Add(int64(time.Since(t)))
		}
		if b.err != nil {
			r.fail()
			return nil, false
		}
		lo := max(off, b.off)
		hi := min(end, b.off+int64(len(b.buf)))
		if hi <= lo {
			r.fail()
			return nil, false
		}
		r.slices = append(r.slices, b.buf[lo-b.off:hi-b.off])
	}
	return r, true
}

// fetchWhole starts fetching the whole file into the window, if the
// mount's read-ahead memory has room for all of it; false if not (then
// nothing was started). A file being read is fetched in parallel pieces
// of one FUSE request, so that a read waits for its own piece only; a
// file fetched ahead of its open (ahead) in one batched read per
// ReadAheadBlock: one storage round trip and one sequential read of a
// chunk for each, not one per piece.
func (ra *readahead) fetchWhole(ahead bool) bool {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	need := int((ra.size + ra.bs - 1) / ra.bs)
	for i := range need {
		select {
		case ra.s.raSem <- struct{}{}:
		default:
			for range i {
				<-ra.s.raSem
			}
			return false
		}
	}
	ra.wholeTokens = need
	ra.whole = true
	group := int64(ra.s.opts.ReadAheadBlock)
	ra.bs = int64(min(ra.s.opts.ReadAheadBlock, ra.s.opts.MaxRequest))
	var offs []int64
	for o := int64(0); o < ra.size; o += ra.bs {
		if len(offs) > 0 && (!ahead || o/group != offs[0]/group) {
			ra.startGroupLocked(offs)
			offs = offs[:0]
		}
		offs = append(offs, o)
		ra.wholeLive++
	}
	ra.startGroupLocked(offs)
	return true
}

// isWhole: the whole file is fetched (fetchWhole).
func (ra *readahead) isWhole() bool {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return ra.whole && !ra.closed
}

// markServed records that a read was served from buf[lo:hi] (the kernel
// reads whole pages: a partly read page counts as read).
func (b *raBlock) markServed(lo, hi int64) {
	pages := (int64(len(b.buf)) + pageSize - 1) / pageSize
	if b.served == nil {
		b.served = make([]uint64, (pages+63)/64)
	}
	for p := lo / pageSize; p < (hi+pageSize-1)/pageSize && p < pages; p++ {
		b.served[p/64] |= 1 << (p % 64)
	}
}

// servedWhole: reads were served from every page of b: the kernel has
// its pages already.
func (ra *readahead) servedWhole(b *raBlock) bool {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	pages := (int64(len(b.buf)) + pageSize - 1) / pageSize
	if b.served == nil {
		return pages == 0
	}
	for p := range pages {
		if b.served[p/64]&(1<<(p%64)) == 0 {
			return false
		}
	}
	return true
}

// holdWhole returns the blocks of a whole-file fetch in order, each held
// (fetched or not) until the caller releases them (release); false if
// the window was closed or is not a whole-file fetch.
func (ra *readahead) holdWhole() ([]*raBlock, bool) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if ra.closed || !ra.whole {
		return nil, false
	}
	var bs []*raBlock
	for o := int64(0); o < ra.size; o += ra.bs {
		b, ok := ra.blocks[o]
		if !ok {
			for _, b := range bs {
				b.readers--
				ra.maybeFreeLocked(b)
			}
			return nil, false
		}
		b.readers++
		bs = append(bs, b)
	}
	return bs, true
}

// raResult is a FUSE read reply made of slices of read-ahead blocks. It
// implements go-fuse's vectored result (Slices), so the reply is written
// with writev straight from the blocks, which are released by Done.
type raResult struct {
	ra     *readahead
	blocks []*raBlock
	slices [][]byte
	size   int
	once   sync.Once
}

var _ gofuse.ReadResult = (*raResult)(nil)

func (r *raResult) Size() int { return r.size }

func (r *raResult) Slices() ([][]byte, gofuse.Status) { return r.slices, gofuse.OK }

func (r *raResult) Bytes(buf []byte) ([]byte, gofuse.Status) {
	if len(buf) < r.size {
		buf = make([]byte, r.size)
	}
	n := 0
	for _, s := range r.slices {
		n += copy(buf[n:], s)
	}
	return buf[:n], gofuse.OK
}

func (r *raResult) Done() { r.once.Do(func() { r.ra.release(r.blocks, false) }) }

// fail releases the blocks of a result that cannot be served; failed
// blocks are dropped so that the next read fetches them again.
func (r *raResult) fail() { r.once.Do(func() { r.ra.release(r.blocks, true) }) }

func (ra *readahead) release(blocks []*raBlock, dropFailed bool) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for _, b := range blocks {
		b.readers--
		if dropFailed && b.err != nil {
			ra.dropLocked(b)
		}
		ra.maybeFreeLocked(b)
	}
}

// startLocked starts fetching the block at off, taking a token of the
// mount's read-ahead memory if token is set (a whole-file fetch took its
// tokens already); false if that memory is used up.
func (ra *readahead) startLocked(off int64, token bool) bool {
	if token {
		select {
		case ra.s.raSem <- struct{}{}:
		default:
			return false
		}
	}
	ra.fetchLocked([]*raBlock{ra.newBlockLocked(off, token)})
	return true
}

// startGroupLocked starts fetching the blocks at offs (a whole-file
// fetch's, which holds their tokens) in one batched read.
func (ra *readahead) startGroupLocked(offs []int64) {
	bs := make([]*raBlock, len(offs))
	for i, o := range offs {
		bs[i] = ra.newBlockLocked(o, false)
	}
	ra.fetchLocked(bs)
}

// newBlockLocked adds the block at off to the window, not fetched yet.
func (ra *readahead) newBlockLocked(off int64, token bool) *raBlock {
	n := min(ra.bs, ra.size-off)
	buf := getBlock(int(ra.bs))[:n]
	b := &raBlock{off: off, buf: buf, done: make(chan struct{}), token: token}
	if len(ra.blocks) == 0 {
		ra.s.raActive.Add(1)
	}
	ra.blocks[off] = b
	ra.fetched += n
	return b
}

// fetchLocked fetches blocks (new ones, of this window) with one
// ReadBatch in the background.
func (ra *readahead) fetchLocked(blocks []*raBlock) {
	ra.s.wg.Add(1)
	go func() {
		defer ra.s.wg.Done()
		reqs := make([]fs.ReadRequest, len(blocks))
		var n int64
		for i, b := range blocks {
			reqs[i] = fs.ReadRequest{File: ra.f, Off: b.off, Buf: b.buf}
			n += int64(len(b.buf))
		}
		ctx, cancel := context.WithTimeout(ra.ctx, ra.s.opts.Timeout)
		err := ra.s.backend.ReadBatch(ctx, reqs)
		cancel()
		if err == nil {
			ra.s.stats.raBytes.Add(n)
		}
		ra.mu.Lock()
		for _, b := range blocks {
			b.err = err
			b.fetched = true
			close(b.done)
			ra.maybeFreeLocked(b)
		}
		ra.mu.Unlock()
	}()
}

func (ra *readahead) dropLocked(b *raBlock) {
	if ra.blocks[b.off] == b {
		delete(ra.blocks, b.off)
		if len(ra.blocks) == 0 {
			ra.s.raActive.Add(-1)
		}
		if !b.used && !ra.closed {
			ra.s.stats.raWasted.Add(1)
		}
	}
	b.dropped = true
	ra.maybeFreeLocked(b)
}

func (ra *readahead) maybeFreeLocked(b *raBlock) {
	if !b.dropped || !b.fetched || b.readers > 0 || b.buf == nil {
		return
	}
	putBlock(b.buf)
	b.buf = nil
	if b.token {
		<-ra.s.raSem
		return
	}
	if ra.wholeLive--; ra.wholeLive == 0 {
		for range ra.wholeTokens {
			<-ra.s.raSem
		}
		ra.wholeTokens = 0
	}
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
