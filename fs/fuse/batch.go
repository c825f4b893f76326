package fuse

import (
	"fmt"
	"sync"

	"github.com/ffkit/ffkit/fs"
)

// readReq is one read waiting for a dispatcher.
type readReq struct {
	f    fs.File
	buf  []byte
	off  int64
	done chan error // buffered (1): the dispatcher never blocks on it
}

var readReqPool = sync.Pool{New: func() any { return &readReq{done: make(chan error, 1)} }}

// readAt reads len(buf) bytes of f at off through the dispatchers, which
// gather concurrent reads into one fs.FS.ReadBatch call.
func (s *Server) readAt(f fs.File, buf []byte, off int64) error {
	r := readReqPool.Get().(*readReq)
	r.f, r.buf, r.off = f, buf, off
	select {
	case s.queue <- r:
	case <-s.ctx.Done():
		return errClosed
	}
	// The dispatcher's call runs under the operation deadline, so this
	// wait ends; on unmount its context is canceled and it ends at once.
	select {
	case err := <-r.done:
		r.f, r.buf = nil, nil
		readReqPool.Put(r)
		return err
	case <-s.ctx.Done():
		return errClosed // r is dropped, not pooled: a dispatcher may still answer it
	}
}

// dispatch takes the first queued read, then whatever else is queued up
// to MaxBatch without waiting, and reads them with one ReadBatch.
func (s *Server) dispatch() {
	defer s.wg.Done()
	batch := make([]*readReq, 0, s.opts.MaxBatch)
	reqs := make([]fs.ReadRequest, 0, s.opts.MaxBatch)
	for {
		batch = batch[:0]
		select {
		case r := <-s.queue:
			batch = append(batch, r)
		case <-s.ctx.Done():
			s.failQueued()
			return
		}
	drain:
		for len(batch) < s.opts.MaxBatch {
			select {
			case r := <-s.queue:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		reqs = reqs[:0]
		for _, r := range batch {
			reqs = append(reqs, fs.ReadRequest{File: r.f, Off: r.off, Buf: r.buf})
		}
		ctx, cancel := s.opContext()
		err := s.backend.ReadBatch(ctx, reqs)
		s.stats.batches.Add(1)
		s.stats.batchedReads.Add(int64(len(batch)))
		if err != nil && len(batch) > 1 {
			// Tell each read its own outcome: one bad range must not fail
			// the reads that merely shared its batch.
			for i, r := range batch {
				r.done <- s.backend.ReadBatch(ctx, reqs[i:i+1])
			}
		} else {
			for _, r := range batch {
				if err != nil {
					err = fmt.Errorf("read %s [%d, %d): %w", r.f.Name(), r.off, r.off+int64(len(r.buf)), err)
				}
				r.done <- err
			}
		}
		cancel()
		clear(reqs)
	}
}

// failQueued answers the reads still queued at unmount.
func (s *Server) failQueued() {
	for {
		select {
		case r := <-s.queue:
			r.done <- errClosed
		default:
			return
		}
	}
}
