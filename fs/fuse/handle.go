package fuse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ffkit/ffkit/fs"
)

// readHandle is a file opened read-only: a backend fs.File read through
// the batching dispatchers and, when read sequentially, read-ahead.
type readHandle struct {
	n      *node
	f      fs.File
	ra     *readahead // nil when read-ahead is off
	opened time.Time
}

// writeHandle is a file opened for writing (or for reading while this
// mount writes it): it shares the node's backend write file.
type writeHandle struct {
	n        *node
	wf       fs.WriteFile
	writable bool
}

var (
	_ gofs.FileReader   = (*readHandle)(nil)
	_ gofs.FileReleaser = (*readHandle)(nil)
	_ gofs.FileReader   = (*writeHandle)(nil)
	_ gofs.FileWriter   = (*writeHandle)(nil)
	_ gofs.FileFlusher  = (*writeHandle)(nil)
	_ gofs.FileFsyncer  = (*writeHandle)(nil)
	_ gofs.FileReleaser = (*writeHandle)(nil)
	_ gofs.FileWriter   = (*seqHandle)(nil)
	_ gofs.FileFlusher  = (*seqHandle)(nil)
	_ gofs.FileReleaser = (*seqHandle)(nil)
)

func (n *node) Open(_ context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	s := n.srv
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	trunc := flags&syscall.O_TRUNC != 0
	if (write || trunc) && s.opts.ReadOnly {
		return nil, 0, syscall.EROFS
	}
	p, errno := n.path()
	if errno != 0 {
		return nil, 0, errno
	}
	ctx, cancel := s.opContext()
	defer cancel()

	n.mu.Lock()
	active := n.wf != nil || n.seq != nil
	n.mu.Unlock()
	if !write && !trunc && !active {
		// A reader that opened with O_DIRECT bypasses the page cache below
		// us too (the backend's cold reads, fs.OpenOptions.Direct).
		direct := s.opts.Direct || flags&syscall.O_DIRECT != 0
		f, st, ok := n.openLooked(p, fs.OpenOptions{Direct: direct}, flags&syscall.O_DIRECT == 0)
		if !ok {
			var err error
			if f, err = s.backend.Open(ctx, p, fs.OpenOptions{Direct: direct}); err != nil {
				return nil, 0, s.errno(err)
			}
		}
		h := &readHandle{n: n, f: f, opened: time.Now()}
		// The version of the file opened: the LOOKUP's, or, opened anew
		// (the kernel sent no LOOKUP: its entry was still valid), the
		// file's own.
		v, vOK := versionOf(st)
		if fi, isInfo := f.(fs.InfoFile); !ok && isInfo {
			v, vOK = versionOf(fi.Info())
		} else if !ok {
			vOK = false
		}
		vOK = vOK && !direct
		if s.opts.ReadAhead > 0 && vOK && n.kernelHolds(v) {
			// An earlier open stored this very file in the kernel's
			// cache and nothing changed since: keep it, fetch nothing. A
			// page evicted since is read through the handle.
			h.ra = newReadahead(s, f)
			s.stats.keptFiles.Add(1)
			return h, gofuse.FOPEN_KEEP_CACHE | gofuse.FOPEN_NOFLUSH, 0
		}
		if s.opts.ReadAhead > 0 {
			// A small file is fetched whole now, while the kernel sends
			// its first READ: training code (np.load, image decoders,
			// torch.load) reads small files whole but not in order. Not
			// for a reader that opened with O_DIRECT: it chose its I/O.
			whole := flags&syscall.O_DIRECT == 0 && s.fetchesWhole(f.Size())
			if pf, ra, got := s.takePrefetched(p, st); got && whole && ok && !direct {
				// Fetched already: the file was next in a directory read
				// in listing order (prefetch.go).
				f.Close()
				h.f, h.ra = pf, ra
				s.stats.wholeFiles.Add(1)
			} else {
				if got {
					ra.close()
					pf.Close()
				}
				h.ra = newReadahead(s, f)
				if whole && h.ra.fetchWhole(false) {
					s.stats.wholeFiles.Add(1)
				}
			}
			if whole {
				s.prefetchAfter(p)
			}
		}
		if h.ra != nil && h.ra.isWhole() {
			// The fetch goes into the kernel's cache as it arrives, and
			// the open returns now: the reads of pages not stored yet
			// come to the handle, which serves them from the same fetch.
			if keep := h.startStore(ctx, v, vOK); keep != 0 {
				return h, keep | gofuse.FOPEN_NOFLUSH, 0
			}
		}
		// No FOPEN_KEEP_CACHE: the kernel drops cached pages on open
		// (close-to-open consistency). FOPEN_NOFLUSH: a read-only handle
		// has nothing to flush, so close(2) does not wait for a FLUSH
		// round trip through the mount.
		return h, gofuse.FOPEN_NOFLUSH, 0
	}
	if s.rw == nil {
		if trunc && flags&syscall.O_ACCMODE == syscall.O_WRONLY {
			// Rewriting a whole file: publish a new version on close.
			return n.startSeq(ctx, p)
		}
		return nil, 0, syscall.ENOTSUP
	}
	n.mu.Lock()
	seq := n.seq
	n.mu.Unlock()
	if seq != nil {
		return nil, 0, syscall.EBUSY
	}
	var oflag int
	if trunc {
		oflag |= fs.OTrunc
	}
	n.stopStores(ctx) // no older bytes may land in the kernel's cache after a write
	n.waitClosed(ctx)
	wf, errno := n.acquireWrite(ctx, p, oflag)
	if errno != 0 {
		return nil, 0, errno
	}
	return &writeHandle{n: n, wf: wf, writable: write}, gofuse.FOPEN_PARALLEL_DIRECT_WRITES, 0
}

// lookedFresh bounds the age of a LOOKUP's answer that an OPEN may use.
// The kernel looks every component of a path up again before an open
// (entry timeouts are 0, or the user chose staler names), so the answer
// is normally a few microseconds old; an open that had no LOOKUP of its
// own (a reopen through /proc/self/fd) may see a file as it was this long
// ago.
const lookedFresh = time.Second

// lookedUp records what a LOOKUP found, for the OPEN that follows.
func (n *node) lookedUp(st fs.FileInfo) {
	if st.Sys == nil {
		return
	}
	n.mu.Lock()
	n.looked, n.lookedAt, n.lookedEpoch = st, time.Now(), n.epoch
	n.mu.Unlock()
}

// openLooked opens the file from its last LOOKUP's answer, if the backend
// can (fs.InfoOpener) and the answer is fresh: an open then costs the
// cluster one metadata round trip (the LOOKUP's), not two. Each answer
// serves one open.
//
// A file that will be fetched whole (wholeOK, and small enough) is opened
// with fs.OpenOptions.Direct: its bytes are cached once, in the kernel's
// cache of the mount (kept across opens of the unchanged file), not also
// in the page cache of the storage's chunk files, and reading the chunks
// with O_DIRECT saves a fifth of the mount's CPU per file (a copy out of
// that page cache and the insertion of its pages).
func (n *node) openLooked(p string, o fs.OpenOptions, wholeOK bool) (fs.File, fs.FileInfo, bool) {
	io, ok := n.srv.backend.(fs.InfoOpener)
	if !ok {
		return nil, fs.FileInfo{}, false
	}
	n.mu.Lock()
	st, at := n.looked, n.lookedAt
	// A write file opened, written or closed through this mount since
	// the LOOKUP makes its answer stale.
	stale := n.lookedEpoch != n.epoch || n.wf != nil || n.seq != nil
	n.looked, n.lookedAt = fs.FileInfo{}, time.Time{}
	n.mu.Unlock()
	if stale || at.IsZero() || time.Since(at) > lookedFresh {
		return nil, fs.FileInfo{}, false
	}
	if s := n.srv; wholeOK && s.fetchesWhole(st.Size) {
		o.Direct = true
	}
	f, ok := io.OpenInfo(p, st, o)
	if ok {
		n.srv.stats.openLooked.Add(1)
	}
	return f, st, ok
}

// acquireWrite returns the node's shared write file, opening it if this is
// the first write handle, and takes a reference.
func (n *node) acquireWrite(ctx context.Context, p string, oflag int) (fs.WriteFile, syscall.Errno) {
	s := n.srv
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.wf != nil {
		if oflag&fs.OTrunc != 0 {
			wf, wb := n.wf, n.wb
			err := s.bounded(func() error {
				if wb != nil {
					// Gathered writes must land before the cut, not after it.
					if err := wb.flush(); err != nil {
						return err
					}
					defer wb.truncated(0)
				}
				return wf.Truncate(0)
			})
			if err != nil {
				return nil, s.errno(err)
			}
			n.mtime = time.Now()
		}
		n.wfRefs++
		return n.wf, 0
	}
	wf, err := s.rw.OpenWrite(ctx, p, oflag)
	if err != nil {
		return nil, s.errno(err)
	}
	n.wf, n.wfRefs = wf, 1
	if s.opts.WriteBuffer > 0 {
		n.wb = newWriteBuffer(wf, s.opts.WriteBuffer, s.opts.WriteBehind)
	}
	if oflag&(fs.OTrunc|fs.OCreate) != 0 {
		n.mtime = time.Now()
	}
	return wf, 0
}

// releaseWrite drops a reference; the last one closes the write file.
func (n *node) releaseWrite() syscall.Errno {
	n.mu.Lock()
	n.wfRefs--
	var wf fs.WriteFile
	var closed chan struct{}
	var wb *writeBuffer
	var wrote time.Time
	if n.wfRefs == 0 {
		wf, n.wf = n.wf, nil
		wb, n.wb = n.wb, nil
		wrote, n.mtime = n.mtime, time.Time{}
		closed = make(chan struct{})
		n.closing = closed
		n.epoch++
	}
	n.mu.Unlock()
	if wf == nil {
		return 0
	}
	err := n.srv.bounded(func() error {
		var werr error
		if wb != nil {
			werr = wb.flush()
		}
		if cerr := wf.Close(); werr == nil {
			werr = cerr
		}
		return werr
	})
	if err == nil {
		var known time.Time
		if a, ok := wf.(*asyncWrite); ok {
			known = a.createdTime()
		}
		n.keepTimes(wrote, known) // before anyone waiting for the close looks
	}
	n.closed()
	n.mu.Lock()
	if n.closing == closed {
		n.closing = nil
	}
	n.mu.Unlock()
	close(closed)
	return n.srv.errno(err)
}

func (n *node) Create(fctx context.Context, name string, flags uint32, mode uint32, out *gofuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	s := n.srv
	if s.opts.ReadOnly {
		return nil, nil, 0, syscall.EROFS
	}
	p, errno := n.childPath(name)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	ctx, cancel := s.opContext()
	defer cancel()
	ctx = s.ownerContext(ctx, fctx, mode)
	child := n.newChild(ctx, name, false)
	cn := child.Operations().(*node)
	// Created, or not: either way the name is described anew.
	defer s.mc.created(p, nil)
	s.pend.wait(ctx, p)
	cn.stopStores(ctx)
	if s.rw == nil {
		if flags&syscall.O_EXCL != 0 {
			if _, err := s.statCached(ctx, p); err == nil {
				return nil, nil, 0, syscall.EEXIST
			}
		}
		fh, fl, errno := cn.startSeq(ctx, p)
		if errno != 0 {
			return nil, nil, 0, errno
		}
		s.fillAttr(cn.report(s.newFileInfo(ctx, name)), &out.Attr)
		return child, fh, fl, 0
	}
	oflag := fs.OCreate
	if flags&syscall.O_EXCL != 0 {
		oflag |= fs.OExcl
	}
	if flags&syscall.O_TRUNC != 0 {
		oflag |= fs.OTrunc
	}
	wf, async := s.createAsync(ctx, cn, p, oflag) // see pending.go
	if !async {
		cn.waitClosed(ctx)
		wf, errno = cn.acquireWrite(ctx, p, oflag)
		if errno != 0 {
			return nil, nil, 0, errno
		}
	}
	s.fillAttr(cn.report(s.newFileInfo(ctx, name)), &out.Attr)
	h := &writeHandle{n: cn, wf: wf, writable: flags&syscall.O_ACCMODE != syscall.O_RDONLY}
	return child, h, gofuse.FOPEN_PARALLEL_DIRECT_WRITES, 0
}

func (h *readHandle) Read(_ context.Context, dest []byte, off int64) (gofuse.ReadResult, syscall.Errno) {
	s := h.n.srv
	s.stats.reads.Add(1)
	size := h.f.Size()
	if off >= size || len(dest) == 0 {
		return gofuse.ReadResultData(nil), 0
	}
	want := int(min(int64(len(dest)), size-off))
	s.stats.readBytes.Add(int64(want))
	if h.ra != nil {
		if rr, ok := h.ra.result(off, want); ok {
			s.stats.raHits.Add(1)
			return rr, 0
		}
	}
	buf := dest[:want]
	if err := s.readAt(h.f, buf, off); err != nil {
		return nil, s.errno(err)
	}
	return gofuse.ReadResultData(buf), 0
}

func (h *readHandle) Release(context.Context) syscall.Errno {
	if h.ra != nil {
		h.ra.close()
	}
	return h.n.srv.errno(h.n.srv.bounded(h.f.Close))
}

func (h *writeHandle) Read(_ context.Context, dest []byte, off int64) (gofuse.ReadResult, syscall.Errno) {
	s := h.n.srv
	s.stats.reads.Add(1)
	h.n.mu.Lock()
	wb := h.n.wb
	h.n.mu.Unlock()
	var n int
	err := s.bounded(func() error {
		if wb != nil {
			if err := wb.flush(); err != nil {
				return err
			}
		}
		var err error
		n, err = h.wf.ReadAt(dest, off)
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return err
	})
	if err != nil {
		return nil, s.errno(fmt.Errorf("read %s at %d: %w", h.wf.Name(), off, err))
	}
	s.stats.readBytes.Add(int64(n))
	return gofuse.ReadResultData(dest[:n]), 0
}

func (h *writeHandle) Write(_ context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	s := h.n.srv
	if !h.writable {
		return 0, syscall.EBADF
	}
	h.n.mu.Lock()
	wb := h.n.wb
	h.n.mu.Unlock()
	// The storage call may outlive a timeout, and go-fuse reuses data once
	// this returns: the call works on its own copy.
	buf := getReqBuf(len(data))
	copy(buf, data)
	err := s.bounded(func() error {
		defer putReqBuf(buf)
		if wb != nil {
			return wb.write(buf, off)
		}
		_, err := h.wf.WriteAt(buf, off)
		return err
	})
	s.stats.writes.Add(1)
	h.n.touch()
	if err != nil {
		return 0, s.errno(fmt.Errorf("write %s at %d: %w", h.wf.Name(), off, err))
	}
	s.stats.writeBytes.Add(int64(len(data)))
	return uint32(len(data)), 0
}

var reqBufs sync.Pool // of *[]byte

func getReqBuf(n int) []byte {
	if p, ok := reqBufs.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n, max(n, 128<<10))
}

func putReqBuf(b []byte) { reqBufs.Put(&b) }

// Flush runs on every close(2): what was written becomes visible to
// other clients before close returns (close-to-open).
func (h *writeHandle) Flush(context.Context) syscall.Errno {
	if !h.writable {
		return 0
	}
	return h.n.srv.errno(h.n.srv.bounded(func() error { return h.store(h.wf.Flush) }))
}

func (h *writeHandle) Fsync(context.Context, uint32) syscall.Errno {
	return h.n.srv.errno(h.n.srv.bounded(func() error { return h.store(h.wf.Sync) }))
}

// store stores the gathered writes, then runs publish (Flush or Sync).
func (h *writeHandle) store(publish func() error) error {
	h.n.mu.Lock()
	wb := h.n.wb
	h.n.mu.Unlock()
	if wb != nil {
		if err := wb.flush(); err != nil {
			return err
		}
	}
	return publish()
}

func (h *writeHandle) Release(context.Context) syscall.Errno {
	return h.n.releaseWrite()
}

// seqHandle writes a new file sequentially through fs.FS.Create, for
// backends without fs.RandomAccessFS. The file appears (or replaces the
// old one) atomically when the handle is flushed on close.
type seqHandle struct {
	n  *node
	mu sync.Mutex
	w  fs.Writer // guarded by mu; nil once published
	// written is the length so far; guarded by mu.
	written int64
	err     error // first failure, sticky; guarded by mu
}

func (n *node) startSeq(ctx context.Context, p string) (gofs.FileHandle, uint32, syscall.Errno) {
	n.stopStores(ctx)
	w, err := n.srv.backend.Create(ctx, p)
	if err != nil {
		return nil, 0, n.srv.errno(err)
	}
	h := &seqHandle{n: n, w: w}
	n.mu.Lock()
	if n.seq != nil || n.wf != nil {
		n.mu.Unlock()
		w.Close()
		return nil, 0, syscall.EBUSY
	}
	n.seq = h
	n.mtime = time.Now()
	n.mu.Unlock()
	return h, gofuse.FOPEN_DIRECT_IO, 0 // no page cache: writes arrive in order, reads are refused
}

func (h *seqHandle) size() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.written
}

func (h *seqHandle) truncate(size int64) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if size == h.written {
		return 0
	}
	return syscall.ENOTSUP // only appends without random-access support
}

func (h *seqHandle) Write(_ context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	s := h.n.srv
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.err != nil:
		return 0, s.errno(h.err)
	case h.w == nil:
		return 0, syscall.EIO // already published
	case off != h.written:
		return 0, s.errno(fmt.Errorf("%w: write at %d, file is at %d (this storage takes sequential writes of new files only)",
			errNotSupported, off, h.written))
	}
	var n int
	err := s.bounded(func() error {
		var err error
		n, err = h.w.Write(data)
		return err
	})
	h.written += int64(n)
	s.stats.writes.Add(1)
	s.stats.writeBytes.Add(int64(n))
	if err != nil {
		h.err = err
		return uint32(n), s.errno(err)
	}
	return uint32(n), 0
}

// Flush publishes the file (Commit). Later writes through this handle fail.
func (h *seqHandle) Flush(context.Context) syscall.Errno {
	return h.publish()
}

func (h *seqHandle) publish() syscall.Errno {
	s := h.n.srv
	h.mu.Lock()
	w := h.w
	h.w = nil
	err := h.err
	h.mu.Unlock()
	if w == nil {
		return s.errno(err)
	}
	if err == nil {
		err = s.bounded(w.Commit)
	} else {
		w.Close()
	}
	h.n.mu.Lock()
	if h.n.seq == h {
		h.n.seq = nil
	}
	wrote := h.n.mtime
	h.n.mtime = time.Time{}
	h.n.epoch++
	h.n.mu.Unlock()
	if err == nil {
		h.n.keepTimes(wrote, time.Time{})
	}
	h.n.closed()
	return s.errno(err)
}

func (h *seqHandle) Release(context.Context) syscall.Errno { return h.publish() }
