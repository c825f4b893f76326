package engine

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
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

func ffwCreate(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	var q struct {
		Path string `json:"path"`
		N    int64  `json:"n"`
	}
	if err := json.Unmarshal(hdr, &q); err != nil {
		return reply{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	w, err := ffrecord.Create(ctx, q.Path, q.N)
	if err != nil {
		return reply{}, err
	}
	return reply{header: map[string]any{"ok": true, "handle": s.add(&writer{w: w})}}, nil
}

// ffwWrite appends samples: the body is count int64 lengths, then the
// samples' bytes end to end.
func ffwWrite(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	var q struct {
		request
		Count int64 `json:"count"`
	}
	if err := json.Unmarshal(hdr, &q); err != nil {
		return reply{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	w, err := lookup[*writer](s, q.Handle)
	if err != nil {
		return reply{}, err
	}
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

func ffwFinish(abort bool) opFunc {
	return func(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
		closeFDs(fds)
		var q request
		if err := json.Unmarshal(hdr, &q); err != nil {
			return reply{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
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

func init() {
	ops["ffw_create"] = ffwCreate
	ops["ffw_write"] = ffwWrite
	ops["ffw_close"] = ffwFinish(false)
	ops["ffw_abort"] = ffwFinish(true)
}
