package scan

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/memory"
	pq "github.com/parquet-go/parquet-go"

	"github.com/ffkit/ffkit/scan/expr"
)

// The fast path decodes flat fixed-width columns (int32, int64, float32,
// float64, date32; required or optional) with parquet-go's page API, which
// measured here decodes with about half the CPU and a fraction of the
// garbage of arrow-go's record reader (see the scan benchmark). Its typed
// page slices are copied once into the Arrow buffers. Dictionary-encoded
// chunks, strings, decimals, timestamps and nested columns take the pqarrow
// path, which also stays the fallback whenever the fast path declines.

// sharedSpans serves prefetched byte ranges to readers of any goroutine.
type sharedSpans struct {
	mu    sync.Mutex
	spans []span // guarded by mu
	cf    *countingFile
}

func (s *sharedSpans) add(sp []span) {
	s.mu.Lock()
	s.spans = append(s.spans, sp...)
	s.mu.Unlock()
}

func (s *sharedSpans) drop(sp []span) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := s.spans[:0]
	for _, x := range s.spans {
		gone := false
		for _, y := range sp {
			if x.off == y.off && len(x.buf) == len(y.buf) && (len(x.buf) == 0 || &x.buf[0] == &y.buf[0]) {
				gone = true
			}
		}
		if !gone {
			keep = append(keep, x)
		}
	}
	s.spans = keep
}

func (s *sharedSpans) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	for _, x := range s.spans {
		if off >= x.off && off+int64(len(p)) <= x.off+int64(len(x.buf)) {
			n := copy(p, x.buf[off-x.off:])
			s.mu.Unlock()
			return n, nil
		}
	}
	s.mu.Unlock()
	return s.cf.ReadAt(p, off)
}

// fastOK reports whether top-level column col can take the fast path.
func (pf *File) fastOK(col int) bool {
	if len(pf.leaves[col]) != 1 {
		return false
	}
	switch pf.Schema.Field(col).Type.ID() {
	case arrow.INT32, arrow.INT64, arrow.FLOAT32, arrow.FLOAT64, arrow.DATE32:
	default:
		return false
	}
	d := pf.meta.Schema.Column(pf.leaves[col][0])
	return d.MaxRepetitionLevel() == 0 && d.MaxDefinitionLevel() <= 1
}

// pqFile opens the file with parquet-go once, reading through the shared
// prefetched spans.
func (pf *File) pqFile() (*pq.File, error) {
	pf.pgOnce.Do(func() {
		pf.spans = &sharedSpans{cf: &countingFile{f: pf.f, n: pf.bytesRead}}
		pf.pg, pf.pgErr = pq.OpenFile(pf.spans, pf.Size, pq.SkipPageIndex(true), pq.SkipBloomFilters(true),
			pq.ReadBufferSize(256<<10))
		if pf.pgErr != nil {
			pf.pgErr = corruptf(pf.Path, pf.pgErr)
		}
	})
	return pf.pg, pf.pgErr
}

// errDecline: the fast path does not handle this chunk.
var errDecline = errors.New("fast path declined")

// fastRead decodes column col of row group rg, or returns errDecline.
// Rows [lo, hi) are decoded; pages before lo are skipped unread when the
// chunk has an offset index.
func (pf *File) fastRead(rg, col int, lo, hi int64) (arr arrow.Array, err error) {
	g, err := pf.pqFile()
	if err != nil {
		// parquet-go refused a footer arrow-go accepted: let pqarrow read it
		return nil, errDecline
	}
	defer func() {
		if r := recover(); r != nil {
			err = pf.decodePanic(rg, col, r)
		}
	}()
	rgs := g.RowGroups()
	if rg >= len(rgs) {
		return nil, errDecline
	}
	chunks := rgs[rg].ColumnChunks()
	leaf := pf.leaves[col][0]
	if leaf >= len(chunks) {
		return nil, errDecline
	}
	dt := pf.Schema.Field(col).Type
	width := 8
	switch dt.ID() {
	case arrow.INT32, arrow.FLOAT32, arrow.DATE32:
		width = 4
	}
	n := int(hi - lo)
	var data []byte  // allocated unless a single page is adopted whole
	var valid []byte // allocated at the first null
	nulls := 0
	pos := 0
	pages := chunks[leaf].Pages()
	defer pages.Close()
	if lo > 0 {
		chunks[leaf].OffsetIndex() // loads the offset index SeekToRow uses, if there is one
		if err := pages.SeekToRow(lo); err != nil {
			return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: seek to row %d: %w", rg, pf.Schema.Field(col).Name, lo, err))
		}
	}
	for pos < n {
		p, err := pages.ReadPage()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: %w", rg, pf.Schema.Field(col).Name, err))
		}
		if p.Dictionary() != nil {
			pq.Release(p)
			return nil, errDecline
		}
		whole := p
		if int(p.NumRows()) > n-pos {
			p = p.Slice(0, int64(n-pos))
		}
		d := p.Data()
		var raw []byte
		switch dt.ID() {
		case arrow.INT64:
			v := d.Int64()
			raw = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*8)
		case arrow.FLOAT64:
			v := d.Double()
			raw = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*8)
		case arrow.INT32, arrow.DATE32:
			v := d.Int32()
			raw = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*4)
		case arrow.FLOAT32:
			v := d.Float()
			raw = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*4)
		}
		rows := int(p.NumRows())
		if pos+rows > n || len(raw)/width > rows {
			pq.Release(whole)
			return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: pages hold more than %d rows", rg, pf.Schema.Field(col).Name, n))
		}
		if pos == 0 && rows == n && p.NumNulls() == 0 && len(raw) == n*width && whole == p {
			// the whole chunk in one page without nulls (the common case for
			// DuckDB's and SmallPond's files): the page's buffer becomes the
			// Arrow buffer, not released to parquet-go's pool, not copied
			ad := array.NewData(dt, n, []*memory.Buffer{nil, memory.NewBufferBytes(raw)}, nil, 0, 0)
			defer ad.Release()
			return array.MakeFromData(ad), nil
		}
		if data == nil {
			data = make([]byte, n*width)
		}
		if p.NumNulls() == 0 && len(raw)/width == rows {
			copy(data[pos*width:], raw)
			if valid != nil {
				for i := pos; i < pos+rows; i++ {
					bitutil.SetBit(valid, i)
				}
			}
		} else {
			defs := p.DefinitionLevels()
			if len(defs) != rows {
				pq.Release(whole)
				return nil, errDecline
			}
			if valid == nil {
				valid = make([]byte, bitutil.BytesForBits(int64(n)))
				for i := 0; i < pos; i++ {
					bitutil.SetBit(valid, i)
				}
			}
			j := 0
			for i, def := range defs {
				if def == 0 {
					nulls++
					continue
				}
				if (j+1)*width > len(raw) {
					pq.Release(whole)
					return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: fewer values than definition levels", rg, pf.Schema.Field(col).Name))
				}
				copy(data[(pos+i)*width:(pos+i+1)*width], raw[j*width:(j+1)*width])
				bitutil.SetBit(valid, pos+i)
				j++
			}
		}
		pos += rows
		pq.Release(whole)
	}
	if pos != n {
		return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: %d rows decoded, want %d", rg, pf.Schema.Field(col).Name, pos, n))
	}
	if data == nil {
		data = make([]byte, n*width)
	}
	var vb *memory.Buffer
	if nulls > 0 {
		vb = memory.NewBufferBytes(valid)
	}
	ad := array.NewData(dt, n, []*memory.Buffer{vb, memory.NewBufferBytes(data)}, nil, nulls, 0)
	defer ad.Release()
	return array.MakeFromData(ad), nil
}

// pageRanges returns the row ranges of row group rg that may hold rows the
// predicate keeps, judged page by page from the column index of col, the
// only column pred reads. ok is false when the chunk has no page index (or
// one page). skipped counts the pages ruled out.
func (pf *File) pageRanges(rg, col int, pred expr.Node) (ranges [][2]int64, pages, skipped int, ok bool) {
	if !pf.fastOK(col) {
		return nil, 0, 0, false
	}
	g, err := pf.pqFile()
	if err != nil || rg >= len(g.RowGroups()) {
		return nil, 0, 0, false
	}
	chunk := g.RowGroups()[rg].ColumnChunks()[pf.leaves[col][0]]
	ci, err1 := chunk.ColumnIndex()
	oi, err2 := chunk.OffsetIndex()
	if err1 != nil || err2 != nil || ci.NumPages() <= 1 || ci.NumPages() != oi.NumPages() {
		return nil, 0, 0, false
	}
	nrows := pf.RowGroupRows(rg)
	kind := expr.TInt
	switch pf.Schema.Field(col).Type.ID() {
	case arrow.FLOAT32, arrow.FLOAT64:
		kind = expr.TFloat
	case arrow.DATE32:
		kind = expr.TDate
	}
	val := func(v pq.Value) expr.Value {
		switch pf.Schema.Field(col).Type.ID() {
		case arrow.FLOAT32:
			return expr.Value{T: kind, F: float64(v.Float())}
		case arrow.FLOAT64:
			return expr.Value{T: kind, F: v.Double()}
		case arrow.INT64:
			return expr.Value{T: kind, I: v.Int64()}
		}
		return expr.Value{T: kind, I: int64(v.Int32())}
	}
	pages = ci.NumPages()
	for k := 0; k < pages; k++ {
		first := oi.FirstRowIndex(k)
		last := nrows
		if k+1 < pages {
			last = oi.FirstRowIndex(k + 1)
		}
		if first < 0 || last > nrows || first > last {
			return nil, 0, 0, false
		}
		st := expr.Stats{Rows: last - first, HasNullCount: true, NullCount: ci.NullCount(k)}
		if ci.NullPage(k) {
			st.NullCount = st.Rows
		} else {
			st.Min, st.Max, st.HasMinMax = val(ci.MinValue(k)), val(ci.MaxValue(k)), true
		}
		keep := expr.MayMatch(pred, func(string) (expr.Stats, bool) { return st, true })
		if !keep {
			skipped++
			continue
		}
		if n := len(ranges); n > 0 && ranges[n-1][1] == first {
			ranges[n-1][1] = last
		} else {
			ranges = append(ranges, [2]int64{first, last})
		}
	}
	return ranges, pages, skipped, true
}
