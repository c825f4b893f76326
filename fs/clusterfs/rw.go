package clusterfs

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

// Writes at any offset (fs.RandomAccessFS, for the FUSE mount): a
// WriteFile holds a write session on the file's inode; WriteAt of
// wbDirect bytes or more writes the affected chunks through the chain
// heads at once (acknowledged = on every replica); smaller writes are
// buffered in the handle and written back on Flush, Sync, Close, Truncate
// or when too many are buffered (see writebehind.go). This handle sees its
// writes at once; other readers see them after Flush, Sync or Close (close-
// to-open). The file's length is published by Flush, Sync and Close (the
// largest end this handle wrote; concurrent writers' lengths merge to the
// largest). A file opened this way is marked as possibly having holes.
// A file removed while open stays readable and writable through the
// handle: its chunks are collected only after the session ends.

var _ fs.RandomAccessFS = (*FS)(nil)

// OpenWrite opens name for reading and writing at any offset.
func (f *FS) OpenWrite(ctx context.Context, name string, flag int) (fs.WriteFile, error) {
	p := abs(name)
	n, sid, err := f.meta.OpenWrite(ctx, p, flag&fs.OCreate != 0, flag&fs.OExcl != 0)
	if err != nil {
		return nil, wrap("open for writing", f.String()+p, err)
	}
	if n.Layout == nil || len(n.Layout.Chains) == 0 || n.Layout.ChunkSize <= 0 {
		f.meta.CloseSession(ctx, n.ID, sid, 0, n.TruncVer)
		return nil, fmt.Errorf("open %s%s: inode %d has no layout", f, p, n.ID)
	}
	w := &wfile{fs: f, name: name, inode: n.ID, layout: *n.Layout, session: sid,
		size: n.Size, reported: n.Size, truncVer: n.TruncVer, lastRenew: time.Now()}
	f.writers.add(n.ID, 1)
	if flag&fs.OTrunc != 0 && n.Size > 0 {
		if err := w.Truncate(0); err != nil {
			w.Close()
			return nil, err
		}
	}
	return w, nil
}

var _ fs.EmptyCreator = (*FS)(nil)

// CreateEmpty creates an empty file at name: one metadata transaction,
// no write session.
func (f *FS) CreateEmpty(ctx context.Context, name string, exclusive bool) error {
	p := abs(name)
	_, err := f.meta.Create(ctx, p, exclusive)
	return wrap("create", f.String()+p, err)
}

var _ fs.EmptyCreatorInfo = (*FS)(nil)

// CreateEmptyInfo is CreateEmpty returning the file as Stat does.
func (f *FS) CreateEmptyInfo(ctx context.Context, name string, exclusive bool) (fs.FileInfo, error) {
	p := abs(name)
	n, err := f.meta.Create(ctx, p, exclusive)
	if err != nil {
		return fs.FileInfo{}, wrap("create", f.String()+p, err)
	}
	fi := info(p, n)
	fi.Sys = n
	return fi, nil
}

// Truncate sets the length of name (it fails with meta.ErrBusy while
// another writer has the file open and the length would shrink).
func (f *FS) Truncate(ctx context.Context, name string, size int64) error {
	p := abs(name)
	_, err := f.meta.Truncate(ctx, p, size, "")
	return wrap("truncate", f.String()+p, err)
}

type wfile struct {
	fs      *FS
	name    string
	inode   uint64
	layout  meta.Layout
	session string

	// wbMu orders write-back against direct writes and reads: writeBack
	// holds it for writing, WriteAt (direct) and ReadAt for reading.
	wbMu sync.RWMutex

	mu         sync.Mutex // guards the fields below
	dirty      map[uint64]*dirtyChunk
	dirtyBytes int64
	size       int64 // the length as this handle knows it
	reported   int64 // the length last published to the metadata service
	truncVer   uint64
	lastRenew  time.Time
	closed     bool
}

func (w *wfile) Name() string { return w.name }

func (w *wfile) Size() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.size
}

// pieces splits [off, off+len(p)) at chunk boundaries.
func (w *wfile) pieces(off int64, p []byte, fn func(idx uint64, in int64, b []byte)) {
	cs := w.layout.ChunkSize
	for len(p) > 0 {
		idx := uint64(off / cs)
		in := off % cs
		k := min(int64(len(p)), cs-in)
		fn(idx, in, p[:k])
		p, off = p[k:], off+k
	}
}

func (w *wfile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: %s: negative offset %d", fs.ErrBadPath, w.name, off)
	}
	size := w.Size()
	if off >= size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), size-off))
	w.wbMu.RLock()
	defer w.wbMu.RUnlock()
	var reads []client.ChunkRead
	w.pieces(off, p[:n], func(idx uint64, in int64, b []byte) {
		reads = append(reads, client.ChunkRead{Chain: w.layout.Chain(idx), Chunk: client.ChunkID{Inode: w.inode, Index: idx}, Off: in, Buf: b})
	})
	// Bytes past a chunk's stored end are holes: ReadChunks zero-fills them.
	if err := w.fs.chunks.ReadChunks(context.Background(), reads); err != nil {
		return 0, wrap("read", w.fs.String()+w.name, err)
	}
	w.mu.Lock()
	w.overlayBuffered(p[:n], off)
	w.mu.Unlock()
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (w *wfile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: %s: negative offset %d", fs.ErrBadPath, w.name, off)
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return 0, fmt.Errorf("clusterfs: write to %s after Close", w.name)
	}
	over := false
	direct := len(p) >= wbDirect || w.fs.opts.WriteBehind < 0
	if !direct {
		over = w.buffer(p, off)
		w.size = max(w.size, off+int64(len(p)))
	}
	w.mu.Unlock()
	if direct {
		if err := w.writeDirect(p, off); err != nil {
			return 0, err
		}
	} else if over {
		if err := w.writeBack(context.Background()); err != nil {
			return 0, err
		}
	}
	w.mu.Lock()
	renew := time.Since(w.lastRenew) > 10*time.Second
	w.mu.Unlock()
	if renew {
		// Keeps the session alive and publishes the length on the way.
		if err := w.Flush(); err != nil {
			return len(p), err
		}
	}
	return len(p), nil
}

// writeDirect writes p at off through the chains at once, dropping the
// buffered bytes it overwrites.
func (w *wfile) writeDirect(p []byte, off int64) error {
	w.wbMu.RLock()
	defer w.wbMu.RUnlock()
	w.mu.Lock()
	w.dropBuffered(off, len(p))
	w.mu.Unlock()
	g, gctx := errgroup.WithContext(context.Background())
	g.SetLimit(w.fs.opts.WriteParallel)
	w.pieces(off, p, func(idx uint64, in int64, b []byte) {
		g.Go(func() error {
			return w.fs.chunks.WriteChunk(gctx, w.layout.Chain(idx), client.ChunkID{Inode: w.inode, Index: idx}, in, b)
		})
	})
	if err := g.Wait(); err != nil {
		return wrap("write", w.fs.String()+w.name, err)
	}
	w.mu.Lock()
	w.size = max(w.size, off+int64(len(p)))
	w.mu.Unlock()
	return nil
}

func (w *wfile) Truncate(size int64) error {
	if size < 0 {
		return fmt.Errorf("%w: truncate %s to %d", fs.ErrBadPath, w.name, size)
	}
	ctx := context.Background()
	// Buffered writes land first, so that the cut applies to them too.
	if err := w.writeBack(ctx); err != nil {
		return err
	}
	// The metadata service cuts the chunks past the new length only when
	// the length shrinks in its view. This handle's writes past the length
	// it last published are in the chunks but not yet in that view: publish
	// them first, or a shrink below them would be taken as an extension and
	// the cut bytes would come back when the file grows again.
	w.mu.Lock()
	cur, reported, tv := w.size, w.reported, w.truncVer
	w.mu.Unlock()
	if size < cur && cur > reported {
		if _, err := w.fs.meta.Extend(ctx, w.inode, cur, tv, w.session); err != nil {
			return wrap("truncate", w.fs.String()+w.name, err)
		}
	}
	n, err := w.fs.meta.TruncateInode(ctx, w.inode, size, w.session)
	if err != nil {
		return wrap("truncate", w.fs.String()+w.name, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.size, w.reported, w.truncVer = n.Size, n.Size, n.TruncVer
	return nil
}

// Flush writes the buffered writes back, then publishes the length when
// it grew (and renews the session).
func (w *wfile) Flush() error {
	if err := w.writeBack(context.Background()); err != nil {
		return err
	}
	w.mu.Lock()
	size, reported, tv := w.size, w.reported, w.truncVer
	renew := time.Since(w.lastRenew) > 10*time.Second
	w.mu.Unlock()
	if size <= reported && !renew {
		return nil
	}
	n, err := w.fs.meta.Extend(context.Background(), w.inode, size, tv, w.session)
	if err != nil {
		return wrap("flush", w.fs.String()+w.name, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reported = max(w.reported, size)
	w.lastRenew = time.Now()
	// Another writer may have extended the file further.
	w.size = max(w.size, n.Size)
	return nil
}

// Sync is Flush: chunk writes (the buffered ones written back by Flush) are
// durable on every replica when acknowledged.
func (w *wfile) Sync() error { return w.Flush() }

// Close publishes the length and ends the write session.
func (w *wfile) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	// The buffered writes land before the length is published; if they
	// cannot, the session still ends and Close reports the loss.
	wbErr := w.writeBack(context.Background())
	w.fs.writers.add(w.inode, -1)
	w.mu.Lock()
	size, tv := w.size, w.truncVer
	w.mu.Unlock()
	_, err := w.fs.meta.CloseSession(context.Background(), w.inode, w.session, size, tv)
	if wbErr != nil {
		return wbErr
	}
	return wrap("close", w.fs.String()+w.name, err)
}
