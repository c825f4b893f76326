package fuse

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/ffkit/ffkit/fs"
)

// Pipelined unlinks. With the metadata cache on (Options.AttrTimeout > 0)
// an unlink of a file that this mount does not hold open returns as soon
// as the file is known to exist: the removal is sent to the storage in the
// background, up to maxPendingUnlinks at once (the metadata service then
// commits many of them together instead of one durable commit per call).
//
// This mount sees the file gone at once (the cache says so), and every
// operation whose answer depends on the removal having reached the
// storage waits for it first: a lookup, create or mkdir of the same path,
// a listing or rmdir read from the storage, any rename, fsync of a
// directory, and unmount. Other clients see the file gone once the
// removal lands, which is within the same AttrTimeout bound as any change
// unless the storage is slower than that. A removal that fails in the
// background is logged (the file then shows again here).
const maxPendingUnlinks = 64

type pendingOps struct {
	sem chan struct{} // one token per removal in flight

	mu    sync.Mutex
	paths map[string]chan struct{} // guarded by mu; closed when that path's removal ended
}

func newPendingOps() *pendingOps {
	return &pendingOps{sem: make(chan struct{}, maxPendingUnlinks), paths: map[string]chan struct{}{}}
}

// start registers a removal of path and returns the function that ends it;
// it blocks while maxPendingUnlinks are in flight.
func (p *pendingOps) start(ctx context.Context, path string) (done func(), ok bool) {
	p.wait(ctx, path)
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, false
	}
	ch := make(chan struct{})
	p.mu.Lock()
	p.paths[path] = ch
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		if p.paths[path] == ch {
			delete(p.paths, path)
		}
		p.mu.Unlock()
		close(ch)
		<-p.sem
	}, true
}

// wait returns when no removal of path is in flight (or ctx ends).
func (p *pendingOps) wait(ctx context.Context, path string) {
	p.mu.Lock()
	ch := p.paths[path]
	p.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// waitUnder returns when no removal of dir or of a path under it is in
// flight (or ctx ends). dir "" means every path.
func (p *pendingOps) waitUnder(ctx context.Context, dir string) {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	for {
		var ch chan struct{}
		p.mu.Lock()
		for k, c := range p.paths {
			if k == dir || strings.HasPrefix(k, prefix) || dir == "" {
				ch = c
				break
			}
		}
		p.mu.Unlock()
		if ch == nil {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// unlinkAsync removes the file p in the background (see pendingOps); it
// returns false when the unlink must be done in the caller instead.
func (s *Server) unlinkAsync(p string) bool {
	if !s.mc.enabled() || s.ctx.Err() != nil {
		return false
	}
	done, ok := s.pend.start(s.ctx, p)
	if !ok {
		return false
	}
	s.mc.removed(p, false)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.opts.Timeout)
		defer cancel()
		if err := s.backend.Remove(ctx, p); err != nil {
			s.mc.changed(p)
			s.stats.errors.Add(1)
			s.opts.Logger.Printf("unlink %s (in the background, after the caller was answered): %v", p, err)
		}
	}()
	return true
}

// Fsyncdir returns once every unlink in the directory has reached the
// storage.
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	octx, cancel := d.n.srv.opContext()
	defer cancel()
	d.n.srv.pend.waitUnder(octx, d.path)
	return 0
}

var _ gofs.FileFsyncdirer = (*dirHandle)(nil)

// unlinkPipelined starts the removal of the child name (at p) in the
// background unless this mount has it open (then the caller removes it,
// so that the node keeps reporting what it had).
//
// A file this mount wrote and closed is not held open: only the times it
// keeps (node.report) made it busy, and nobody asks for them once it is
// gone (before, every file created through the mount was unlinked
// synchronously for them).
func (n *node) unlinkPipelined(name, p string) bool {
	if cn, ok := n.childNode(name); ok && cn.busyFor(n.srv.mc) {
		return false
	}
	return n.srv.unlinkAsync(p)
}

// Pipelined creates. With the metadata cache on, open(O_CREAT) of a name
// that the cache knows does not exist (a fresh negative entry or listing)
// returns at once: the file is created in the storage in the background
// (counted with the unlinks in maxPendingUnlinks), and the handle's first
// write, read, truncate, fsync or its close waits for it. A close of a
// file nothing was written to does not wait (close-to-open then holds
// within the cache bound, as for any change). Every operation of this
// mount on the node's path waits for the create to land first (node.path),
// and name lookups, listings, renames and fsync of the directory wait as
// for an unlink, so this mount never sees the storage without the file.
//
// The file is durable once fsync of the file or of its directory returns
// (as on a local file system); a metadata server that restarts meanwhile
// is retried with the same request id. A create that fails in the
// background (the storage is full) is logged and fails the handle's later
// calls. Only a plain O_CREAT is pipelined (see createAsync), so O_EXCL
// holds between mounts.

// asyncWrite is the write file of a file being created in the background.
// Over a storage that creates files without opening them
// (fs.EmptyCreator) the write file is opened only when first needed, so
// a file closed unwritten costs one metadata transaction.
type asyncWrite struct {
	name  string
	n     *node
	ready chan struct{} // closed when the create ended (err set)
	err   error         // the create's
	// created: the file's modification time in the storage as the create
	// returned it (fs.EmptyCreatorInfo; zero: not known), set before ready.
	created time.Time

	mu sync.Mutex
	wf fs.WriteFile // guarded by mu; nil until opened
}

var _ fs.WriteFile = (*asyncWrite)(nil)

// file returns the write file, opening it once the create has landed.
func (a *asyncWrite) file() (fs.WriteFile, error) {
	<-a.ready
	if a.err != nil {
		return nil, a.err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.wf != nil {
		return a.wf, nil
	}
	s := a.n.srv
	p, errno := a.n.path()
	if errno != 0 {
		return nil, fmt.Errorf("open %s for writing: %w", a.name, errno)
	}
	ctx, cancel := s.opContext()
	defer cancel()
	wf, err := s.rw.OpenWrite(ctx, p, 0)
	if err != nil {
		return nil, err
	}
	a.wf = wf
	return wf, nil
}

// createdTime is the storage's modification time of a file created and
// never opened for writing (zero: unknown or since written), which a
// release needs no Stat to learn.
func (a *asyncWrite) createdTime() time.Time {
	<-a.ready
	if a.err != nil || a.opened() != nil {
		return time.Time{}
	}
	return a.created
}

// opened is the write file if it is open.
func (a *asyncWrite) opened() fs.WriteFile {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.wf
}

func (a *asyncWrite) Name() string { return a.name }

// Size is 0 until the write file is opened (every write opens it).
func (a *asyncWrite) Size() int64 {
	if wf := a.opened(); wf != nil {
		return wf.Size()
	}
	return 0
}

func (a *asyncWrite) ReadAt(p []byte, off int64) (int, error) {
	wf, err := a.file()
	if err != nil {
		return 0, err
	}
	return wf.ReadAt(p, off)
}

func (a *asyncWrite) WriteAt(p []byte, off int64) (int, error) {
	wf, err := a.file()
	if err != nil {
		return 0, err
	}
	return wf.WriteAt(p, off)
}

func (a *asyncWrite) Truncate(size int64) error {
	wf, err := a.file()
	if err != nil {
		return err
	}
	return wf.Truncate(size)
}

// Flush of a file not written has nothing to publish.
func (a *asyncWrite) Flush() error {
	if wf := a.opened(); wf != nil {
		return wf.Flush()
	}
	return nil
}

// Sync makes the file durable: its create has landed.
func (a *asyncWrite) Sync() error {
	<-a.ready
	if a.err != nil {
		return a.err
	}
	if wf := a.opened(); wf != nil {
		return wf.Sync()
	}
	return nil
}

func (a *asyncWrite) Close() error {
	<-a.ready
	if a.err != nil {
		return a.err
	}
	if wf := a.opened(); wf != nil {
		return wf.Close()
	}
	return nil
}

// createAsync opens the new file p for the node cn in the background (see
// asyncWrite) when the cache knows p does not exist; ok is false when the
// caller must create it itself. ctx carries the new file's owner. Only a
// plain O_CREAT is pipelined: O_EXCL must be exclusive across mounts
// (another mount may have made the name since the cache learned it was
// missing), and O_TRUNC must truncate what another mount made.
func (s *Server) createAsync(ctx context.Context, cn *node, p string, oflag int) (wf fs.WriteFile, ok bool) {
	if !s.mc.enabled() || s.rw == nil || s.ctx.Err() != nil || oflag&(fs.OTrunc|fs.OExcl) != 0 {
		return nil, false
	}
	if _, exists, known := s.mc.lookup(p); !known || exists {
		return nil, false
	}
	done, ok := s.pend.start(ctx, p)
	if !ok {
		return nil, false
	}
	ec, _ := s.backend.(fs.EmptyCreator)
	a := &asyncWrite{name: p, n: cn, ready: make(chan struct{})}
	landing := make(chan struct{})
	cn.mu.Lock()
	if cn.wf != nil || cn.seq != nil || cn.closing != nil || cn.landing != nil {
		cn.mu.Unlock()
		done()
		return nil, false
	}
	// As acquireWrite does for the first write handle of a new file.
	cn.wf, cn.wfRefs, cn.landing = a, 1, landing
	if s.opts.WriteBuffer > 0 {
		cn.wb = newWriteBuffer(a, s.opts.WriteBuffer, s.opts.WriteBehind)
	}
	cn.mtime = time.Now()
	cn.mu.Unlock()
	bg, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.opts.Timeout)
	if o, has := fs.OwnerFrom(ctx); has {
		bg = fs.WithOwner(bg, o)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer done()
		defer cancel()
		if eci, ok := s.backend.(fs.EmptyCreatorInfo); ok {
			var fi fs.FileInfo
			fi, a.err = eci.CreateEmptyInfo(bg, p, oflag&fs.OExcl != 0)
			a.created = fi.ModTime
		} else if ec != nil {
			a.err = ec.CreateEmpty(bg, p, oflag&fs.OExcl != 0)
		} else {
			wf, err := s.rw.OpenWrite(bg, p, oflag)
			a.mu.Lock()
			a.wf, a.err = wf, err
			a.mu.Unlock()
		}
		if a.err != nil {
			s.mc.changed(p)
			s.stats.errors.Add(1)
			s.opts.Logger.Printf("create %s (in the background, after the caller was answered): %v", p, a.err)
		}
		close(a.ready)
		cn.mu.Lock()
		if cn.landing == landing {
			cn.landing = nil
		}
		cn.mu.Unlock()
		close(landing)
	}()
	s.stats.createsAsync.Add(1)
	return a, true
}

// waitLanded waits until a create of the node started in the background
// has reached the storage (or failed).
func (n *node) waitLanded() {
	n.mu.Lock()
	ch := n.landing
	n.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-n.srv.ctx.Done():
	}
}

// keepOpenForUnlink opens the write file of a file created in the
// background and not written yet, before its name is removed: a file
// unlinked while open stays writable through its write session.
func (n *node) keepOpenForUnlink() {
	n.mu.Lock()
	a, ok := n.wf.(*asyncWrite)
	n.mu.Unlock()
	if ok {
		a.file() // an error shows on the handle's next call
	}
}
