package pack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/klauspost/compress/snappy"
	"github.com/parquet-go/parquet-go/encoding/rle"
	"github.com/parquet-go/parquet-go/format"

	"github.com/ffkit/ffkit/fs"
)

// A Parquet sample column as pyarrow writes it by default (snappy pages,
// a dictionary page holding the values and pages of indices into it, or
// PLAIN pages once the dictionary grew too large) is listed too, from
// its page headers and the snappy streams' tags, without decompressing
// anything but the small index pages:
//
//   - A snappy block is a run of elements, each either a literal (bytes
//     copied from the block as they are) or a copy of earlier output. One
//     pass over the tags gives every element's place in the decompressed
//     page; a value's 4-byte length is read from the literal bytes that
//     hold it (through the copies that point at them), so each value's
//     place in the decompressed page is known up front.
//   - A value that lies wholly in literals (the usual case for values that
//     do not compress: images, audio, already-compressed bytes) is listed
//     as the extents of the file that hold its bytes, and Pack reads it
//     straight into its place in the output, as it does an uncompressed
//     value.
//   - Any other value (it holds a copy) is decompressed alone by the worker
//     that reads it: one read of the compressed bytes of its elements, the
//     literals copied into place, the copies made from the bytes before
//     them (through the file for bytes before the value). The elements of
//     such pages are kept (at most maxKeptElems in all); a page past that,
//     or a value whose copies are too tangled to follow, is cut from its
//     page decompressed whole: once, when the first of its values is read
//     (the next such page meanwhile), dropped when its last value is read.
//
// Compared with the walk (Parquet's column reader, a copy of each row
// group's values, the sharded writer's in-memory shard), each value is
// copied once or twice fewer, by Pack's workers in parallel, and the
// shards are planned up front. Anything else (another codec, a NULL, a
// malformed page or stream) leaves the column to the walk, which reports
// malformed input precisely; both give the same samples.

// pageMax is the largest page decompressed whole by the paged listing
// (its values are held in memory while they are read); a variable for
// tests.
var pageMax int64 = 256 << 20

// snappyDirect lets values that lie wholly in a snappy block's literals be
// read from the file; false (tests) reads every value from its
// decompressed page.
var snappyDirect = true

// pagesDecoded counts the pages decompressed whole, for tests.
var pagesDecoded atomic.Int64

// pqUnit is a page whose values some samples are cut from: its bytes in
// the file, decompressed on first use.
type pqUnit struct {
	off, csize int64 // the snappy block in the file
	usize      int64 // decompressed
	// The block's elements, to decompress one value's bytes (assemble);
	// nil: decompress the whole page.
	elems      []snElem
	refs       atomic.Int64
	once       sync.Once
	prefetched atomic.Bool
	buf        []byte
	err        error
}

// pagedListed is a listed Parquet column some of whose samples are cut
// from decompressed pages.
type pagedListed struct {
	*listed
	units []*pqUnit
	cut   []pqCut // per sample; unit -1: read from ext of listed
	wg    sync.WaitGroup
	free  chan []byte // decompressed page buffers for reuse
	// compressed page buffers for reuse
	freeSrc chan []byte
}

// pqCut is a sample's place in a decompressed page.
type pqCut struct {
	unit int32
	off  int64
}

var _ Listed = (*pagedListed)(nil)

func (p *pagedListed) ReaderAt(i int) io.ReaderAt {
	c := p.cut[i]
	if c.unit < 0 {
		return p.listed.ReaderAt(i)
	}
	return &cutReader{p: p, c: c, size: p.samples[i].Size}
}

func (p *pagedListed) Done(i int) {
	c := p.cut[i]
	if c.unit < 0 {
		return
	}
	u := p.units[c.unit]
	if u.refs.Add(-1) == 0 {
		b := u.buf
		u.buf = nil
		if b != nil {
			select {
			case p.free <- b[:0]:
			default:
			}
		}
	}
}

func (p *pagedListed) Walk(ctx context.Context, fn func(Sample, io.Reader) error) error {
	for i, s := range p.samples {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := fn(s, io.NewSectionReader(p.ReaderAt(i), 0, s.Size))
		p.Done(i)
		if err != nil {
			return err
		}
	}
	return nil
}

func (p *pagedListed) Close() error {
	p.wg.Wait() // a page being decompressed ahead
	for _, u := range p.units {
		u.buf = nil
	}
	return p.listed.Close()
}

// page returns unit k decompressed, decompressing it now if it is not,
// and starts on the next unit that has values to read.
func (p *pagedListed) page(k int) ([]byte, error) {
	u := p.units[k]
	u.once.Do(func() { p.decode(u) })
	for j := k + 1; j < len(p.units); j++ {
		n := p.units[j]
		if n.refs.Load() == 0 {
			continue
		}
		if n.prefetched.CompareAndSwap(false, true) {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				n.once.Do(func() { p.decode(n) })
			}()
		}
		break
	}
	return u.buf, u.err
}

func (p *pagedListed) decode(u *pqUnit) {
	if err := p.done.Err(); err != nil {
		u.err = err
		return
	}
	f, err := p.file(0)
	if err != nil {
		u.err = err
		return
	}
	var src []byte
	select {
	case src = <-p.freeSrc:
	default:
	}
	if int64(cap(src)) < u.csize {
		src = make([]byte, u.csize)
	}
	src = src[:u.csize]
	defer func() {
		select {
		case p.freeSrc <- src:
		default:
		}
	}()
	if n, err := f.ReadAt(src, u.off); int64(n) < u.csize {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("%w: %s changed while packing: a page at byte %d is cut short", ErrData, p.names[0], u.off)
		}
		u.err = err
		return
	}
	var dst []byte
	select {
	case dst = <-p.free:
	default:
	}
	if int64(cap(dst)) < u.usize {
		dst = make([]byte, u.usize)
	}
	out, err := snappy.Decode(dst[:u.usize], src)
	if err != nil || int64(len(out)) != u.usize {
		u.err = fmt.Errorf("%w: %s: the snappy page at byte %d does not decompress (%v)", ErrData, p.names[0], u.off, err)
		return
	}
	pagesDecoded.Add(1)
	u.buf = out
}

// cutReader reads a sample from its decompressed page.
type cutReader struct {
	p    *pagedListed
	c    pqCut
	size int64
}

func (r *cutReader) ReadAt(b []byte, off int64) (int, error) {
	if off >= r.size {
		return 0, io.EOF
	}
	u := r.p.units[r.c.unit]
	if k := min(int64(len(b)), r.size-off); u.elems != nil && k > 0 && assembleValues {
		ok, err := r.p.assemble(u, b[:k], r.c.off+off)
		if err != nil {
			return 0, err
		}
		if ok {
			if k < int64(len(b)) {
				return int(k), io.EOF
			}
			return int(k), nil
		}
	}
	page, err := r.p.page(int(r.c.unit))
	if err != nil {
		return 0, err
	}
	n := copy(b, page[r.c.off+off:r.c.off+r.size])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

// assembleValues lets a value be decompressed alone; false (tests)
// decompresses its whole page.
var assembleValues = true

// scratch holds the compressed bytes of a value being assembled.
var scratch = sync.Pool{New: func() any { return new([]byte) }}

// assemble decompresses the bytes [q, q+len(dst)) of unit u's page into
// dst, from the elements that make them: their compressed bytes are read
// with one read, literals copied from it, copies from dst itself or, for
// bytes before q, resolved through the file. false: too tangled; the
// caller decompresses the page.
func (p *pagedListed) assemble(u *pqUnit, dst []byte, q int64) (bool, error) {
	if err := p.done.Err(); err != nil {
		return false, err
	}
	f, err := p.file(0)
	if err != nil {
		return false, err
	}
	v := &pqView{pl: &pageLister{r: f, size: f.Size()}, off: u.off, size: u.usize, elems: u.elems}
	end := q + int64(len(dst))
	i0, i1 := v.elem(q), v.elem(end-1)
	if i1 >= len(u.elems) {
		return false, fmt.Errorf("%w: %s: a value past its page at byte %d", ErrData, p.names[0], u.off)
	}
	spanStart, spanEnd := u.elems[i0].at, u.off+u.csize
	if i1+1 < len(u.elems) {
		spanEnd = u.elems[i1+1].at
	}
	sp := scratch.Get().(*[]byte)
	defer scratch.Put(sp)
	if int64(cap(*sp)) < spanEnd-spanStart {
		*sp = make([]byte, spanEnd-spanStart)
	}
	span := (*sp)[:spanEnd-spanStart]
	if n, err := f.ReadAt(span, spanStart); n < len(span) {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("%w: %s changed while packing: a page at byte %d is cut short", ErrData, p.names[0], u.off)
		}
		return false, err
	}
	pos := q
	for i := i0; pos < end; i++ {
		e := u.elems[i]
		k := min(e.dst+e.n, end) - pos
		o := pos - q
		if e.src >= 0 {
			copy(dst[o:o+k], span[e.src-spanStart+pos-e.dst:])
			pos += k
			continue
		}
		for s := pos - e.back; k > 0; { // a copy: chunks of at most back bytes, each written before
			c := min(k, e.back)
			switch {
			case s >= q:
				copy(dst[o:o+c], dst[s-q:s-q+c])
			case s+c <= q:
				if err := v.read(dst[o:o+c], s); err != nil {
					return false, nil
				}
			default: // from before q and from dst
				m := q - s
				if err := v.read(dst[o:o+m], s); err != nil {
					return false, nil
				}
				copy(dst[o+m:o+c], dst[:c-m])
			}
			o, s, pos, k = o+c, s+c, pos+c, k-c
		}
	}
	return true, nil
}

// snElem is one element of a snappy block: n bytes of output at dst,
// either literal bytes of the file at src or a copy of the output off
// bytes back.
type snElem struct {
	dst, n int64
	src    int64 // a literal's bytes in the file; -1 for a copy
	back   int64 // a copy's offset
	at     int64 // the element's tag in the file
}

// pqView reads a page's decompressed bytes without decompressing it.
type pqView struct {
	pl     *pageLister
	plain  bool  // stored as is: off is where the bytes start in the file
	off    int64 // the page body (plain) or the snappy block in the file
	size   int64 // decompressed bytes
	elems  []snElem
	csize  int64 // the snappy block's size in the file
	unit   int32 // the unit in pagedListed.units; -1 until one is made
	budget int   // copy steps left for resolving the bytes of one read
}

// errSnappyTangled: too many copies to follow for the bytes asked.
var errSnappyTangled = errors.New("pack: snappy stream too tangled to list")

// maxElems bounds the elements of a snappy block walked (its listing
// holds them all); a page of tiny matches is left to the walk.
const maxElems = 1 << 20

// parseSnappy walks the tags of the snappy block of csize bytes at off.
func (v *pqView) parseSnappy(off, csize int64) error {
	end := off + csize
	b, err := v.pl.at(off, int(min(csize, 10)))
	if err != nil {
		return err
	}
	ulen, k := binary.Uvarint(b)
	if k <= 0 || int64(ulen) != v.size {
		return errNotListable
	}
	pos := off + int64(k)
	var dst int64
	v.elems = v.elems[:0]
	for pos < end {
		if len(v.elems) >= maxElems {
			return errNotListable
		}
		t, err := v.pl.at(pos, int(min(5, end-pos)))
		if err != nil {
			return err
		}
		tag, at := t[0], pos
		var e snElem
		switch tag & 3 {
		case 0: // literal
			n, h := int64(tag>>2), int64(1)
			if n >= 60 {
				w := int64(n - 59)
				if int64(len(t)) < 1+w {
					return errNotListable
				}
				n = 0
				for i := w; i >= 1; i-- {
					n = n<<8 | int64(t[i])
				}
				h += w
			}
			n++
			e = snElem{dst: dst, n: n, src: pos + h}
			pos += h + n
		case 1:
			if len(t) < 2 {
				return errNotListable
			}
			e = snElem{dst: dst, n: 4 + int64(tag>>2&7), src: -1, back: int64(tag&0xe0)<<3 | int64(t[1])}
			pos += 2
		case 2:
			if len(t) < 3 {
				return errNotListable
			}
			e = snElem{dst: dst, n: 1 + int64(tag>>2), src: -1, back: int64(binary.LittleEndian.Uint16(t[1:]))}
			pos += 3
		case 3:
			if len(t) < 5 {
				return errNotListable
			}
			e = snElem{dst: dst, n: 1 + int64(tag>>2), src: -1, back: int64(binary.LittleEndian.Uint32(t[1:]))}
			pos += 5
		}
		e.at = at
		if pos > end || (e.src < 0 && (e.back <= 0 || e.back > dst)) {
			return errNotListable
		}
		v.elems = append(v.elems, e)
		dst += e.n
	}
	if dst != v.size {
		return errNotListable
	}
	return nil
}

// elem returns the index of the element holding output byte q.
func (v *pqView) elem(q int64) int {
	return sort.Search(len(v.elems), func(i int) bool { return v.elems[i].dst+v.elems[i].n > q }) // first element ending after q
}

// read copies the decompressed bytes [q, q+len(b)) into b.
func (v *pqView) read(b []byte, q int64) error {
	v.budget = 4096 + len(b)/16
	return v.readAt(b, q)
}

func (v *pqView) readAt(b []byte, q int64) error {
	if q < 0 || q+int64(len(b)) > v.size {
		return errNotListable
	}
	if v.plain {
		r, err := v.pl.at(v.off+q, len(b))
		if err != nil {
			return err
		}
		copy(b, r)
		return nil
	}
	for len(b) > 0 {
		if v.budget--; v.budget < 0 {
			return errSnappyTangled
		}
		i := v.elem(q)
		e := v.elems[i]
		k := min(int64(len(b)), e.dst+e.n-q)
		if e.src >= 0 {
			r, err := v.pl.at(e.src+q-e.dst, int(k))
			if err != nil {
				return err
			}
			copy(b, r)
		} else {
			k = min(k, e.back) // the bytes copied lie wholly before q
			if err := v.readAt(b[:k], q-e.back); err != nil {
				return err
			}
		}
		b = b[k:]
		q += k
	}
	return nil
}

// literal returns the file extents holding the decompressed bytes [q,
// q+n), if they all lie in literals.
func (v *pqView) literal(q, n int64, fi int) ([]extent, bool) {
	if v.plain {
		return []extent{{file: fi, off: v.off + q, size: n}}, true
	}
	if n == 0 {
		return []extent{{file: fi, off: 0, size: 0}}, true
	}
	var out []extent
	for i := v.elem(q); n > 0; i++ {
		e := v.elems[i]
		if e.src < 0 {
			return nil, false
		}
		k := min(n, e.dst+e.n-q)
		out = append(out, extent{file: fi, off: e.src + q - e.dst, size: k})
		q += k
		n -= k
	}
	return out, true
}

// u32 reads a little-endian uint32 of the decompressed bytes at q.
func (v *pqView) u32(q int64) (int64, error) {
	var b [4]byte
	if err := v.read(b[:], q); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint32(b[:])), nil
}

// pqDictVal is a dictionary value: its place in the dictionary page.
type pqDictVal struct{ off, size int64 }

// listParquetPages lists a flat BYTE_ARRAY column whose pages are
// uncompressed or snappy, PLAIN or dictionary-encoded, without a NULL.
// It returns errNotListable (or another error, which the caller treats
// the same) when the column is not like that.
func listParquetPages(ctx context.Context, fsys fs.FS, name, column string) (_ *pagedListed, err error) {
	c, err := openPQColumn(ctx, fsys, name, column, compress.Codecs.Uncompressed, compress.Codecs.Snappy)
	if err != nil {
		return nil, err
	}
	f, md, ci, rows := c.f, c.md, c.ci, c.rows
	defer c.pr.Close()
	defer func() {
		if r := recover(); r != nil { // the page headers' reader may panic on some input
			err = errNotListable
		}
		if err != nil {
			f.Close()
		}
	}()
	if rows == 0 {
		return nil, errNotListable
	}
	l := newListed(ctx, "parquet", fsys)
	fi := l.addFile(name, f)
	p := &pagedListed{listed: l, free: make(chan []byte, 2), freeSrc: make(chan []byte, 1)}
	l.samples = make([]Sample, 0, rows)
	l.extents = make([][]extent, 0, rows)
	p.cut = make([]pqCut, 0, rows)
	pl := &pageLister{r: f, size: f.Size(), maxDef: c.maxDef}
	lp := &pagesLister{p: p, pl: pl, fi: fi, base: path.Base(name) + ":"}
	for g := range md.NumRowGroups() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rg := md.RowGroup(g)
		cc, _ := rg.ColumnChunk(ci)
		start := cc.DataPageOffset()
		if cc.HasDictionaryPage() && cc.DictionaryPageOffset() > 0 && cc.DictionaryPageOffset() < start {
			start = cc.DictionaryPageOffset()
		}
		before := len(l.samples)
		if err := lp.chunk(start, start+cc.TotalCompressedSize(), cc.Compression() == compress.Codecs.Snappy); err != nil {
			return nil, err
		}
		if int64(len(l.samples)-before) != rg.NumRows() {
			return nil, errNotListable
		}
	}
	var bytes int64
	for _, s := range l.samples {
		bytes += s.Size
	}
	if bytes/rows < listParquetMinValue { // short values: the walk is faster
		return nil, errNotListable
	}
	return p, nil
}

// pagesLister lists a column's pages into p.
type pagesLister struct {
	p    *pagedListed
	pl   *pageLister
	fi   int
	base string
	dict []pqDictVal
	dv   *pqView // the chunk's dictionary page
	idx  []int32
	// elements kept for assembling values, in all units
	elems int
}

// maxKeptElems bounds the snappy elements kept for assembling values (40
// bytes each); the pages past it are decompressed whole.
const maxKeptElems = 4 << 20

// view makes a view of a page's decompressed bytes: csize bytes at off,
// size decompressed.
func (lp *pagesLister) view(off, csize, size int64, compressed bool) (*pqView, error) {
	v := &pqView{pl: lp.pl, plain: !compressed, off: off, size: size, csize: csize, unit: -1}
	if !compressed {
		if csize != size {
			return nil, errNotListable
		}
		return v, nil
	}
	if size > pageMax {
		return nil, errNotListable
	}
	return v, v.parseSnappy(off, csize)
}

// add lists one sample: size bytes at q of the page v.
func (lp *pagesLister) add(v *pqView, q, size int64) {
	l := lp.p.listed
	l.samples = append(l.samples, Sample{Name: lp.base + strconv.Itoa(len(l.samples)), Size: size})
	if ext, ok := v.literal(q, size, lp.fi); ok && (snappyDirect || v.plain) {
		l.extents = append(l.extents, ext)
		lp.p.cut = append(lp.p.cut, pqCut{unit: -1})
		return
	}
	if v.unit < 0 {
		v.unit = int32(len(lp.p.units))
		u := &pqUnit{off: v.off, csize: v.csize, usize: v.size}
		if lp.elems+len(v.elems) <= maxKeptElems {
			u.elems = v.elems
			lp.elems += len(v.elems)
		}
		lp.p.units = append(lp.p.units, u)
	}
	lp.p.units[v.unit].refs.Add(1)
	l.extents = append(l.extents, nil)
	lp.p.cut = append(lp.p.cut, pqCut{unit: v.unit, off: q})
}

// chunk lists the values of the pages of one column chunk in [off, end).
func (lp *pagesLister) chunk(off, end int64, compressed bool) error {
	pl := lp.pl
	if off < 0 || end > pl.size || off > end {
		return errNotListable
	}
	lp.dict, lp.dv = lp.dict[:0], nil
	for off < end {
		h, hl, err := pl.header(off, end)
		if err != nil {
			return err
		}
		body := off + int64(hl)
		next := body + int64(h.CompressedPageSize)
		if h.CompressedPageSize < 0 || h.UncompressedPageSize < 0 || next > end {
			return errNotListable
		}
		csize, usize := int64(h.CompressedPageSize), int64(h.UncompressedPageSize)
		switch h.Type {
		case format.IndexPage:
		case format.DictionaryPage:
			dh := h.DictionaryPageHeader
			if !dh.Valid || (dh.V.Encoding != format.Plain && dh.V.Encoding != format.PlainDictionary) || lp.dv != nil {
				return errNotListable
			}
			v, err := lp.view(body, csize, usize, compressed)
			if err != nil {
				return err
			}
			var q int64
			for range dh.V.NumValues {
				n, err := v.u32(q)
				if err != nil {
					return err
				}
				if n > v.size-q-4 {
					return errNotListable
				}
				lp.dict = append(lp.dict, pqDictVal{off: q + 4, size: n})
				q += 4 + n
			}
			lp.dv = v
		case format.DataPage:
			dh := h.DataPageHeader
			if !dh.Valid {
				return errNotListable
			}
			v, err := lp.view(body, csize, usize, compressed)
			if err != nil {
				return err
			}
			var q int64
			n := int64(dh.V.NumValues)
			if pl.maxDef > 0 {
				if dh.V.DefinitionLevelEncoding != format.RLE {
					return errNotListable
				}
				ll, err := v.u32(0)
				if err != nil {
					return err
				}
				if ll > v.size-4 || ll > 1<<20 {
					return errNotListable
				}
				lv := make([]byte, ll)
				if err := v.read(lv, 4); err != nil {
					return err
				}
				if err := allDefinedIn(lv, n); err != nil {
					return err
				}
				q = 4 + ll
			}
			if err := lp.values(v, q, n, dh.V.Encoding); err != nil {
				return err
			}
		case format.DataPageV2:
			dh := h.DataPageHeaderV2.V
			if !h.DataPageHeaderV2.Valid || dh.NumNulls != 0 || dh.RepetitionLevelsByteLength != 0 || dh.DefinitionLevelsByteLength < 0 || int64(dh.DefinitionLevelsByteLength) > csize || int64(dh.DefinitionLevelsByteLength) > usize {
				return errNotListable
			}
			dl := int64(dh.DefinitionLevelsByteLength)
			comp := compressed && (!dh.IsCompressed.Valid || dh.IsCompressed.V)
			v, err := lp.view(body+dl, csize-dl, usize-dl, comp)
			if err != nil {
				return err
			}
			if err := lp.values(v, 0, int64(dh.NumValues), dh.Encoding); err != nil {
				return err
			}
		default:
			return errNotListable
		}
		off = next
	}
	return nil
}

// values lists the n values of a data page starting at q of its
// decompressed bytes.
func (lp *pagesLister) values(v *pqView, q, n int64, enc format.Encoding) error {
	switch enc {
	case format.Plain:
		for range n {
			size, err := v.u32(q)
			if err != nil {
				return err
			}
			if size > v.size-q-4 {
				return errNotListable
			}
			lp.add(v, q+4, size)
			q += 4 + size
		}
		if q != v.size {
			return errNotListable
		}
		return nil
	case format.RLEDictionary, format.PlainDictionary:
		if lp.dv == nil || v.size-q > 64<<20 || v.size-q < 1 {
			return errNotListable
		}
		b := make([]byte, v.size-q)
		if err := v.read(b, q); err != nil { // the indices: a small page
			return err
		}
		bw := int(b[0])
		if bw > 32 {
			return errNotListable
		}
		idx, err := (&rle.Encoding{BitWidth: bw}).DecodeInt32(lp.idx[:0], b[1:])
		if err != nil || int64(len(idx)) < n {
			return errNotListable
		}
		lp.idx = idx
		for _, k := range idx[:n] {
			if k < 0 || int(k) >= len(lp.dict) {
				return errNotListable
			}
			d := lp.dict[k]
			lp.add(lp.dv, d.off, d.size)
		}
		return nil
	}
	return errNotListable
}

// allDefinedIn checks that the first n of the RLE definition levels b are
// all 1 (no NULL value).
func allDefinedIn(b []byte, n int64) error {
	lv, err := (&rle.Encoding{BitWidth: 1}).DecodeLevels(nil, b)
	if err != nil || int64(len(lv)) < n {
		return errNotListable
	}
	for _, v := range lv[:n] {
		if v != 1 {
			return errNotListable
		}
	}
	return nil
}
