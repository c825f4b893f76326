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
func (pf *File) fastRead(rg, col int, nrows int64) (arr arrow.Array, err error) {
	g, err := pf.pqFile()
	if err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			err = corruptf(pf.Path, fmt.Errorf("row group %d column %q: decoder panic: %v", rg, pf.Schema.Field(col).Name, r))
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
	n := int(nrows)
	data := make([]byte, n*width)
	var valid []byte // allocated at the first null
	nulls := 0
	pos := 0
	pages := chunks[leaf].Pages()
	defer pages.Close()
	for {
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
			pq.Release(p)
			return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: pages hold more than %d rows", rg, pf.Schema.Field(col).Name, n))
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
				pq.Release(p)
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
					pq.Release(p)
					return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: fewer values than definition levels", rg, pf.Schema.Field(col).Name))
				}
				copy(data[(pos+i)*width:(pos+i+1)*width], raw[j*width:(j+1)*width])
				bitutil.SetBit(valid, pos+i)
				j++
			}
		}
		pos += rows
		pq.Release(p)
	}
	if pos != n {
		return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: %d rows decoded, want %d", rg, pf.Schema.Field(col).Name, pos, n))
	}
	var vb *memory.Buffer
	if nulls > 0 {
		vb = memory.NewBufferBytes(valid)
	}
	ad := array.NewData(dt, n, []*memory.Buffer{vb, memory.NewBufferBytes(data)}, nil, nulls, 0)
	defer ad.Release()
	return array.MakeFromData(ad), nil
}
