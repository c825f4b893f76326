package scan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	pq "github.com/parquet-go/parquet-go"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/errkind"
	"github.com/ffkit/ffkit/scan/expr"
)

// Errors of package scan.
var (
	// ErrCorrupt: a Parquet file is truncated or malformed. The message
	// names the file.
	ErrCorrupt = errkind.New(errkind.Data, "scan: corrupt parquet file")
	// ErrSchema: input files disagree on their schema, or a column is missing.
	ErrSchema = errkind.New(errkind.Data, "scan: schema mismatch")
	// ErrUsage: the job's options make no sense.
	ErrUsage = errkind.New(errkind.Usage, "scan: bad job")
)

// CoalesceLocal makes reads of local files go through the coalescing
// prefetch too. By default only remote files (the ffkit cluster) do: there
// a row group's column chunks become a few large reads issued in parallel
// in one fs.ReadBatch, while on a local disk the page cache makes the extra
// copy cost more than it saves (each column chunk is one pread anyway).
var CoalesceLocal = false

// FastPath enables parquet-go page decoding for flat fixed-width columns
// (see fastpath.go). On by default; tests turn it off to compare.
var FastPath = true

// CoalesceGap is the largest hole between two column chunks of a row group
// that is read rather than skipped, so that neighbouring chunks become one
// large read.
const CoalesceGap = 1 << 20

// File is an open Parquet file: its footer, decoded once, and its schema as
// Arrow. A File is safe for concurrent use; each ReadRowGroup call reads
// through its own decoder.
type File struct {
	Path   string // as given by the user (a local path or a URL)
	Schema *arrow.Schema
	Rows   int64
	Size   int64

	fsys     fs.FS
	f        fs.File
	meta     *metadata.FileMetaData
	manifest *pqarrow.SchemaManifest
	// leaves[i] are the Parquet leaf columns of top-level field i.
	leaves    [][]int
	bytesRead *atomic.Int64
	// coalesce: prefetch each row group's column chunks with merged,
	// parallel reads (see CoalesceLocal)
	coalesce bool

	pgOnce sync.Once
	pg     *pq.File
	pgErr  error
	spans  *sharedSpans

	mapOnce sync.Once
	mapping []byte // the file, memory-mapped (local files; see mmap.go)

	decMu    sync.Mutex
	decoders map[string][]*decoder // idle decoders by dictionary setting; guarded by decMu
}

// decoder is a Parquet decoder over prefetched spans of the file.
type decoder struct {
	src *memReaderAt
	fr  *pqarrow.FileReader
}

func dictKeyOf(pf *File, cols []int, dict []bool) string {
	var b []byte
	for i, c := range cols {
		if i < len(dict) && dict[i] {
			b = fmt.Appendf(b, "%d,", c)
		}
	}
	return string(b)
}

func (pf *File) decoder(key string, cols []int, dict []bool) (*decoder, error) {
	pf.decMu.Lock()
	if l := pf.decoders[key]; len(l) > 0 {
		d := l[len(l)-1]
		pf.decoders[key] = l[:len(l)-1]
		pf.decMu.Unlock()
		return d, nil
	}
	pf.decMu.Unlock()
	src := &memReaderAt{cf: &countingFile{f: pf.f, n: pf.bytesRead}}
	props := parquet.NewReaderProperties(memory.DefaultAllocator)
	rdr, err := file.NewParquetReader(src, file.WithMetadata(pf.meta), file.WithReadProps(props))
	if err != nil {
		return nil, corruptf(pf.Path, err)
	}
	aprops := pqarrow.ArrowReadProperties{BatchSize: 1 << 30}
	for i, c := range cols {
		if i < len(dict) && dict[i] && len(pf.leaves[c]) == 1 {
			switch pf.Schema.Field(c).Type.ID() {
			case arrow.STRING, arrow.LARGE_STRING, arrow.BINARY, arrow.LARGE_BINARY:
				aprops.SetReadDict(pf.leaves[c][0], true)
			}
		}
	}
	fr, err := pqarrow.NewFileReader(rdr, aprops, memory.DefaultAllocator)
	if err != nil {
		return nil, corruptf(pf.Path, err)
	}
	return &decoder{src: src, fr: fr}, nil
}

func (pf *File) putDecoder(key string, d *decoder) {
	pf.decMu.Lock()
	defer pf.decMu.Unlock()
	if pf.decoders == nil {
		pf.decoders = map[string][]*decoder{}
	}
	if len(pf.decoders[key]) < 8 {
		pf.decoders[key] = append(pf.decoders[key], d)
	}
}

// countingFile counts the bytes read through it.
type countingFile struct {
	f   fs.File
	n   *atomic.Int64
	pos int64
}

func (c *countingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.f.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingFile) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		c.pos = off
	case io.SeekCurrent:
		c.pos += off
	case io.SeekEnd:
		c.pos = c.f.Size() + off
	}
	return c.pos, nil
}

func corruptf(path string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
}

// recoverCorrupt turns a panic inside the Parquet decoder (which some
// malformed inputs provoke) into an ErrCorrupt naming the file.
func recoverCorrupt(path string, err *error) {
	if r := recover(); r != nil {
		*err = corruptf(path, fmt.Errorf("decoder panic: %v", r))
	}
}

// OpenFile opens a Parquet file through the fs interface and decodes its
// footer. bytesRead, if not nil, accumulates every byte read from it.
func OpenFile(ctx context.Context, path string, bytesRead *atomic.Int64) (pf *File, err error) {
	fsys, name, err := fs.Resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	f, err := fsys.Open(ctx, name, fs.OpenOptions{})
	if err != nil {
		return nil, fmt.Errorf("scan: open %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	defer recoverCorrupt(path, &err)
	if bytesRead == nil {
		bytesRead = new(atomic.Int64)
	}
	if f.Size() < 12 {
		return nil, corruptf(path, fmt.Errorf("%d bytes is too short for a parquet file", f.Size()))
	}
	cf := &countingFile{f: f, n: bytesRead}
	rdr, err := file.NewParquetReader(cf)
	if err != nil {
		return nil, corruptf(path, err)
	}
	meta := rdr.MetaData()
	// Validate what the scan relies on before anything is read from it.
	for rg := 0; rg < meta.NumRowGroups(); rg++ {
		rgm := meta.RowGroup(rg)
		if rgm.NumRows() < 0 {
			return nil, corruptf(path, fmt.Errorf("row group %d has %d rows", rg, rgm.NumRows()))
		}
		for c := 0; c < rgm.NumColumns(); c++ {
			cc, err := rgm.ColumnChunk(c)
			if err != nil {
				return nil, corruptf(path, fmt.Errorf("row group %d column %d: %w", rg, c, err))
			}
			start, end := chunkRange(cc)
			if start < 4 || end > f.Size()-8 || end < start {
				return nil, corruptf(path, fmt.Errorf("row group %d column %q: bytes [%d, %d) lie outside the data area of a %d-byte file (truncated?)",
					rg, cc.PathInSchema().String(), start, end, f.Size()))
			}
		}
	}
	fr, err := pqarrow.NewFileReader(rdr, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		return nil, corruptf(path, err)
	}
	sc, err := fr.Schema()
	if err != nil {
		return nil, corruptf(path, err)
	}
	pf = &File{Path: path, Schema: sc, Rows: meta.NumRows, Size: f.Size(), fsys: fsys, f: f,
		coalesce: CoalesceLocal || fsys.String() != "local",
		meta:     meta, manifest: fr.Manifest, bytesRead: bytesRead}
	for i := range fr.Manifest.Fields {
		var leaves []int
		var walk func(sf *pqarrow.SchemaField)
		walk = func(sf *pqarrow.SchemaField) {
			if sf.IsLeaf() {
				leaves = append(leaves, sf.ColIndex)
			}
			for j := range sf.Children {
				walk(&sf.Children[j])
			}
		}
		walk(&fr.Manifest.Fields[i])
		pf.leaves = append(pf.leaves, leaves)
	}
	return pf, nil
}

// Close closes the file.
func (pf *File) Close() error {
	pf.unmap()
	return pf.f.Close()
}

// NumRowGroups is the number of row groups.
func (pf *File) NumRowGroups() int { return pf.meta.NumRowGroups() }

// RowGroupRows is the number of rows of row group rg.
func (pf *File) RowGroupRows(rg int) int64 { return pf.meta.RowGroup(rg).NumRows() }

// KeyValue returns the file's key-value metadata entry for key.
func (pf *File) KeyValue(key string) (string, bool) {
	kv := pf.meta.KeyValueMetadata()
	if kv == nil {
		return "", false
	}
	if v := kv.FindValue(key); v != nil {
		return *v, true
	}
	return "", false
}

func chunkRange(cc *metadata.ColumnChunkMetaData) (int64, int64) {
	start := cc.DataPageOffset()
	if cc.HasDictionaryPage() && cc.DictionaryPageOffset() > 0 && cc.DictionaryPageOffset() < start {
		start = cc.DictionaryPageOffset()
	}
	return start, start + cc.TotalCompressedSize()
}

// Stats returns the statistics of top-level column col in row group rg in
// the form the pruning code understands. ok is false when the column has
// none usable (nested, unsigned 32/64-bit, booleans, missing statistics).
func (pf *File) Stats(rg, col int) (expr.Stats, bool) {
	if col < 0 || col >= len(pf.leaves) || len(pf.leaves[col]) != 1 {
		return expr.Stats{}, false
	}
	cc, err := pf.meta.RowGroup(rg).ColumnChunk(pf.leaves[col][0])
	if err != nil {
		return expr.Stats{}, false
	}
	if set, err := cc.StatsSet(); err != nil || !set {
		return expr.Stats{}, false
	}
	st, err := cc.Statistics()
	if err != nil || st == nil {
		return expr.Stats{}, false
	}
	out := expr.Stats{Rows: pf.meta.RowGroup(rg).NumRows(), HasNullCount: st.HasNullCount(), NullCount: st.NullCount()}
	if !st.HasMinMax() {
		return out, true
	}
	dt := pf.Schema.Field(col).Type
	var lo, hi expr.Value
	ok := true
	switch s := st.(type) {
	case *metadata.Int32Statistics:
		lo, hi, ok = intStats(dt, int64(s.Min()), int64(s.Max()))
	case *metadata.Int64Statistics:
		lo, hi, ok = intStats(dt, s.Min(), s.Max())
	case *metadata.Float32Statistics:
		lo, hi = expr.Value{T: expr.TFloat, F: float64(s.Min())}, expr.Value{T: expr.TFloat, F: float64(s.Max())}
	case *metadata.Float64Statistics:
		lo, hi = expr.Value{T: expr.TFloat, F: s.Min()}, expr.Value{T: expr.TFloat, F: s.Max()}
	case *metadata.ByteArrayStatistics:
		switch dt.ID() {
		case arrow.STRING, arrow.LARGE_STRING, arrow.BINARY, arrow.LARGE_BINARY:
			lo, hi = expr.Value{T: expr.TString, S: string(s.Min())}, expr.Value{T: expr.TString, S: string(s.Max())}
		default:
			ok = false
		}
	default:
		ok = false
	}
	if ok {
		out.Min, out.Max, out.HasMinMax = lo, hi, true
	}
	return out, true
}

func intStats(dt arrow.DataType, lo, hi int64) (expr.Value, expr.Value, bool) {
	switch t := dt.(type) {
	case *arrow.Int8Type, *arrow.Int16Type, *arrow.Int32Type, *arrow.Int64Type, *arrow.Uint8Type, *arrow.Uint16Type:
		return expr.Value{T: expr.TInt, I: lo}, expr.Value{T: expr.TInt, I: hi}, true
	case *arrow.Date32Type:
		return expr.Value{T: expr.TDate, I: lo}, expr.Value{T: expr.TDate, I: hi}, true
	case *arrow.TimestampType:
		return expr.Value{T: expr.TTimestamp, I: expr.ToMicros(lo, t.Unit)}, expr.Value{T: expr.TTimestamp, I: expr.ToMicros(hi, t.Unit)}, true
	case *arrow.Decimal128Type:
		return expr.Value{T: expr.TFloat, F: decimal128.FromI64(lo).ToFloat64(t.Scale)},
			expr.Value{T: expr.TFloat, F: decimal128.FromI64(hi).ToFloat64(t.Scale)}, true
	}
	return expr.Value{}, expr.Value{}, false
}

// span is one coalesced read.
type span struct {
	off int64
	buf []byte
}

// memReaderAt serves reads from prefetched spans and falls back to the
// file for anything outside them.
type memReaderAt struct {
	spans []span
	cf    *countingFile
	pos   int64
}

func (m *memReaderAt) ReadAt(p []byte, off int64) (int, error) {
	i := sort.Search(len(m.spans), func(i int) bool { return m.spans[i].off+int64(len(m.spans[i].buf)) > off })
	if i < len(m.spans) {
		s := m.spans[i]
		if off >= s.off && off+int64(len(p)) <= s.off+int64(len(s.buf)) {
			return copy(p, s.buf[off-s.off:]), nil
		}
	}
	return m.cf.ReadAt(p, off)
}

func (m *memReaderAt) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		m.pos = off
	case io.SeekCurrent:
		m.pos += off
	case io.SeekEnd:
		m.pos = m.cf.f.Size() + off
	}
	return m.pos, nil
}

// prefetch reads the column chunks of cols in row group rg: neighbouring
// chunks (holes up to CoalesceGap) merge into one read, and all reads go
// to the storage in one ReadBatch so they run in parallel.
func (pf *File) prefetch(ctx context.Context, rg int, cols []int) ([]span, error) {
	type rng struct{ lo, hi int64 }
	var rs []rng
	rgm := pf.meta.RowGroup(rg)
	for _, c := range cols {
		for _, leaf := range pf.leaves[c] {
			cc, err := rgm.ColumnChunk(leaf)
			if err != nil {
				return nil, corruptf(pf.Path, err)
			}
			lo, hi := chunkRange(cc)
			rs = append(rs, rng{lo, hi})
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var merged []rng
	for _, r := range rs {
		if n := len(merged); n > 0 && r.lo <= merged[n-1].hi+CoalesceGap {
			if r.hi > merged[n-1].hi {
				merged[n-1].hi = r.hi
			}
			continue
		}
		merged = append(merged, r)
	}
	spans := make([]span, len(merged))
	reqs := make([]fs.ReadRequest, len(merged))
	var total int64
	for i, r := range merged {
		spans[i] = span{off: r.lo, buf: make([]byte, r.hi-r.lo)}
		reqs[i] = fs.ReadRequest{File: pf.f, Off: r.lo, Buf: spans[i].buf}
		total += r.hi - r.lo
	}
	if err := pf.fsys.ReadBatch(ctx, reqs); err != nil {
		if errors.Is(err, fs.ErrShortRead) {
			return nil, corruptf(pf.Path, err)
		}
		return nil, fmt.Errorf("scan: read %s: %w", pf.Path, err)
	}
	pf.bytesRead.Add(total)
	return spans, nil
}

// ReadRowGroup reads the top-level columns cols (schema indices) of row
// group rg into one record batch whose schema is those fields, in that
// order. The caller releases the batch.
func (pf *File) ReadRowGroup(ctx context.Context, rg int, cols []int) (rec arrow.RecordBatch, err error) {
	return pf.ReadRowGroupDict(ctx, rg, cols, nil)
}

// ReadRowGroupDict is ReadRowGroup, except that the string and binary
// columns i with dict[i] set come back as Arrow dictionary arrays, decoded
// no further than the file's dictionary pages.
func (pf *File) ReadRowGroupDict(ctx context.Context, rg int, cols []int, dict []bool) (rec arrow.RecordBatch, err error) {
	return pf.readRowGroup(ctx, rg, cols, dict, 0, -1)
}

// readRowGroup reads rows [lo, hi) (hi < 0: all) of row group rg. Columns
// on the fast path decode only the pages holding those rows.
func (pf *File) readRowGroup(ctx context.Context, rg int, cols []int, dict []bool, lo, hi int64) (rec arrow.RecordBatch, err error) {
	if rg < 0 || rg >= pf.NumRowGroups() {
		return nil, fmt.Errorf("%w: %s has no row group %d", ErrUsage, pf.Path, rg)
	}
	fields := make([]arrow.Field, len(cols))
	for i, c := range cols {
		fields[i] = pf.Schema.Field(c)
	}
	sc := arrow.NewSchema(fields, nil)
	nrows := pf.meta.RowGroup(rg).NumRows()
	if hi < 0 {
		lo, hi = 0, nrows
	}
	if lo < 0 || hi > nrows || lo > hi {
		return nil, fmt.Errorf("%w: %s row group %d has no rows [%d, %d)", ErrUsage, pf.Path, rg, lo, hi)
	}
	if len(cols) == 0 {
		return array.NewRecordBatch(sc, nil, hi-lo), nil
	}
	var spans []span
	if pf.coalesce {
		if spans, err = pf.prefetch(ctx, rg, cols); err != nil {
			return nil, err
		}
	}
	defer recoverCorrupt(pf.Path, &err)
	arrs := make([]arrow.Array, len(cols))
	defer func() {
		if err != nil {
			for _, a := range arrs {
				if a != nil {
					a.Release()
				}
			}
		}
	}()
	// flat fixed-width columns first, through the fast path
	slow := false
	if FastPath && spans != nil {
		if _, err := pf.pqFile(); err == nil {
			pf.spans.add(spans)
			defer pf.spans.drop(spans)
		}
	}
	for i, c := range cols {
		if FastPath && i < len(dict) && dict[i] && !pf.coalesce && lo == 0 && hi == nrows {
			a, err := pf.dictArray(rg, c)
			if err == nil {
				arrs[i] = a
				fields[i].Type = a.DataType()
				continue
			}
			if !errors.Is(err, errDecline) {
				return nil, err
			}
		}
		if FastPath && pf.binaryOK(c) && !(i < len(dict) && dict[i]) && !pf.coalesce && lo == 0 && hi == nrows {
			a, err := pf.binaryArray(rg, c)
			if err == nil {
				arrs[i] = a
				continue
			}
			if !errors.Is(err, errDecline) {
				return nil, err
			}
		}
		if FastPath && pf.fastOK(c) && !(i < len(dict) && dict[i]) {
			if !pf.coalesce && lo == 0 && hi == nrows {
				a, err := pf.flatArray(rg, c)
				if err == nil {
					arrs[i] = a
					continue
				}
				if !errors.Is(err, errDecline) {
					return nil, err
				}
			}
			a, err := pf.fastRead(rg, c, lo, hi)
			if err == nil {
				arrs[i] = a
				continue
			}
			if !errors.Is(err, errDecline) {
				return nil, err
			}
		}
		slow = true
	}
	if !slow {
		sc = arrow.NewSchema(fields, nil) // dictionary columns carry their type
		rec = array.NewRecordBatch(sc, arrs, hi-lo)
		for _, a := range arrs {
			a.Release()
		}
		return rec, nil
	}
	// A decoder is reused across row groups (its decompression buffers
	// with it); the column-to-dictionary setting is part of its identity.
	key := dictKeyOf(pf, cols, dict)
	dec, err := pf.decoder(key, cols, dict)
	if err != nil {
		return nil, err
	}
	dec.src.spans = spans
	defer func() {
		dec.src.spans = nil
		pf.putDecoder(key, dec)
	}()
	fr := dec.fr
	for i, c := range cols {
		if arrs[i] != nil {
			continue
		}
		ch, err := fr.RowGroup(rg).Column(c).Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: %w", rg, fields[i].Name, err))
		}
		if lo > 0 || hi < nrows {
			sl := array.NewChunkedSlice(ch, lo, hi)
			ch.Release()
			ch = sl
		}
		if len(ch.Chunks()) == 1 {
			arrs[i] = ch.Chunk(0)
			arrs[i].Retain()
		} else {
			arrs[i], err = array.Concatenate(ch.Chunks(), memory.DefaultAllocator)
			if err != nil {
				ch.Release()
				return nil, err
			}
		}
		ch.Release()
		if int64(arrs[i].Len()) != hi-lo {
			return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: %d values for %d rows", rg, fields[i].Name, arrs[i].Len(), hi-lo))
		}
		if !arrow.TypeEqual(arrs[i].DataType(), fields[i].Type) {
			// pqarrow can return e.g. a dictionary for a string column; keep the file's type.
			fields[i].Type = arrs[i].DataType()
		}
	}
	sc = arrow.NewSchema(fields, nil)
	rec = array.NewRecordBatch(sc, arrs, hi-lo)
	for _, a := range arrs {
		a.Release()
	}
	return rec, nil
}
