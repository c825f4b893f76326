package fuse

import (
	"context"
	"strings"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
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
func (n *node) unlinkPipelined(name, p string) bool {
	if cn, ok := n.childNode(name); ok && cn.busy() {
		return false
	}
	return n.srv.unlinkAsync(p)
}
