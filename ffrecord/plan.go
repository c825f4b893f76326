package ffrecord

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
)

// A batch plan: the requested samples sorted by (file, offset), their
// places in the caller's buffer, and the merged reads that fetch them.
//
// Unique samples are laid out in buf in (file, offset) order, so a run of
// adjacent samples is one read straight into buf. Reads that span a gap
// (merged neighbours) or need O_DIRECT alignment land in a pooled scratch
// slab and are copied out. Duplicates get their own copy after the reads.
type plan struct {
	r       *Reader
	slots   []slot
	order   []int32 // slot indices sorted by (file, offset, request)
	reads   []planRead
	reqs    []fs.ReadRequest
	keys    []uint64 // sort keys: global index << keyShift | request
	scratch *[]byte
	need    int64
}

type slot struct {
	file  int32
	dup   int32 // index of the slot this one duplicates, or -1
	local int64
	off   int64
	len   int64
	pos   int64 // where the sample goes in buf
}

// planRead is one read: bytes [off, off+len) of a file, into buf at pos
// (direct) or into scratch at spos, covering slots order[first:last].
type planRead struct {
	file        int32
	off, len    int64
	first, last int32
	scratch     bool
	pos         int64 // buf position (not scratch) or scratch position
}

// Plans are pooled with their slices: a warm batch costs a few
// microseconds of system calls per sample, and allocating (and
// collecting) a plan's 40-50 KiB per batch of 256 was a visible part of
// the rest. Plans of more than poolMaxSlots samples are not kept.
var planPool = sync.Pool{New: func() any { return new(plan) }}

const poolMaxSlots = 1 << 16

// noKeySortForTesting makes plans sort with the comparison function, the
// path of datasets too large for (index, request) to fit one integer.
var noKeySortForTesting bool

// grow returns s with length n, reusing its array when it is large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (r *Reader) plan(indices []int64, bufLen int64) (*plan, error) {
	p := planPool.Get().(*plan)
	p.r, p.need = r, 0
	p.slots = grow(p.slots, len(indices))
	p.order = grow(p.order, len(indices))
	p.reads = p.reads[:0]
	// Sorting by (file, offset, request) is sorting by (global index,
	// request), since files are concatenated in order and offsets grow
	// with the local index: one integer per sample when both fit in 64
	// bits, which sorts several times faster than a comparison function.
	shift := uint(bits.Len(uint(len(indices))))
	useKeys := len(indices) > 1 && bits.Len64(uint64(r.n))+int(shift) <= 64 && !noKeySortForTesting
	if useKeys {
		p.keys = grow(p.keys, len(indices))
	}
	sorted := true
	var prev int64 = -1
	for k, i := range indices {
		fi, l, err := r.fileOf(i)
		if err != nil {
			p.release()
			return nil, err
		}
		h := r.files[fi].h
		if h.broken != nil && l >= h.damaged {
			// A damaged file's missing sample: refused without a read.
			e := h.sampleErr(l, fmt.Errorf("%w: the file is damaged (%s)", errOf(h.broken),
				strings.TrimPrefix(h.broken.Error(), h.path+": ")))
			e.Index = i
			p.release()
			return nil, e
		}
		off := h.offsets[l]
		p.slots[k] = slot{file: int32(fi), dup: -1, local: l, off: off, len: h.end(l) - off}
		p.need += p.slots[k].len
		p.order[k] = int32(k)
		if useKeys {
			p.keys[k] = uint64(i)<<shift | uint64(k)
		}
		if i <= prev {
			sorted = false
		}
		prev = i
	}
	if bufLen < p.need {
		need := p.need
		p.release()
		return nil, fmt.Errorf("%w: buffer of %d bytes, the batch needs %d", ErrIndex, bufLen, need)
	}
	switch {
	case sorted:
	case useKeys:
		slices.Sort(p.keys)
		mask := uint64(1)<<shift - 1
		for k, key := range p.keys {
			p.order[k] = int32(key & mask)
		}
	default:
		slices.SortFunc(p.order, func(a, b int32) int {
			sa, sb := &p.slots[a], &p.slots[b]
			switch {
			case sa.file != sb.file:
				return int(sa.file - sb.file)
			case sa.local != sb.local:
				if sa.local < sb.local {
					return -1
				}
				return 1
			}
			return int(a - b)
		})
	}
	// Places in buf: unique samples in sorted order, duplicates after.
	var pos int64
	dups := false
	for k, si := range p.order {
		s := &p.slots[si]
		if k > 0 {
			prev := &p.slots[p.order[k-1]]
			if prev.file == s.file && prev.local == s.local {
				s.dup = p.order[k-1]
				if prev.dup >= 0 {
					s.dup = prev.dup
				}
				dups = true
				continue
			}
		}
		s.pos = pos
		pos += s.len
	}
	if dups {
		for i := range p.slots {
			if s := &p.slots[i]; s.dup >= 0 {
				s.pos = pos
				pos += s.len
			}
		}
	}
	p.merge()
	return p, nil
}

// merge groups the sorted unique samples into reads.
func (p *plan) merge() {
	r := p.r
	gap := r.opts.MergeGap
	direct := r.opts.Direct
	var cur *planRead
	var curBufEnd int64 // buf position right after cur's last sample
	for k, si := range p.order {
		s := &p.slots[si]
		if s.dup >= 0 || s.len == 0 {
			continue
		}
		start, end := s.off, s.off+s.len
		if direct {
			start = start &^ (directAlign - 1)
			end = min((end+directAlign-1)&^(directAlign-1), r.files[s.file].h.size)
		}
		// With O_DIRECT a read can land straight in buf only when the
		// sample's bytes are exactly the aligned range (and buf is aligned
		// there, checked in run); otherwise it goes through scratch.
		padded := direct && (start != s.off || end != s.off+s.len || (end-start)%directAlign != 0)
		if cur != nil && cur.file == s.file && gap >= 0 &&
			start-(cur.off+cur.len) <= gap && max(end, cur.off+cur.len)-cur.off <= maxMergeSpan {
			contiguous := start == cur.off+cur.len && s.pos == curBufEnd
			if !contiguous || padded {
				cur.scratch = true
			}
			cur.len = max(end, cur.off+cur.len) - cur.off
			cur.last = int32(k + 1)
			curBufEnd = s.pos + s.len
			continue
		}
		p.reads = append(p.reads, planRead{file: s.file, off: start, len: end - start,
			first: int32(k), last: int32(k + 1), scratch: padded, pos: s.pos})
		cur = &p.reads[len(p.reads)-1]
		curBufEnd = s.pos + s.len
	}
}

// layoutScratch places the reads that cannot land in buf in a scratch
// slab: those merge planned so, and with O_DIRECT those whose place in buf
// is not aligned.
func (p *plan) layoutScratch(buf []byte) {
	var scratchLen int64
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	for i := range p.reads {
		rd := &p.reads[i]
		if !rd.scratch && p.r.opts.Direct && (base+uintptr(rd.pos))%directAlign != 0 {
			rd.scratch = true
		}
		if rd.scratch {
			rd.pos = scratchLen
			scratchLen += (rd.len + directAlign - 1) &^ (directAlign - 1) // keep every read aligned
		}
	}
	if scratchLen > 0 {
		p.scratch = getScratch(scratchLen)
	}
}

// release returns the plan's scratch slab and the plan to their pools.
// The plan must not be used afterwards.
func (p *plan) release() {
	if p.scratch != nil {
		putScratch(p.scratch)
		p.scratch = nil
	}
	clear(p.reqs) // drop the references to the caller's buffer and files
	p.reqs = p.reqs[:0]
	p.r = nil
	if cap(p.slots) <= poolMaxSlots && cap(p.reads) <= poolMaxSlots {
		planPool.Put(p)
	}
}

func (p *plan) run(ctx context.Context, buf []byte) ([][]byte, error) {
	r := p.r
	p.layoutScratch(buf)
	p.reqs = grow(p.reqs, len(p.reads))
	for i, rd := range p.reads {
		var dst []byte
		if rd.scratch {
			dst = (*p.scratch)[rd.pos : rd.pos+rd.len]
		} else {
			dst = buf[rd.pos : rd.pos+rd.len]
		}
		p.reqs[i] = fs.ReadRequest{File: r.files[rd.file].f, Off: rd.off, Buf: dst}
	}
	if err := p.issue(ctx, p.reqs); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, p.explain(ctx, err)
	}
	// Scatter merged and aligned reads into place.
	for _, rd := range p.reads {
		if !rd.scratch {
			continue
		}
		src := (*p.scratch)[rd.pos : rd.pos+rd.len]
		for _, si := range p.order[rd.first:rd.last] {
			s := &p.slots[si]
			if s.dup >= 0 {
				continue
			}
			copy(buf[s.pos:s.pos+s.len], src[s.off-rd.off:])
		}
	}
	if !r.opts.NoVerify {
		if err := p.verify(buf); err != nil {
			return nil, err
		}
	}
	out := make([][]byte, len(p.slots))
	for i := range p.slots {
		s := &p.slots[i]
		if s.dup >= 0 {
			o := &p.slots[s.dup]
			copy(buf[s.pos:s.pos+s.len], buf[o.pos:o.pos+o.len])
		}
		out[i] = buf[s.pos : s.pos+s.len : s.pos+s.len]
	}
	return out, nil
}

// verifyParallelBytes: batches larger than this check their CRCs on
// several goroutines.
const verifyParallelBytes = 8 << 20

func (p *plan) verify(buf []byte) error {
	if p.need < verifyParallelBytes {
		for _, si := range p.order {
			if err := p.check(buf, si); err != nil {
				return err
			}
		}
		return nil
	}
	var g errgroup.Group
	g.SetLimit(4)
	const chunk = 64
	for i := 0; i < len(p.order); i += chunk {
		part := p.order[i:min(i+chunk, len(p.order))]
		g.Go(func() error {
			for _, si := range part {
				if err := p.check(buf, si); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// check verifies the CRC of slot si's sample in buf (a method, not a
// closure, so that a small batch's serial check allocates nothing).
func (p *plan) check(buf []byte, si int32) error {
	s := &p.slots[si]
	if s.dup >= 0 {
		return nil
	}
	h := p.r.files[s.file].h
	want := h.crcs[s.local]
	if got := crc32.Update(0, crcTable, buf[s.pos:s.pos+s.len]); got != want {
		return p.sampleErr(si, fmt.Errorf("%w: stored %08x, computed %08x%s", ErrChecksum, want, got, lastHint(h, s.local)))
	}
	return nil
}

func lastHint(h *header, local int64) string {
	if local == h.n-1 {
		return " (the file's last sample: a file cut inside it shows this way too)"
	}
	return ""
}

func (p *plan) sampleErr(si int32, err error) *SampleError {
	s := &p.slots[si]
	f := p.r.files[s.file]
	return &SampleError{Path: f.h.path, Index: p.r.firsts[s.file] + s.local, Local: s.local, Off: s.off, Len: s.len, Err: err}
}

// batchReaderN is an optional fs.FS capability: a batched read with the
// caller's parallelism (localfs implements it).
type batchReaderN interface {
	ReadBatchN(ctx context.Context, reqs []fs.ReadRequest, parallelism int) error
}

// batchReaderBudget is an optional fs.FS capability: a batched read whose
// reads hold tokens of a budget shared with other batches (localfs).
type batchReaderBudget interface {
	ReadBatchBudget(ctx context.Context, reqs []fs.ReadRequest, parallelism int, budget *fs.Budget) error
}

// issue runs the reads, grouped per file system.
func (p *plan) issue(ctx context.Context, reqs []fs.ReadRequest) error {
	if len(reqs) == 0 {
		return nil
	}
	r := p.r
	fsys := r.files[p.reads[0].file].fsys
	same := true
	for _, rd := range p.reads {
		if r.files[rd.file].fsys != fsys {
			same = false
			break
		}
	}
	if same && fsys != nil {
		return readBatch(ctx, fsys, reqs, r.opts.Parallelism, r.budget)
	}
	// Mixed file systems, or files without one: group and run each.
	groups := map[fs.FS][]fs.ReadRequest{}
	var plain []fs.ReadRequest
	for i, rd := range p.reads {
		if f := r.files[rd.file].fsys; f != nil {
			groups[f] = append(groups[f], reqs[i])
		} else {
			plain = append(plain, reqs[i])
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	for f, rs := range groups {
		g.Go(func() error { return readBatch(gctx, f, rs, r.opts.Parallelism, r.budget) })
	}
	if len(plain) > 0 {
		g.Go(func() error {
			pg, pctx := errgroup.WithContext(gctx)
			pg.SetLimit(r.opts.Parallelism)
			for _, rq := range plain {
				if pctx.Err() != nil {
					break
				}
				pg.Go(func() error {
					if _, err := r.budget.Take(pctx, 1); err != nil {
						return err
					}
					defer r.budget.Give(1)
					return readFull(rq.File, rq.Buf, rq.Off)
				})
			}
			return pg.Wait()
		})
	}
	return g.Wait()
}

func readBatch(ctx context.Context, fsys fs.FS, reqs []fs.ReadRequest, par int, budget *fs.Budget) error {
	if b, ok := fsys.(batchReaderBudget); ok && budget != nil {
		return b.ReadBatchBudget(ctx, reqs, par, budget)
	}
	if b, ok := fsys.(batchReaderN); ok {
		return b.ReadBatchN(ctx, reqs, par)
	}
	return fsys.ReadBatch(ctx, reqs)
}

// explain turns a failed batch into a precise error: it re-reads the
// planned reads one by one to find the first failing sample.
func (p *plan) explain(ctx context.Context, batchErr error) error {
	for i, rd := range p.reads {
		rq := p.reqs[i]
		err := readFull(rq.File, rq.Buf, rq.Off)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		si := p.order[rd.first]
		// A merged read covers several samples: name the first one that
		// cannot be read on its own.
		for _, sj := range p.order[rd.first:rd.last] {
			s := &p.slots[sj]
			if s.dup >= 0 || s.len == 0 {
				continue
			}
			one := make([]byte, s.len)
			if e := readFull(rq.File, one, s.off); e != nil {
				si, err = sj, e
				break
			}
		}
		if errors.Is(err, ErrTruncated) || errors.Is(err, fs.ErrShortRead) {
			return p.sampleErr(si, fmt.Errorf("%w: the file shrank after it was opened: %w", ErrTruncated, err))
		}
		return p.sampleErr(si, fmt.Errorf("read: %w", err))
	}
	return fmt.Errorf("ffrecord: batch read: %w", batchErr)
}

// Scratch slabs, pooled and aligned for O_DIRECT.
var scratchPool sync.Pool // of *[]byte

func getScratch(n int64) *[]byte {
	if b, ok := scratchPool.Get().(*[]byte); ok {
		if int64(cap(*b)) >= n {
			*b = (*b)[:n]
			return b
		}
	}
	size := int64(256 << 10)
	for size < n {
		size <<= 1
	}
	b := alignedBuffer(size)[:n]
	return &b
}

func putScratch(b *[]byte) { scratchPool.Put(b) }

// alignedBuffer returns n bytes starting on a directAlign boundary.
func alignedBuffer(n int64) []byte {
	b := make([]byte, n+directAlign)
	o := int64(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % directAlign)
	if o != 0 {
		o = directAlign - o
	}
	return b[o : o+n : o+n]
}

// errOf is the sentinel a damaged file's error matches (ErrTruncated,
// ErrChecksum or ErrCorrupt), so that a refused sample keeps its kind.
func errOf(err error) error {
	for _, s := range []error{ErrTruncated, ErrChecksum, ErrCorrupt} {
		if errors.Is(err, s) {
			return s
		}
	}
	return ErrCorrupt
}
