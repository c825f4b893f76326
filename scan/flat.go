package scan

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go/encoding/rle"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"

	"github.com/ffkit/ffkit/scan/expr"
)

// The flat decoder reads a flat fixed-width column chunk (int32, int64,
// float, double, date32; required or optional; PLAIN or dictionary
// encoded; data pages v1 or v2; uncompressed, snappy, gzip or zstd) with
// one read into a reused buffer, and decompresses each page into another
// reused buffer with a pooled zstd decoder. Nothing is allocated per row
// group once the buffers have grown: the values of a one-page chunk
// without nulls are a view of the decompressed page. The filter path
// (query.readFlat) evaluates the filter on such views and copies out only
// the rows it keeps, so neither the filter column nor the projected
// columns are materialized whole. Anything else declines (errDecline) to
// the page reader of fastpath.go.

// flatScratch holds the reused buffers of one column being decoded.
type flatScratch struct {
	raw    []byte  // the column chunk as read
	page   []byte  // one decompressed page
	vals   []byte  // values of a chunk of several pages, or with nulls
	dict   []byte  // dictionary values
	levels []uint8 // definition levels of a page
	rawLev []byte  // a v2 page's encoded definition levels (copied out of the page)
	idx    []int32 // dictionary indices of a page
	valid  []byte  // validity bitmap (nulls only)
	tmp    []byte  // a dictionary page's values before nulls are spread
	sel    []int32 // rows a filter keeps
	// inPlace: an uncompressed v1 page is returned as it is in the chunk
	// (the file's mapping), for a decoder that copies values out under
	// faultPanics
	inPlace bool
}

var flatPool = sync.Pool{New: func() any { return new(flatScratch) }}

func getScratch() *flatScratch { return flatPool.Get().(*flatScratch) }

func putScratch(s *flatScratch) {
	// keep a scratch of a normal row group; drop pathological giants
	if cap(s.raw)+cap(s.page)+cap(s.vals) > 256<<20 {
		return
	}
	flatPool.Put(s)
}

// zstd decoders, one per goroutine decoding at a time (concurrency 1:
// DecodeAll runs on the caller's goroutine, as the workers are ours).
var zstdDecoders = make(chan *zstd.Decoder, 64)

func getZstd() (*zstd.Decoder, error) {
	select {
	case d := <-zstdDecoders:
		return d, nil
	default:
		return zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(false))
	}
}

func putZstd(d *zstd.Decoder) {
	select {
	case zstdDecoders <- d:
	default:
		d.Close()
	}
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n, n+n/8)
	}
	return b[:n]
}

// decompress decodes src with codec into s.page (reused) and returns it.
func (s *flatScratch) decompress(codec compress.Compression, src []byte, size int) ([]byte, error) {
	if size < 0 {
		return nil, fmt.Errorf("negative page size %d", size)
	}
	switch codec {
	case compress.Codecs.Uncompressed:
		if len(src) != size {
			return nil, fmt.Errorf("uncompressed page of %d bytes, header says %d", len(src), size)
		}
		if s.inPlace {
			return src, nil
		}
		// copied: src may be the file's mapping, which only decodeFlat
		// reads under SetPanicOnFault
		s.page = append(s.page[:0], src...)
		return s.page, nil
	case compress.Codecs.Zstd:
		d, err := getZstd()
		if err != nil {
			return nil, err
		}
		out, err := d.DecodeAll(src, grow(s.page, size)[:0])
		putZstd(d)
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		if cap(out) > cap(s.page) {
			s.page = out[:0]
		}
		if len(out) != size {
			return nil, fmt.Errorf("zstd page decodes to %d bytes, header says %d", len(out), size)
		}
		return out, nil
	case compress.Codecs.Snappy:
		n, err := s2.DecodedLen(src)
		if err != nil || n != size {
			return nil, fmt.Errorf("snappy page: decoded length %d, header says %d (%v)", n, size, err)
		}
		s.page = grow(s.page, size)
		out, err := s2.Decode(s.page, src)
		if err != nil {
			return nil, fmt.Errorf("snappy: %w", err)
		}
		return out, nil
	case compress.Codecs.Gzip:
		zr, err := gzip.NewReader(bytesReader(src))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		s.page = grow(s.page, size)
		n := 0
		for n < size {
			m, err := zr.Read(s.page[n:])
			n += m
			if err != nil {
				break
			}
		}
		if n != size {
			return nil, fmt.Errorf("gzip page decodes to %d bytes, header says %d", n, size)
		}
		return s.page, nil
	}
	return nil, errDecline
}

type byteSliceReader struct{ b []byte }

func (r *byteSliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func bytesReader(b []byte) *byteSliceReader { return &byteSliceReader{b} }

// flatWidth is the value width of top-level column col if the flat decoder
// may read it, else 0.
func (pf *File) flatWidth(col int) int {
	if !pf.fastOK(col) {
		return 0
	}
	d := pf.meta.Schema.Column(pf.leaves[col][0])
	switch pt := d.PhysicalType(); {
	case pt.ByteSize() == 4 || pt.ByteSize() == 8:
		switch pf.Schema.Field(col).Type.ID() {
		case arrow.INT32, arrow.FLOAT32, arrow.DATE32:
			if pt.ByteSize() == 4 {
				return 4
			}
		case arrow.INT64, arrow.FLOAT64:
			if pt.ByteSize() == 8 {
				return 8
			}
		}
	}
	return 0
}

// badf reports corrupt bytes in the column chunk being decoded.
type badf func(format string, a ...any) error

// nextPage decodes the page header at the start of raw, the unread rest of
// chunk, and returns it with the page's body and what follows the page.
func nextPage(proto *thrift.CompactProtocol, chunk, raw []byte, bad badf) (h format.PageHeader, body, rest []byte, err error) {
	pr := proto.NewReaderFromBytes(raw)
	if err := thrift.NewDecoder(pr).Decode(&h); err != nil {
		return h, nil, nil, bad("page header at byte %d: %v", len(chunk)-len(raw), err)
	}
	raw = raw[pr.BytesRead():]
	if h.CompressedPageSize < 0 || int(h.CompressedPageSize) > len(raw) {
		return h, nil, nil, bad("page of %d bytes overruns the chunk (%d left)", h.CompressedPageSize, len(raw))
	}
	return h, raw[:h.CompressedPageSize], raw[h.CompressedPageSize:], nil
}

// inflate is decompress naming what failed: errDecline passes through,
// any other error is corrupt data.
func (s *flatScratch) inflate(codec compress.Compression, body []byte, size int, what string, bad badf) ([]byte, error) {
	p, err := s.decompress(codec, body, size)
	if err != nil && err != errDecline {
		return nil, bad("%s: %v", what, err)
	}
	return p, err
}

// dataPage decompresses a data page (v1 or v2) and splits off its
// definition levels (nil when maxDef is 0). It returns the page's value
// count (nulls included) and encoding. Neither levels nor data is a view of
// the file's mapping, unless s.inPlace. errDecline: levels this decoder does not read.
func (s *flatScratch) dataPage(codec compress.Compression, h *format.PageHeader, body []byte, maxDef int16, bad badf) (n int, enc format.Encoding, levels, data []byte, err error) {
	if h.Type == format.DataPage {
		dh := h.DataPageHeader.V
		if !h.DataPageHeader.Valid {
			return 0, 0, nil, nil, bad("data page without its header")
		}
		if data, err = s.inflate(codec, body, int(h.UncompressedPageSize), "page", bad); err != nil {
			return 0, 0, nil, nil, err
		}
		if maxDef > 0 {
			if dh.DefinitionLevelEncoding != format.RLE || len(data) < 4 {
				return 0, 0, nil, nil, errDecline
			}
			l := int(binary.LittleEndian.Uint32(data))
			if l < 0 || 4+l > len(data) {
				return 0, 0, nil, nil, bad("definition levels of %d bytes in a %d-byte page", l, len(data))
			}
			levels, data = data[4:4+l], data[4+l:]
		}
		return int(dh.NumValues), dh.Encoding, levels, data, nil
	}
	dh := h.DataPageHeaderV2.V
	if !h.DataPageHeaderV2.Valid {
		return 0, 0, nil, nil, bad("data page without its header")
	}
	rl, dl := int(dh.RepetitionLevelsByteLength), int(dh.DefinitionLevelsByteLength)
	if rl != 0 || dl < 0 || dl > len(body) {
		return 0, 0, nil, nil, bad("levels of %d+%d bytes in a %d-byte page", rl, dl, len(body))
	}
	s.rawLev = append(s.rawLev[:0], body[:dl]...)
	if maxDef > 0 {
		levels = s.rawLev
	}
	body = body[dl:]
	if !dh.IsCompressed.Valid || dh.IsCompressed.V {
		if data, err = s.inflate(codec, body, int(h.UncompressedPageSize)-dl, "page", bad); err != nil {
			return 0, 0, nil, nil, err
		}
	} else {
		s.page = append(s.page[:0], body...)
		data = s.page
	}
	return int(dh.NumValues), dh.Encoding, levels, data, nil
}

// decodePanic is the error for r, recovered while decoding column col of
// row group rg: a memory fault on the mapped file (it was truncated during
// the scan) or a decoder's panic on corrupt bytes.
func (pf *File) decodePanic(rg, col int, r any) error {
	what := "decoder panic"
	if _, fault := r.(interface{ Addr() uintptr }); fault {
		what = "memory fault reading the mapped file (truncated during the scan?)"
	}
	return corruptf(pf.Path, fmt.Errorf("row group %d column %q: %s: %v", rg, pf.Schema.Field(col).Name, what, r))
}

// flatCodec reports whether the chunk decoders here read codec (the others
// go to pqarrow).
func flatCodec(codec compress.Compression) bool {
	switch codec {
	case compress.Codecs.Uncompressed, compress.Codecs.Zstd, compress.Codecs.Snappy, compress.Codecs.Gzip:
		return true
	}
	return false
}

// decodeFlat decodes the whole chunk of column col in row group rg. vals
// holds rows*width bytes (a null row's bytes are zero); valid is nil when
// no row is null. Both alias s's buffers: they stay valid until s is
// reused. errDecline: the chunk is not for this decoder.
func (pf *File) decodeFlat(rg, col int, s *flatScratch) (vals, valid []byte, nulls int, err error) {
	defer faultPanics()()
	defer func() {
		if r := recover(); r != nil {
			err = pf.decodePanic(rg, col, r)
		}
	}()
	width := pf.flatWidth(col)
	if width == 0 {
		return nil, nil, 0, errDecline
	}
	leaf := pf.leaves[col][0]
	maxDef := pf.meta.Schema.Column(leaf).MaxDefinitionLevel()
	cc, err := pf.meta.RowGroup(rg).ColumnChunk(leaf)
	if err != nil {
		return nil, nil, 0, corruptf(pf.Path, err)
	}
	codec := cc.Compression()
	if !flatCodec(codec) {
		return nil, nil, 0, errDecline
	}
	name := pf.Schema.Field(col).Name
	bad := badf(func(format string, a ...any) error {
		return corruptf(pf.Path, fmt.Errorf("row group %d column %q: %s", rg, name, fmt.Sprintf(format, a...)))
	})
	start, end := chunkRange(cc)
	chunk, err := pf.chunkBytes(start, end, &s.raw)
	if err != nil {
		return nil, nil, 0, corruptf(pf.Path, fmt.Errorf("row group %d column %q: %w", rg, name, err))
	}
	defer pf.dropChunk(start, end)
	rows := int(pf.RowGroupRows(rg))
	raw := chunk
	pos := 0 // rows decoded
	var proto thrift.CompactProtocol
	haveDict := false
	s.valid = s.valid[:0]
	for len(raw) > 0 && pos < rows {
		h, body, rest, err := nextPage(&proto, chunk, raw, bad)
		if err != nil {
			return nil, nil, 0, err
		}
		raw = rest
		switch h.Type {
		case format.DictionaryPage:
			dh := h.DictionaryPageHeader.V
			if !h.DictionaryPageHeader.Valid || (dh.Encoding != format.Plain && dh.Encoding != format.PlainDictionary) {
				return nil, nil, 0, errDecline
			}
			p, err := s.inflate(codec, body, int(h.UncompressedPageSize), "dictionary page", bad)
			if err != nil {
				return nil, nil, 0, err
			}
			if int(dh.NumValues) < 0 || int(dh.NumValues)*width > len(p) {
				return nil, nil, 0, bad("dictionary of %d values in %d bytes", dh.NumValues, len(p))
			}
			s.dict = append(s.dict[:0], p[:int(dh.NumValues)*width]...)
			haveDict = true
			continue
		case format.DataPage, format.DataPageV2:
		default:
			continue // index pages and the like
		}
		n, enc, levels, data, err := s.dataPage(codec, &h, body, maxDef, bad)
		if err != nil {
			return nil, nil, 0, err
		}
		if n < 0 || pos+n > rows {
			return nil, nil, 0, bad("pages hold more than %d rows", rows)
		}
		// definition levels: which rows are null
		present := n
		if levels != nil {
			lv, err := (&rle.Encoding{BitWidth: 1}).DecodeLevels(s.levels, levels)
			if err != nil {
				return nil, nil, 0, bad("definition levels: %v", err)
			}
			s.levels = lv
			if len(lv) < n {
				return nil, nil, 0, bad("%d definition levels for %d values", len(lv), n)
			}
			lv = lv[:n]
			present = 0
			for _, l := range lv {
				present += int(l & 1)
			}
		}
		single := pos == 0 && n == rows && present == n
		// the page's values, PLAIN or through the dictionary
		var pv []byte
		switch enc {
		case format.Plain:
			if len(data) < present*width {
				return nil, nil, 0, bad("%d bytes hold fewer than %d values", len(data), present)
			}
			pv = data[:present*width]
			if single {
				return pv, nil, 0, nil // the common case: a view of the page
			}
		case format.PlainDictionary, format.RLEDictionary:
			if !haveDict {
				return nil, nil, 0, bad("dictionary-encoded page without a dictionary page")
			}
			if len(data) < 1 || data[0] > 32 {
				return nil, nil, 0, bad("bad dictionary index width")
			}
			idx, err := (&rle.Encoding{BitWidth: int(data[0])}).DecodeInt32(s.idx[:0], data[1:])
			if err != nil {
				return nil, nil, 0, bad("dictionary indices: %v", err)
			}
			s.idx = idx
			if len(idx) < present {
				return nil, nil, 0, bad("%d dictionary indices for %d values", len(idx), present)
			}
			idx = idx[:present]
			nd := uint32(len(s.dict) / width)
			for _, i := range idx {
				if uint32(i) >= nd {
					return nil, nil, 0, bad("dictionary index %d of a %d-value dictionary", i, nd)
				}
			}
			s.vals = grow(s.vals, rows*width)
			dst := s.vals[pos*width : (pos+n)*width]
			if present == n {
				dictGather(dst, s.dict, idx, width)
				pos += n
				continue
			}
			// nulls: expand below from a compact copy
			s.tmp = grow(s.tmp, present*width)
			dictGather(s.tmp, s.dict, idx, width)
			pv = s.tmp
		default:
			return nil, nil, 0, errDecline
		}
		s.vals = grow(s.vals, rows*width)
		dst := s.vals[pos*width : (pos+n)*width]
		if present == n {
			copy(dst, pv)
		} else {
			if len(s.valid) == 0 {
				s.valid = grow(s.valid, int(bitutil.BytesForBits(int64(rows))))
				for i := range s.valid {
					s.valid[i] = 0xff
				}
			}
			j := 0
			for i, l := range s.levels[:n] {
				if l&1 == 0 {
					bitutil.ClearBit(s.valid, pos+i)
					clear(dst[i*width : (i+1)*width])
					nulls++
					continue
				}
				copy(dst[i*width:(i+1)*width], pv[j*width:(j+1)*width])
				j++
			}
		}
		pos += n
	}
	if pos != rows {
		return nil, nil, 0, bad("%d rows decoded, want %d", pos, rows)
	}
	if nulls == 0 {
		return s.vals[:rows*width], nil, 0, nil
	}
	return s.vals[:rows*width], s.valid, nulls, nil
}

func dictGather(dst, dict []byte, idx []int32, width int) {
	if width == 8 {
		d := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(dst))), len(dst)/8)
		v := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(dict))), len(dict)/8)
		for k, i := range idx {
			d[k] = v[i]
		}
		return
	}
	d := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(dst))), len(dst)/4)
	v := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(dict))), len(dict)/4)
	for k, i := range idx {
		d[k] = v[i]
	}
}

// viewArray wraps decoded values (not copied) as an Arrow array of dt; it
// must not outlive the scratch they belong to.
func viewArray(dt arrow.DataType, n int, vals, valid []byte, nulls int) arrow.Array {
	var vb *memory.Buffer
	if nulls > 0 {
		vb = memory.NewBufferBytes(valid)
	}
	ad := array.NewData(dt, n, []*memory.Buffer{vb, memory.NewBufferBytes(vals)}, nil, nulls, 0)
	defer ad.Release()
	return array.MakeFromData(ad)
}

// selection lists the rows a filter mask keeps, in a reused slice.
func selectRows(sel []int32, mask []bool) []int32 {
	sel = sel[:0]
	for i, b := range mask {
		if b {
			sel = append(sel, int32(i))
		}
	}
	return sel
}

// gatherArray copies rows sel of decoded values into a new Arrow array.
func gatherArray(dt arrow.DataType, width int, vals, valid []byte, nulls int, sel []int32) arrow.Array {
	out := make([]byte, len(sel)*width)
	if width == 8 {
		d := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(out))), len(sel))
		v := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(vals))), len(vals)/8)
		for k, i := range sel {
			d[k] = v[i]
		}
	} else {
		d := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(out))), len(sel))
		v := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(vals))), len(vals)/4)
		for k, i := range sel {
			d[k] = v[i]
		}
	}
	var vb []byte
	outNulls := 0
	if nulls > 0 {
		vb = make([]byte, bitutil.BytesForBits(int64(len(sel))))
		for k, i := range sel {
			if bitutil.BitIsSet(valid, int(i)) {
				bitutil.SetBit(vb, k)
			} else {
				outNulls++
			}
		}
	}
	return viewArray(dt, len(sel), out, vb, outNulls)
}

// readFlat is readRange for a whole row group whose read columns all take
// the flat decoder: the filter runs on views of the decompressed pages,
// and every output column is copied once, for the rows kept only.
// handled is false when the decoder declines (readRange then reads it).
func (q *query) readFlat(u unit) (rec arrow.RecordBatch, handled bool, err error) {
	f := u.file
	if !FastPath || f.coalesce || q.where == nil || u.hi >= 0 {
		return nil, false, nil
	}
	fcols := q.fileCols(f, allPos(len(q.readNames)))
	widths := make([]int, len(fcols))
	for i, c := range fcols {
		if i < len(q.dict) && q.dict[i] {
			return nil, false, nil
		}
		if widths[i] = f.flatWidth(c); widths[i] == 0 {
			return nil, false, nil
		}
	}
	decs := make([]flatCol, len(fcols))
	defer func() {
		for _, d := range decs {
			if d.s != nil {
				putScratch(d.s)
			}
		}
	}()
	decode := func(p int) error {
		d := &decs[p]
		d.s = getScratch()
		var err error
		d.vals, d.valid, d.nulls, err = f.decodeFlat(u.rg, fcols[p], d.s)
		return err
	}
	n := int(f.RowGroupRows(u.rg))
	if len(q.filterPos) == 1 {
		p := q.filterPos[0]
		dt := f.Schema.Field(fcols[p]).Type
		if cf, ok := q.simpleCmp(dt); ok {
			if err := decode(p); err != nil {
				if err == errDecline {
					return nil, false, nil
				}
				return nil, true, err
			}
			if decs[p].nulls == 0 {
				d := decs[p].s
				d.sel = selectFlat(d.sel, cf, dt, decs[p].vals)
				return q.gatherFlat(u, fcols, widths, decs, d.sel)
			}
		}
	}
	fields := make([]arrow.Field, len(q.filterPos))
	arrs := make([]arrow.Array, len(q.filterPos))
	for k, p := range q.filterPos {
		if decs[p].s != nil {
			// decoded above
		} else if err := decode(p); err != nil {
			for _, a := range arrs[:k] {
				a.Release()
			}
			if err == errDecline {
				return nil, false, nil
			}
			return nil, true, err
		}
		fields[k] = q.readSchema.Field(p)
		fields[k].Type = f.Schema.Field(fcols[p]).Type
		arrs[k] = viewArray(fields[k].Type, n, decs[p].vals, decs[p].valid, decs[p].nulls)
	}
	fr := array.NewRecordBatch(arrow.NewSchema(fields, nil), arrs, int64(n))
	for _, a := range arrs {
		a.Release()
	}
	mask, err := q.where.Eval(fr)
	fr.Release() // the views die here: nothing the filter returns aliases them
	if err != nil {
		return nil, true, fmt.Errorf("%s: %w", f.Path, err)
	}
	s0 := decs[q.filterPos[0]].s
	if mask.T == expr.TBool && !mask.Scalar && mask.Null == nil {
		s0.sel = selectRows(s0.sel, mask.B[:n])
	} else {
		s0.sel = s0.sel[:0]
		for i := 0; i < n; i++ {
			if mask.True(i) {
				s0.sel = append(s0.sel, int32(i))
			}
		}
	}
	return q.gatherFlat(u, fcols, widths, decs, s0.sel)
}

// flatCol is one column decoded by the flat decoder.
type flatCol struct {
	s           *flatScratch
	vals, valid []byte
	nulls       int
}

// gatherFlat decodes the columns not yet decoded and copies rows sel of
// every column out into a batch.
func (q *query) gatherFlat(u unit, fcols, widths []int, decs []flatCol, sel []int32) (arrow.RecordBatch, bool, error) {
	if len(sel) == 0 {
		return nil, true, nil
	}
	f := u.file
	for _, p := range q.otherPos {
		d := &decs[p]
		d.s = getScratch()
		var err error
		if d.vals, d.valid, d.nulls, err = f.decodeFlat(u.rg, fcols[p], d.s); err != nil {
			if err == errDecline {
				return nil, false, nil
			}
			return nil, true, err
		}
	}
	cols := make([]arrow.Array, len(fcols))
	for p, c := range fcols {
		d := decs[p]
		cols[p] = gatherArray(f.Schema.Field(c).Type, widths[p], d.vals, d.valid, d.nulls, sel)
	}
	rec := array.NewRecordBatch(q.schemaFor(cols), cols, int64(len(sel)))
	for _, c := range cols {
		c.Release()
	}
	return rec, true, nil
}

// cmpFilter is a filter of the form `column op constant` (either side),
// which the flat path evaluates straight into a selection.
type cmpFilter struct {
	op string
	v  expr.Value
}

var flipCmp = map[string]string{"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

// simpleCmp recognises q's filter as `col op literal` on a column of type
// dt with a literal of the column's own kind (so that the comparison is
// exactly the one expr makes).
func (q *query) simpleCmp(dt arrow.DataType) (cmpFilter, bool) {
	b, ok := q.whereNode.(*expr.Binary)
	if !ok || flipCmp[b.Op] == "" {
		return cmpFilter{}, false
	}
	op := b.Op
	lit, ok := b.R.(*expr.Lit)
	if _, isCol := b.L.(*expr.Col); !isCol || !ok {
		lit, ok = b.L.(*expr.Lit)
		if _, isCol := b.R.(*expr.Col); !isCol || !ok {
			return cmpFilter{}, false
		}
		op = flipCmp[op]
	}
	v := lit.V
	switch dt.ID() {
	case arrow.FLOAT64:
		if v.T == expr.TFloat {
			return cmpFilter{op, v}, true
		}
	case arrow.INT64:
		if v.T == expr.TInt {
			return cmpFilter{op, v}, true
		}
	case arrow.INT32:
		if v.T == expr.TInt && v.I == int64(int32(v.I)) {
			return cmpFilter{op, v}, true
		}
	case arrow.DATE32:
		if v.T == expr.TDate && v.I == int64(int32(v.I)) {
			return cmpFilter{op, v}, true
		}
	}
	return cmpFilter{}, false
}

// selectCmp appends to sel the rows of x for which x[i] op c holds.
func selectCmp[T int32 | int64 | float64](sel []int32, op string, x []T, c T) []int32 {
	sel = sel[:0]
	switch op {
	case "=":
		for i, v := range x {
			if v == c {
				sel = append(sel, int32(i))
			}
		}
	case "!=":
		for i, v := range x {
			if v != c {
				sel = append(sel, int32(i))
			}
		}
	case "<":
		for i, v := range x {
			if v < c {
				sel = append(sel, int32(i))
			}
		}
	case "<=":
		for i, v := range x {
			if v <= c {
				sel = append(sel, int32(i))
			}
		}
	case ">":
		for i, v := range x {
			if v > c {
				sel = append(sel, int32(i))
			}
		}
	case ">=":
		for i, v := range x {
			if v >= c {
				sel = append(sel, int32(i))
			}
		}
	}
	return sel
}

// selectFlat evaluates a cmpFilter on decoded values without nulls.
func selectFlat(sel []int32, f cmpFilter, dt arrow.DataType, vals []byte) []int32 {
	switch dt.ID() {
	case arrow.FLOAT64:
		x := unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(vals))), len(vals)/8)
		return selectCmp(sel, f.op, x, f.v.F)
	case arrow.INT64:
		x := unsafe.Slice((*int64)(unsafe.Pointer(unsafe.SliceData(vals))), len(vals)/8)
		return selectCmp(sel, f.op, x, f.v.I)
	default: // int32, date32
		x := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(vals))), len(vals)/4)
		return selectCmp(sel, f.op, x, int32(f.v.I))
	}
}

// flatArray decodes the whole chunk of column col in row group rg into an
// Arrow array that owns its memory: the buffer the values were decoded
// into is handed over to the array (the scratch grows a new one), so
// nothing is copied. errDecline: not a chunk for the flat decoder.
func (pf *File) flatArray(rg, col int) (arrow.Array, error) {
	s := getScratch()
	defer putScratch(s)
	vals, valid, nulls, err := pf.decodeFlat(rg, col, s)
	if err != nil {
		return nil, err
	}
	owns := func(b []byte) bool {
		if len(vals) == 0 || cap(b) == 0 {
			return false
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(b[:1])))
		p := uintptr(unsafe.Pointer(unsafe.SliceData(vals)))
		return p >= base && p < base+uintptr(cap(b))
	}
	switch {
	case owns(s.page):
		s.page = nil
	case owns(s.vals):
		s.vals = nil
	default:
		vals = append([]byte(nil), vals...)
	}
	if nulls > 0 {
		valid = append([]byte(nil), valid...)
	}
	return viewArray(pf.Schema.Field(col).Type, int(pf.RowGroupRows(rg)), vals, valid, nulls), nil
}
