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
// Consistency: WriteAt returns once every replica has the bytes (the
// chunk client's WriteChunk); Flush, Sync and Close publish the length
// (the metadata service keeps the largest end reported). Holes (a write
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
		size: n.Size, published: n.Size, filled: n.Size, truncVer: n.TruncVer, stop: make(chan struct{})}
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

// WriteAt writes p at off; the chunks it spans are written in parallel.
func (w *writeFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: %s: write at negative offset %d", fs.ErrBadPath, w.name, off)
	}
	w.mu.Lock()
	closed, filled := w.closed, w.filled
	w.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("clusterfs: write to %s after Close", w.name)
	}
	cs := w.layout.ChunkSize
	start := off / cs * cs // the chunk of off zero-fills itself up to off
	if start > filled {
		if err := w.fill(start); err != nil {
			return 0, err
		}
	}
	g, ctx := errgroup.WithContext(w.ctx())
	g.SetLimit(w.fs.opts.WriteParallel)
	w.pieces(off, p, func(idx uint64, in int64, b []byte) {
		g.Go(func() error {
			return w.fs.chunks.WriteChunk(ctx, w.layout.Chain(idx), w.chunk(idx), in, b)
		})
	})
	if err := g.Wait(); err != nil {
		return 0, wrap("write", w.fs.String()+w.path, err)
	}
	end := off + int64(len(p))
	w.mu.Lock()
	w.size = max(w.size, end)
	if start <= w.filled {
		w.filled = max(w.filled, end)
	}
	w.mu.Unlock()
	return len(p), nil
}

// ReadAt reads what this handle sees: its own writes included.
func (w *writeFile) ReadAt(p []byte, off int64) (int, error) {
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

// Flush publishes the length if this handle extended the file.
func (w *writeFile) Flush() error {
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

// Sync is Flush: every acknowledged chunk write is already durable on
// every replica (fsync before the chain commits).
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
	if _, err := w.fs.meta.CloseSession(w.ctx(), w.id, w.session, size, tv); err != nil {
		return wrap("close", w.fs.String()+w.path, err)
	}
	return nil
}
