package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"

	"github.com/ffkit/ffkit/ffrecord"
)

// writer is an open ffrecord.Writer handle. Python batches samples into one
// ffw_write request; the mutex keeps two connections from interleaving.
type writer struct {
	mu   sync.Mutex // guards w and done
	w    *ffrecord.Writer
	done bool
}

// Close abandons a writer that was never closed by a request (the Python
// side went away): nothing is published.
func (w *writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.w.Abort()
		w.done = true
	}
	return nil
}

func ffwCreate(ctx context.Context, s *Server, q *ffwCreateRequest, in input) (reply, error) {
	closeFDs(in.fds)
	w, err := ffrecord.Create(ctx, q.Path, q.N)
	if err != nil {
		return reply{}, err
	}
	return reply{header: handleReply{okField: ok(), Handle: s.add(&writer{w: w})}}, nil
}

// ffwWrite appends samples: the body is count int64 lengths, then the
// samples' bytes end to end. A streamed body (longer than MaxChunk) is
// copied from the connection into the file sample by sample, so the engine
// holds one chunk of it at a time whatever the sample's size.
func ffwWrite(ctx context.Context, s *Server, q *ffwWriteRequest, in input) (reply, error) {
	closeFDs(in.fds)
	w, err := lookup[*writer](s, q.Handle)
	if err != nil {
		return reply{}, err
	}
	if in.stream != nil {
		return ffwWriteStream(ctx, w, q, in.stream)
	}
	body := in.body
	if q.Count < 0 || q.Count*8 > int64(len(body)) {
		return reply{}, fmt.Errorf("%w: ffw_write of %d samples with a %d-byte body", ErrProtocol, q.Count, len(body))
	}
	data := body[8*q.Count:]
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return reply{}, fmt.Errorf("%w: writer is closed", ErrBadRequest)
	}
	for i := int64(0); i < q.Count; i++ {
		l := int64(binary.LittleEndian.Uint64(body[8*i:]))
		if l < 0 || l > int64(len(data)) {
			return reply{}, fmt.Errorf("%w: ffw_write sample %d of %d bytes, %d left in the body", ErrProtocol, i, l, len(data))
		}
		if err := w.w.WriteOne(data[:l:l]); err != nil {
			return reply{}, err
		}
		data = data[l:]
	}
	return okReply(), nil
}

// ffwWriteStream is ffwWrite for a streamed body.
func ffwWriteStream(ctx context.Context, w *writer, q *ffwWriteRequest, r *chunkReader) (reply, error) {
	if q.Count < 0 || q.Count*8 > r.total {
		return reply{}, fmt.Errorf("%w: ffw_write of %d samples with a %d-byte body", ErrProtocol, q.Count, r.total)
	}
	lens := make([]byte, 8*q.Count)
	if _, err := io.ReadFull(r, lens); err != nil {
		return reply{}, fmt.Errorf("%w: ffw_write: %v", ErrProtocol, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return reply{}, fmt.Errorf("%w: writer is closed", ErrBadRequest)
	}
	for i := int64(0); i < q.Count; i++ {
		l := int64(binary.LittleEndian.Uint64(lens[8*i:]))
		if l < 0 || l > r.left {
			return reply{}, fmt.Errorf("%w: ffw_write sample %d of %d bytes, %d left in the body", ErrProtocol, i, l, r.left)
		}
		if err := ctx.Err(); err != nil {
			return reply{}, err
		}
		if err := w.w.WriteFrom(r, l); err != nil {
			return reply{}, err
		}
	}
	if r.left != 0 {
		return reply{}, fmt.Errorf("%w: ffw_write: %d bytes past the last sample", ErrProtocol, r.left)
	}
	return okReply(), nil
}

func ffwFinish(abort bool) func(ctx context.Context, s *Server, q *ffwFinishRequest, in input) (reply, error) {
	return func(ctx context.Context, s *Server, q *ffwFinishRequest, in input) (reply, error) {
		closeFDs(in.fds)
		w, err := lookup[*writer](s, q.Handle)
		if err != nil {
			return reply{}, err
		}
		s.mu.Lock()
		delete(s.handles, q.Handle)
		s.mu.Unlock()
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.done {
			return okReply(), nil
		}
		w.done = true
		if abort {
			w.w.Abort()
			return okReply(), nil
		}
		if err := w.w.Close(); err != nil {
			w.w.Abort()
			return reply{}, err
		}
		return okReply(), nil
	}
}
