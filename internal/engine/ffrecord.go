package engine

import (
	"context"
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

func ffrOpen(ctx context.Context, s *Server, q *ffrOpenRequest, in input) (reply, error) {
	closeFDs(in.fds)
	r, err := ffrecord.Open(ctx, q.Paths, ffrecord.ReadOptions{Direct: q.Direct, NoVerify: !q.CheckData})
	if err != nil {
		return reply{}, err
	}
	h := s.add(&reader{r: r, paths: q.Paths, direct: q.Direct})
	return reply{header: ffrOpenReply{okField: ok(), Handle: h, N: r.N(), Files: r.Files()}}, nil
}

// ffrRead reads the samples whose int64 indices make the body into a fresh
// shared-memory segment; the response body holds 2*len int64s: sample k
// spans [pos[2k], pos[2k+1]) of the segment.
func ffrRead(ctx context.Context, s *Server, q *ffrReadRequest, in input) (reply, error) {
	closeFDs(in.fds)
	rd, err := lookup[*reader](s, q.Handle)
	if err != nil {
		return reply{}, err
	}
	idx, err := int64s(in.body)
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
	rep := reply{header: ffrReadReply{okField: ok(), Size: size}, body: putInt64s(offs)}
	if seg.fd >= 0 {
		rep.fds = []int{seg.fd}
	}
	return rep, nil
}

// validateChunk bounds the bytes one validation read holds in memory.
const validateChunk = 64 << 20

// ffrValidate reads every sample with checksums on and reports every bad
// one (up to limit), not only the first.
func ffrValidate(ctx context.Context, s *Server, q *ffrValidateRequest, in input) (reply, error) {
	closeFDs(in.fds)
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
	bad := []badSample{}
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
				bad = append(bad, badSample{Index: j, Error: err.Error(), Code: errorHeader(err).Code})
				if len(bad) >= q.Limit {
					break
				}
			}
		}
	}
	return reply{header: ffrValidateReply{okField: ok(), N: n, Bad: bad}}, nil
}

func init() {
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
