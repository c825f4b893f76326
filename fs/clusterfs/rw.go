package clusterfs

// Random-access writes (fs.RandomAccessFS), for the FUSE mount and any
// writer at offsets. Written by the FUSE engineer (issue 7) over the chunk
// client's WriteChunk/TruncateChunk and the metadata service's write
// sessions (OpenWrite, Extend, CloseSession, Truncate).

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/meta"
)

var (
	_ fs.RandomAccessFS = (*FS)(nil)
	_ fs.WriteFile      = (*writeFile)(nil)
)

// sessionRenew is how often an open write file renews its session (the
// metadata service ends sessions not renewed for SessionTTL, 60 s).
const sessionRenew = 10 * time.Second

// OpenWrite opens name for reading and writing at any offset, holding a
// write session on it: while it is open, the file's chunks stay even if
// the file is removed (unlink while open).
//
// Consistency: WriteAt buffers (write-behind, whole chunks sent in the
// background); Flush, Sync and Close store every pending byte on every
// replica (the chunk client's WriteChunk returns once all have it durably)
// and then publish the length (the metadata service keeps the largest end
// reported), so a reader opening the file after close sees it all. Holes (a write
// past the end, a truncate that extends) are filled with zeros in storage
// before the length covers them, so every reader finds stored bytes for
// the whole length. Truncate is by path: after a rename of the open file,
// truncate through the new name.
func (f *FS) OpenWrite(ctx context.Context, name string, flag int) (fs.WriteFile, error) {
	p := abs(name)
	n, sid, err := f.meta.OpenWrite(ctx, p, flag&fs.OCreate != 0, flag&fs.OExcl != 0)
	if err != nil {
		return nil, wrap("open for writing", f.String()+p, err)
	}
	if n.Layout == nil || len(n.Layout.Chains) == 0 || n.Layout.ChunkSize <= 0 {
		f.meta.CloseSession(context.WithoutCancel(ctx), n.ID, sid, 0, n.TruncVer)
		return nil, fmt.Errorf("open %s%s for writing: inode %d has no layout", f.String(), p, n.ID)
	}
	w := &writeFile{fs: f, name: name, path: p, id: n.ID, layout: *n.Layout, session: sid,
		size: n.Size, published: n.Size, filled: n.Size, truncVer: n.TruncVer, stop: make(chan struct{}),
		pending: map[uint64]*pendingChunk{}, inflight: map[uint64]chan struct{}{}, sendSem: make(chan struct{}, f.opts.WriteParallel)}
	if flag&fs.OTrunc != 0 && n.Size > 0 {
		if err := w.Truncate(0); err != nil {
			w.Close()
			return nil, err
		}
	}
	w.wg.Add(1)
	go w.renew()
	return w, nil
}

// Truncate sets the length of name (cutting chunks, or extending with
// stored zeros).
func (f *FS) Truncate(ctx context.Context, name string, size int64) error {
	w, err := f.OpenWrite(ctx, name, 0)
	if err != nil {
		return err
	}
	err = w.Truncate(size)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

type writeFile struct {
	fs      *FS
	name    string // as opened
	path    string // absolute cluster path
	id      uint64
	layout  meta.Layout
	session string

	mu sync.Mutex
	// size is the length as this handle knows it: the length at open,
	// moved by its writes and truncates. Guarded by mu.
	size int64
	// published is the length last reported to the metadata service.
	// Guarded by mu.
	published int64
	// filled: every chunk byte below it is stored (zeros in holes).
	// Guarded by mu.
	filled   int64
	truncVer uint64 // guarded by mu
	closed   bool   // guarded by mu

	// pending holds written bytes not yet sent to storage, per chunk
	// (write-behind): a chunk is sent when its bytes cover it whole, when
	// too many chunks are pending, and on Flush, Sync, Truncate, ReadAt
	// and Close. Guarded by mu.
	pending map[uint64]*pendingChunk
	// inflight has a channel per chunk being sent, closed when it is
	// stored: a chunk is never sent twice at once, so a newer write to it
	// cannot be overtaken by an older one. Guarded by mu.
	inflight map[uint64]chan struct{}
	// wbErr is the first failure of a write-behind send, returned by the
	// next WriteAt, Flush, Sync or Close. Guarded by mu.
	wbErr   error
	sending sync.WaitGroup // write-behind sends in flight
	sendSem chan struct{}  // bounds them (Options.WriteParallel)

	// fillMu serialises hole filling (it extends chunks; never shrinks).
	fillMu sync.Mutex

	stop chan struct{}  // closed by Close: ends renew
	wg   sync.WaitGroup // renew
}

func (w *writeFile) Name() string { return w.name }

func (w *writeFile) Size() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.size
}

// ctx is the context of a call without one: the chunk and metadata
// clients bound it by their own retry budget.
func (w *writeFile) ctx() context.Context { return context.Background() }

func (w *writeFile) renew() {
	defer w.wg.Done()
	t := time.NewTicker(sessionRenew)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), sessionRenew)
			w.fs.meta.Extend(ctx, w.id, 0, 0, w.session) // renews only; a failure is retried next tick
			cancel()
		}
	}
}

// pieces splits [off, off+len(p)) at chunk boundaries.
func (w *writeFile) pieces(off int64, p []byte, fn func(idx uint64, in int64, b []byte)) {
	cs := w.layout.ChunkSize
	for len(p) > 0 {
		idx := uint64(off / cs)
		in := off % cs
		k := min(int64(len(p)), cs-in)
		fn(idx, in, p[:k])
		p, off = p[k:], off+k
	}
}

func (w *writeFile) chunk(idx uint64) client.ChunkID { return client.ChunkID{Inode: w.id, Index: idx} }

// fill stores zeros in the chunks between the filled mark and the chunk
// holding end (that chunk zero-fills itself on write), so that no reader
// meets a missing chunk inside the length.
func (w *writeFile) fill(end int64) error {
	w.fillMu.Lock()
	defer w.fillMu.Unlock()
	w.mu.Lock()
	from := w.filled
	w.mu.Unlock()
	if end <= from {
		return nil
	}
	cs := w.layout.ChunkSize
	first, last := uint64(from/cs), uint64(end/cs) // chunks [first, last) become full
	g, ctx := errgroup.WithContext(w.ctx())
	g.SetLimit(w.fs.opts.WriteParallel)
	for idx := first; idx < last; idx++ {
		g.Go(func() error {
			return w.fs.chunks.TruncateChunk(ctx, w.layout.Chain(idx), w.chunk(idx), cs)
		})
	}
	if err := g.Wait(); err != nil {
		return wrap("fill a hole of", w.fs.String()+w.path, err)
	}
	if end%cs != 0 {
		// The chunk holding end: extend it to end (a write there would too).
		idx := uint64(end / cs)
		if err := w.fs.chunks.TruncateChunk(w.ctx(), w.layout.Chain(idx), w.chunk(idx), end%cs); err != nil {
			return wrap("fill a hole of", w.fs.String()+w.path, err)
		}
	}
	w.mu.Lock()
	w.filled = max(w.filled, end)
	w.mu.Unlock()
	return nil
}

// maxPending bounds the chunks buffered per open file (each up to one
// chunk size of memory) beyond those being sent.
const maxPending = 8

// WriteAt buffers p at off (write-behind) and returns; full chunks are
// sent to storage in the background, up to Options.WriteParallel at once.
// A failed send is reported by the next WriteAt, Flush, Sync or Close.
func (w *writeFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: %s: write at negative offset %d", fs.ErrBadPath, w.name, off)
	}
	w.mu.Lock()
	closed, filled, err := w.closed, w.filled, w.wbErr
	w.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("clusterfs: write to %s after Close", w.name)
	}
	if err != nil {
		return 0, err
	}
	cs := w.layout.ChunkSize
	start := off / cs * cs // the chunk of off zero-fills itself up to off
	if start > filled {
		if err := w.fill(start); err != nil {
			return 0, err
		}
	}
	end := off + int64(len(p))
	var send []*pendingChunk
	w.mu.Lock()
	w.pieces(off, p, func(idx uint64, in int64, b []byte) {
		pc := w.pending[idx]
		if pc == nil {
			pc = &pendingChunk{idx: idx, buf: getChunkBuf(cs)}
			w.pending[idx] = pc
		}
		pc.add(in, b)
		if pc.covers(cs) {
			delete(w.pending, idx)
			send = append(send, pc)
		}
	})
	for len(w.pending) > maxPending {
		// Too many partly written chunks (random writes): send the lowest.
		var low *pendingChunk
		for _, pc := range w.pending {
			if low == nil || pc.idx < low.idx {
				low = pc
			}
		}
		delete(w.pending, low.idx)
		send = append(send, low)
	}
	w.size = max(w.size, end)
	if start <= w.filled {
		w.filled = max(w.filled, end)
	}
	w.mu.Unlock()
	for _, pc := range send {
		w.send(pc)
	}
	return len(p), nil
}

// send stores a pending chunk in the background, after any earlier send
// of the same chunk.
func (w *writeFile) send(pc *pendingChunk) {
	w.sendSem <- struct{}{}
	w.sending.Add(1)
	for {
		w.mu.Lock()
		prev := w.inflight[pc.idx]
		if prev == nil {
			w.inflight[pc.idx] = make(chan struct{})
			w.mu.Unlock()
			break
		}
		w.mu.Unlock()
		<-prev
	}
	go func() {
		defer w.sending.Done()
		var err error
		for _, e := range pc.ext {
			if err = w.fs.chunks.WriteChunk(w.ctx(), w.layout.Chain(pc.idx), w.chunk(pc.idx), e.lo, pc.buf[e.lo:e.hi]); err != nil {
				err = wrap("write", w.fs.String()+w.path, fmt.Errorf("chunk %d [%d, %d): %w", pc.idx, e.lo, e.hi, err))
				break
			}
		}
		putChunkBuf(pc.buf)
		w.mu.Lock()
		if err != nil && w.wbErr == nil {
			w.wbErr = err
		}
		close(w.inflight[pc.idx])
		delete(w.inflight, pc.idx)
		w.mu.Unlock()
		<-w.sendSem
	}()
}

// flushData sends every pending chunk and waits until all are stored.
func (w *writeFile) flushData() error {
	w.mu.Lock()
	send := make([]*pendingChunk, 0, len(w.pending))
	for idx, pc := range w.pending {
		send = append(send, pc)
		delete(w.pending, idx)
	}
	w.mu.Unlock()
	for _, pc := range send {
		w.send(pc)
	}
	w.sending.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wbErr
}

// pendingChunk is the written, unsent bytes of one chunk: buf is the
// whole chunk, ext the ranges of it written (sorted, merged).
type pendingChunk struct {
	idx uint64
	buf []byte
	ext []extent
}

type extent struct{ lo, hi int64 }

func (pc *pendingChunk) add(in int64, b []byte) {
	copy(pc.buf[in:], b)
	e := extent{in, in + int64(len(b))}
	out := pc.ext[:0:0]
	placed := false
	for _, x := range pc.ext {
		switch {
		case x.hi < e.lo:
			out = append(out, x)
		case e.hi < x.lo:
			if !placed {
				out = append(out, e)
				placed = true
			}
			out = append(out, x)
		default: // overlapping or adjacent: merge into e
			e = extent{min(e.lo, x.lo), max(e.hi, x.hi)}
		}
	}
	if !placed {
		out = append(out, e)
	}
	pc.ext = out
}

// covers reports whether the written ranges are the whole chunk.
func (pc *pendingChunk) covers(cs int64) bool {
	return len(pc.ext) == 1 && pc.ext[0].lo == 0 && pc.ext[0].hi == cs
}

var chunkBufs sync.Pool // of *[]byte

func getChunkBuf(cs int64) []byte {
	if p, ok := chunkBufs.Get().(*[]byte); ok && int64(cap(*p)) >= cs {
		return (*p)[:cs]
	}
	return make([]byte, cs)
}

func putChunkBuf(b []byte) { chunkBufs.Put(&b) }

// ReadAt reads what this handle sees: its own writes included (pending
// ones are stored first).
func (w *writeFile) ReadAt(p []byte, off int64) (int, error) {
	if err := w.flushData(); err != nil {
		return 0, err
	}
	size := w.Size()
	if off >= size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), size-off))
	var reads []client.ChunkRead
	w.pieces(off, p[:n], func(idx uint64, in int64, b []byte) {
		reads = append(reads, client.ChunkRead{Chain: w.layout.Chain(idx), Chunk: w.chunk(idx), Off: in, Buf: b})
	})
	if err := w.fs.chunks.ReadChunks(w.ctx(), reads); err != nil {
		return 0, wrap("read", w.fs.String()+w.path, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Truncate sets the length: shrinking cuts the chunks (the metadata
// service removes them, and refuses while another writer has the file
// open); extending stores zeros first.
func (w *writeFile) Truncate(size int64) error {
	if size < 0 {
		return fmt.Errorf("%w: %s: truncate to %d", fs.ErrBadPath, w.name, size)
	}
	if err := w.flushData(); err != nil {
		return err
	}
	w.mu.Lock()
	cur := w.size
	w.mu.Unlock()
	if size > cur {
		if err := w.fill(size); err != nil {
			return err
		}
	}
	n, err := w.fs.meta.Truncate(w.ctx(), w.path, size, w.session)
	if err != nil {
		return wrap("truncate", w.fs.String()+w.path, err)
	}
	w.mu.Lock()
	w.size, w.published, w.truncVer = size, size, n.TruncVer
	w.filled = min(w.filled, size)
	if size > cur {
		w.filled = max(w.filled, size)
	}
	w.mu.Unlock()
	return nil
}

// Flush stores the pending writes and publishes the length if this
// handle extended the file.
func (w *writeFile) Flush() error {
	if err := w.flushData(); err != nil {
		return err
	}
	w.mu.Lock()
	size, published, tv := w.size, w.published, w.truncVer
	w.mu.Unlock()
	if size <= published {
		return nil
	}
	if _, err := w.fs.meta.Extend(w.ctx(), w.id, size, tv, w.session); err != nil {
		return wrap("flush", w.fs.String()+w.path, err)
	}
	w.mu.Lock()
	w.published = max(w.published, size)
	w.mu.Unlock()
	return nil
}

// Sync is Flush: a chunk write is acknowledged only once it is durable on
// every replica (fsync before the chain commits), so storing the pending
// writes makes them durable.
func (w *writeFile) Sync() error { return w.Flush() }

// Close publishes the length and ends the write session.
func (w *writeFile) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	size, tv := w.size, w.truncVer
	w.mu.Unlock()
	close(w.stop)
	w.wg.Wait()
	werr := w.flushData()
	if werr != nil {
		// What was not stored must not be covered by the length: report
		// only the length published so far.
		w.mu.Lock()
		size = w.published
		w.mu.Unlock()
	}
	if _, err := w.fs.meta.CloseSession(w.ctx(), w.id, w.session, size, tv); err != nil && werr == nil {
		werr = wrap("close", w.fs.String()+w.path, err)
	}
	return werr
}
