package engine

import (
	"context"
	"encoding/json"

	"fmt"
	"unsafe"

	"github.com/ffkit/ffkit/ffrecord"
)

// reader is an open ffrecord.Reader handle.
type reader struct {
	r      *ffrecord.Reader
	paths  []string
	direct bool
}

func (r *reader) Close() error { return r.r.Close() }

type ffrOpenReq struct {
	Paths     []string `json:"paths"`
	CheckData bool     `json:"check_data"`
	Direct    bool     `json:"direct"`
}

func ffrOpen(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	var q ffrOpenReq
	if err := json.Unmarshal(hdr, &q); err != nil {
		return reply{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	r, err := ffrecord.Open(ctx, q.Paths, ffrecord.ReadOptions{Direct: q.Direct, NoVerify: !q.CheckData})
	if err != nil {
		return reply{}, err
	}
	h := s.add(&reader{r: r, paths: q.Paths, direct: q.Direct})
	return reply{header: map[string]any{"ok": true, "handle": h, "n": r.N(), "files": r.Files()}}, nil
}

// ffrRead reads the samples whose int64 indices make the body into a fresh
// shared-memory segment; the response body holds 2*len int64s: sample k
// spans [pos[2k], pos[2k+1]) of the segment.
func ffrRead(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	var q request
	if err := json.Unmarshal(hdr, &q); err != nil {
		return reply{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	rd, err := lookup[*reader](s, q.Handle)
	if err != nil {
		return reply{}, err
	}
	idx, err := int64s(body)
	if err != nil {
		return reply{}, err
	}
	size, err := rd.r.BatchSize(idx)
	if err != nil {
		return reply{}, err
	}
	seg, err := newSegment("ffkit-batch", size)
	if err != nil {
		return reply{}, err
	}
	defer seg.unmap()
	var offs []int64
	if size > 0 {
		samples, err := rd.r.ReadBatchInto(ctx, idx, seg.mem)
		if err != nil {
			seg.close()
			return reply{}, err
		}
		// The planner places samples in file order, not request order:
		// report where each one actually is (start, end pairs).
		offs = positions(seg.mem, samples)
	} else {
		offs = make([]int64, 2*len(idx))
	}
	rep := reply{header: map[string]any{"ok": true, "size": size}, body: putInt64s(offs)}
	if seg.fd >= 0 {
		rep.fds = []int{seg.fd}
	}
	return rep, nil
}

// validateChunk bounds the bytes one validation read holds in memory.
const validateChunk = 64 << 20

// ffrValidate reads every sample with checksums on and reports every bad
// one (up to limit), not only the first.
func ffrValidate(ctx context.Context, s *Server, hdr, body []byte, fds []int) (reply, error) {
	closeFDs(fds)
	var q struct {
		request
		Limit int `json:"limit"`
	}
	if err := json.Unmarshal(hdr, &q); err != nil {
		return reply{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	rd, err := lookup[*reader](s, q.Handle)
	if err != nil {
		return reply{}, err
	}
	r := rd.r
	if r.Options().NoVerify {
		// The handle skips checks; validation must not.
		r, err = ffrecord.Open(ctx, rd.paths, ffrecord.ReadOptions{Direct: rd.direct})
		if err != nil {
			return reply{}, err
		}
		defer r.Close()
	}
	var bad []map[string]any
	n := r.N()
	buf := make([]byte, 0)
	check := func(idx []int64) error {
		size, err := r.BatchSize(idx)
		if err != nil {
			return err
		}
		if int64(cap(buf)) < size {
			buf = make([]byte, size)
		}
		_, err = r.ReadBatchInto(ctx, idx, buf[:size])
		return err
	}
	for i := int64(0); i < n && len(bad) < q.Limit; {
		var idx []int64
		var size int64
		for ; i < n && (len(idx) == 0 || size < validateChunk); i++ {
			_, _, l, err := r.Locate(i)
			if err != nil {
				return reply{}, err
			}
			idx = append(idx, i)
			size += l
		}
		err := check(idx)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return reply{}, ctx.Err()
		}
		// Something in the chunk is bad: check sample by sample so that
		// every bad sample is named.
		for _, j := range idx {
			if err := check([]int64{j}); err != nil {
				if ctx.Err() != nil {
					return reply{}, ctx.Err()
				}
				bad = append(bad, map[string]any{"index": j, "error": err.Error(), "code": errorHeader(err)["code"]})
				if len(bad) >= q.Limit {
					break
				}
			}
		}
	}
	return reply{header: map[string]any{"ok": true, "n": n, "bad": bad}}, nil
}

func init() {
	ops["ffr_open"] = ffrOpen
	ops["ffr_read"] = ffrRead
	ops["ffr_validate"] = ffrValidate
	addCode(ffrecord.ErrChecksum, "checksum")
	addCode(ffrecord.ErrTruncated, "truncated")
	addCode(ffrecord.ErrCorrupt, "corrupt")
	addCode(ffrecord.ErrIndex, "index")
	addCode(ffrecord.ErrNoFiles, "no_files")
}

// positions returns the [start, end) byte positions of each sample, which
// must be subslices of buf, within buf.
func positions(buf []byte, samples [][]byte) []int64 {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	out := make([]int64, 2*len(samples))
	for k, b := range samples {
		if len(b) == 0 {
			continue
		}
		start := int64(uintptr(unsafe.Pointer(unsafe.SliceData(b))) - base)
		out[2*k], out[2*k+1] = start, start+int64(len(b))
	}
	return out
}
