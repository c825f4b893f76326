package scan

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"path"
	"sort"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/csv"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/fs"
)

// Output formats.
const (
	FormatParquet  = "parquet"
	FormatFFRecord = "ffrecord"
	FormatCSV      = "csv"
	FormatJSONL    = "jsonl"
	FormatArrow    = "arrow" // Arrow IPC file format, uncompressed: memory-mappable
)

// Parquet writing defaults, as SmallPond's.
const (
	DefaultRowGroupRows  = 122880
	DefaultRowGroupBytes = 256 << 20
	zstdLevel            = 3
)

func formatExt(format string) string {
	switch format {
	case FormatParquet:
		return ".parquet"
	case FormatCSV:
		return ".csv"
	case FormatJSONL:
		return ".jsonl"
	case FormatArrow:
		return ".arrow"
	case FormatFFRecord:
		return ".ffr"
	}
	return ""
}

// sink writes the record batches of one output file (or, for FFRecord, one
// set of shards) into a staging directory.
type sink interface {
	Write(rec arrow.RecordBatch) error
	// Close commits the output and returns the names written (base names
	// inside the staging directory) and the rows.
	Close() ([]string, int64, error)
	Abort()
}

type sinkOptions struct {
	format       string
	dir          string // staging directory (user-form path)
	base         string // file name without extension
	schema       *arrow.Schema
	kv           map[string]string
	rowGroupRows int64
	// rowGroupBytes caps a buffered row group's encoded size (default
	// DefaultRowGroupBytes); shuffle producers, which hold one open writer
	// per partition, pass a share of it so their memory stays bounded.
	rowGroupBytes int64
	sampleColumn  string
	shardSize     int64
	zstdLevel     int // 0: zstdLevel
	// compression: "" or zstd, snappy, lz4 (LZ4_RAW), none
	compression string
}

func newSink(ctx context.Context, o sinkOptions) (sink, error) {
	if o.format == FormatFFRecord {
		return newFFRecordSink(ctx, o)
	}
	name := fs.Join(o.dir, o.base+formatExt(o.format))
	fsys, inner, err := fs.Resolve(ctx, name)
	if err != nil {
		return nil, err
	}
	w, err := fsys.Create(ctx, inner)
	if err != nil {
		return nil, fmt.Errorf("scan: create %s: %w", name, err)
	}
	fw := &fileSink{w: w, base: path.Base(inner), schema: plainSchema(o.schema), maxRG: o.rowGroupBytes}
	if fw.schema != o.schema && o.format == FormatParquet {
		fw.dicts = &dictWriter{}
	}
	o.schema = fw.schema
	if fw.maxRG <= 0 {
		fw.maxRG = DefaultRowGroupBytes
	}
	switch o.format {
	case FormatParquet:
		err = fw.openParquet(o)
	case FormatCSV:
		fw.csv = csv.NewWriter(writeOnly{w}, o.schema, csv.WithHeader(true), csv.WithNullWriter(""))
	case FormatJSONL:
		fw.jsonl = true
	case FormatArrow:
		fw.ipc, err = ipc.NewFileWriter(writeOnly{w}, ipc.WithSchema(o.schema))
	default:
		err = fmt.Errorf("%w: unknown output format %q", ErrUsage, o.format)
	}
	if err != nil {
		w.Close()
		return nil, err
	}
	return fw, nil
}

// writeOnly hides the fs.Writer's Close (which abandons the file) from
// encoders that close what they write to.
type writeOnly struct{ w io.Writer }

func (w writeOnly) Write(p []byte) (int, error) { return w.w.Write(p) }

type fileSink struct {
	w     fs.Writer
	base  string
	pq    *pqarrow.FileWriter
	csv   *csv.Writer
	ipc   *ipc.FileWriter
	jsonl bool
	maxRG int64 // row-group byte cap
	// rgBytes, rgRows: Arrow bytes and rows in the buffered row group
	rgBytes int64
	rgRows  int
	// schema is the output's (dictionary columns as their plain type)
	schema *arrow.Schema
	// with dictionary columns (dicts non-nil): the row-group row limit
	// and the number of row groups started, for writeParquetDict
	dicts      *dictWriter
	rgRowLimit int64
	rgSeq      int
	rows       int64
	// wrote: csv writes its header with the first batch; an empty csv still
	// gets a header at Close.
	wrote bool
}

// DeltaIntegers writes int32, int64 and date32 columns DELTA_BINARY_PACKED
// (then zstd), as Spark and parquet-mr do with v2 pages. On sorted or
// clustered integers (ids, keys, dates, counters) the deltas pack into a
// few bits, which zstd then has little left to do: on the benchmark's
// sequential keys, klauspost's zstd alone encodes plain int64 at ~100 MB/s
// (many short matches), the delta pages many times faster, at the same
// size. On random integers the packed deltas are about as large as plain
// values. DuckDB, pyarrow, Spark and parquet-go read it.
var DeltaIntegers = true

func (s *fileSink) openParquet(o sinkOptions) error {
	rg := o.rowGroupRows
	if rg <= 0 {
		rg = DefaultRowGroupRows
	}
	s.rgRowLimit = rg
	codec, level := compress.Codecs.Zstd, cmp.Or(o.zstdLevel, zstdLevel)
	switch o.compression {
	case "snappy":
		codec, level = compress.Codecs.Snappy, compress.DefaultCompressionLevel
	case "lz4":
		codec, level = compress.Codecs.Lz4Raw, compress.DefaultCompressionLevel
	case "none":
		codec, level = compress.Codecs.Uncompressed, compress.DefaultCompressionLevel
	}
	opts := []parquet.WriterProperty{
		parquet.WithCompression(codec),
		parquet.WithCompressionLevel(level),
		parquet.WithMaxRowGroupLength(rg),
		// dictionaries only for strings (below), as SmallPond: on numeric
		// columns they mostly cost hashing time before the size fallback,
		// and so on binary columns (keys, hashes, images, tensors), whose
		// values rarely repeat
		parquet.WithDictionaryDefault(false),
		parquet.WithStats(true),
		parquet.WithPageIndexEnabled(true),
		parquet.WithCreatedBy("ffkit scan"),
	}
	for _, f := range o.schema.Fields() {
		switch f.Type.ID() {
		case arrow.STRING, arrow.LARGE_STRING, arrow.DICTIONARY:
			opts = append(opts, parquet.WithDictionaryFor(f.Name, true))
		case arrow.INT32, arrow.INT64, arrow.DATE32:
			if DeltaIntegers {
				opts = append(opts, parquet.WithEncodingFor(f.Name, parquet.Encodings.DeltaBinaryPacked))
			}
		}
	}
	pw, err := pqarrow.NewFileWriter(o.schema, writeOnly{s.w}, parquet.NewWriterProperties(opts...),
		pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
	if err != nil {
		return fmt.Errorf("scan: parquet writer: %w", err)
	}
	keys := make([]string, 0, len(o.kv))
	for k := range o.kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := pw.AppendKeyValueMetadata(k, o.kv[k]); err != nil {
			return err
		}
	}
	s.pq = pw
	return nil
}

// WriteRowGroup writes rec as a row group of its own, its pages straight
// to the file (Write buffers a row group's pages in memory, in buffers
// that grow by copying). For batches of a whole row group (a sort's
// output); other sinks and dictionary columns go through Write.
func (s *fileSink) WriteRowGroup(rec arrow.RecordBatch) error {
	if s.pq == nil || s.dicts != nil || rec.NumRows() == 0 || hasDict(rec) {
		return s.Write(rec)
	}
	s.rows += rec.NumRows()
	s.wrote = true
	s.rgBytes, s.rgRows = 0, 0
	if err := s.pq.Write(rec); err != nil {
		return fmt.Errorf("scan: write %s: %w", s.base, err)
	}
	return nil
}

func (s *fileSink) Write(rec arrow.RecordBatch) error {
	if rec.NumRows() == 0 {
		return nil
	}
	s.rows += rec.NumRows()
	s.wrote = true
	if s.dicts != nil {
		return s.writeParquetDict(rec)
	}
	if hasDict(rec) {
		plain, err := undictRecord(rec, plainSchema(rec.Schema()))
		if err != nil {
			return err
		}
		defer plain.Release()
		rec = plain
	}
	switch {
	case s.pq != nil:
		if err := s.pq.WriteBuffered(rec); err != nil {
			return fmt.Errorf("scan: write %s: %w", s.base, err)
		}
		// the writer buffers a whole row group in memory: bound it by bytes
		// as well as rows (the writer's encoded-size counters only move when
		// pages flush, so count the Arrow bytes going in)
		if n, _ := s.pq.RowGroupNumRows(); n < s.rgRows {
			s.rgBytes = 0 // the writer started a row group at the row limit
		}
		s.rgBytes += recordBytes(rec)
		s.rgRows, _ = s.pq.RowGroupNumRows()
		if s.rgBytes > s.maxRG {
			s.rgBytes, s.rgRows = 0, 0
			return s.pq.NewBufferedRowGroupChecked()
		}
	case s.csv != nil:
		return s.csv.Write(rec)
	case s.ipc != nil:
		return s.ipc.Write(rec)
	case s.jsonl:
		return array.RecordToJSON(rec, s.w)
	}
	return nil
}

func (s *fileSink) Close() ([]string, int64, error) {
	if s.dicts != nil {
		defer s.dicts.release()
	}
	var err error
	switch {
	case s.pq != nil:
		err = s.pq.Close()
	case s.csv != nil:
		if !s.wrote {
			// no batch came: write the header alone
			empty := array.NewRecordBatch(s.csvSchema(), emptyColumns(s.csvSchema()), 0)
			err = s.csv.Write(empty)
			empty.Release()
		}
		if err == nil {
			s.csv.Flush()
			err = s.csv.Error()
		}
	case s.ipc != nil:
		err = s.ipc.Close()
	}
	if err != nil {
		s.w.Close()
		return nil, 0, fmt.Errorf("scan: finish %s: %w", s.base, err)
	}
	if err := s.w.Commit(); err != nil {
		return nil, 0, err
	}
	return []string{s.base}, s.rows, nil
}

func (s *fileSink) csvSchema() *arrow.Schema { return s.schema }

func (s *fileSink) Abort() {
	if s.dicts != nil {
		defer s.dicts.release()
	}
	if s.pq != nil {
		s.pq.Close()
	}
	s.w.Close()
}

func emptyColumns(sc *arrow.Schema) []arrow.Array {
	cols := make([]arrow.Array, sc.NumFields())
	for i, f := range sc.Fields() {
		b := array.NewBuilder(nil, f.Type)
		cols[i] = b.NewArray()
		b.Release()
	}
	return cols
}

// ffrecordSink packs one column's bytes per row as FFRecord samples.
type ffrecordSink struct {
	w    *ffrecord.ShardedWriter
	base string
	col  int
	rows int64
}

func newFFRecordSink(ctx context.Context, o sinkOptions) (sink, error) {
	idx := o.schema.FieldIndices(o.sampleColumn)
	if o.sampleColumn == "" || len(idx) != 1 {
		return nil, fmt.Errorf("%w: --format ffrecord needs --sample-column naming one output column (have %s)", ErrUsage, fieldNames(o.schema))
	}
	switch o.schema.Field(idx[0]).Type.ID() {
	case arrow.BINARY, arrow.LARGE_BINARY, arrow.STRING, arrow.LARGE_STRING:
	default:
		return nil, fmt.Errorf("%w: sample column %q has type %s; it must be binary or string", ErrUsage, o.sampleColumn, o.schema.Field(idx[0]).Type)
	}
	dir := fs.Join(o.dir, o.base)
	w, err := ffrecord.NewShardedWriter(ctx, dir, ffrecord.ShardOptions{TargetSize: o.shardSize, Overwrite: true})
	if err != nil {
		return nil, err
	}
	return &ffrecordSink{w: w, base: o.base, col: idx[0]}, nil
}

func sampleBytes(a arrow.Array, i int) ([]byte, bool) {
	if a.IsNull(i) {
		return nil, false
	}
	switch x := a.(type) {
	case *array.Binary:
		return x.Value(i), true
	case *array.LargeBinary:
		return x.Value(i), true
	case *array.String:
		s := x.Value(i)
		return unsafe.Slice(unsafe.StringData(s), len(s)), true
	case *array.LargeString:
		s := x.Value(i)
		return unsafe.Slice(unsafe.StringData(s), len(s)), true
	}
	return nil, false
}

func (s *ffrecordSink) Write(rec arrow.RecordBatch) error {
	col := rec.Column(s.col)
	for i := 0; i < int(rec.NumRows()); i++ {
		b, ok := sampleBytes(col, i)
		if !ok {
			return fmt.Errorf("%w: sample column has a NULL in row %d of a batch; filter it with --where '%s IS NOT NULL'", ErrUsage, i, rec.ColumnName(s.col))
		}
		if err := s.w.Write(b); err != nil {
			return err
		}
		s.rows++
	}
	return nil
}

func (s *ffrecordSink) Close() ([]string, int64, error) {
	files, err := s.w.Close()
	if err != nil {
		return nil, 0, err
	}
	// names relative to the staging directory: BASE/PART_nnnnn.ffr
	for i, f := range files {
		files[i] = s.base + "/" + path.Base(f)
	}
	return files, s.rows, nil
}

func (s *ffrecordSink) Abort() { s.w.Abort() }

func fieldNames(sc *arrow.Schema) string {
	var s string
	for i, f := range sc.Fields() {
		if i > 0 {
			s += ", "
		}
		s += f.Name
	}
	return s
}

// recordBytes estimates the in-memory size of a batch's values (for
// slices, only the rows in the slice).
func recordBytes(rec arrow.RecordBatch) int64 {
	var n int64
	rows := rec.NumRows()
	for _, c := range rec.Columns() {
		switch a := c.(type) {
		case *array.String:
			n += span32(a.ValueOffsets()) + 4*rows
		case *array.Binary:
			n += span32(a.ValueOffsets()) + 4*rows
		case *array.LargeString:
			n += span64(a.ValueOffsets()) + 8*rows
		case *array.LargeBinary:
			n += span64(a.ValueOffsets()) + 8*rows
		case *array.Dictionary:
			// the indices; the dictionary is shared by many batches
			n += 4 * rows
		default:
			if fw, ok := c.DataType().(arrow.FixedWidthDataType); ok {
				n += int64(fw.BitWidth()+7) / 8 * rows
			} else {
				n += int64(c.Data().SizeInBytes())
			}
		}
	}
	return n
}

func span32(o []int32) int64 {
	if len(o) == 0 {
		return 0
	}
	return int64(o[len(o)-1] - o[0])
}

func span64(o []int64) int64 {
	if len(o) == 0 {
		return 0
	}
	return o[len(o)-1] - o[0]
}
