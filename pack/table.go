package pack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/ffkit/ffkit/fs"
)

// table is a Parquet or Arrow file, walked once front to back: one sample
// per row, from one binary or string column or the whole row as JSON.
type table struct {
	fsys   fs.FS
	name   string
	format string
	column string
	rows   int64 // Parquet: the rows the footer declares; -1 unknown
}

func openTable(ctx context.Context, fsys fs.FS, name, format, column string) (Source, error) {
	t := &table{fsys: fsys, name: name, format: format, column: column, rows: -1}
	// Open once now so that a bad file or column fails before any output.
	err := t.batches(ctx, func(sc *arrow.Schema, col int, next func() (arrow.RecordBatch, error)) error { return nil })
	if err != nil {
		return nil, err
	}
	if format == "parquet" && column != "" { // see parquetlist.go
		if l, err := listParquet(ctx, fsys, name, column); err == nil {
			return l, nil
		} else if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if l, err := listParquetPages(ctx, fsys, name, column); err == nil { // see parquetpages.go
			return l, nil
		} else if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return t, nil
}

func (t *table) Format() string { return t.format }

// Count is the number of samples of a Parquet table, from its footer: one
// per row (Walk yields exactly that many or fails, and the writer checks
// the count again). Counting by walking decoded the whole file once more.
func (t *table) Count() (int64, bool) { return t.rows, t.rows >= 0 }
func (t *table) Close() error         { return nil }

// batches opens the table and hands fn its schema, the sample column
// (-1: whole rows) and an iterator of record batches (nil at the end).
func (t *table) batches(ctx context.Context, fn func(sc *arrow.Schema, col int, next func() (arrow.RecordBatch, error)) error) (err error) {
	f, err := t.fsys.Open(ctx, t.name, fs.OpenOptions{})
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	defer f.Close()
	defer func() { // the Arrow readers panic on some malformed input
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: malformed %s file: %v", ErrData, t.name, t.format, r)
		}
	}()
	sr := io.NewSectionReader(f, 0, f.Size())
	var sc *arrow.Schema
	var next func() (arrow.RecordBatch, error)
	var closeFn func()
	switch t.format {
	case "parquet":
		// Pages of large blobs (a writer may put a whole row group of
		// images in one page) are data, not an attack: allow up to 2 GiB.
		props := parquet.NewReaderProperties(memory.DefaultAllocator)
		props.MaxCompressedPageSize, props.MaxUncompressedPageSize = 2<<30, 2<<30
		pr, err := file.NewParquetReader(sr, file.WithReadProps(props))
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
		}
		defer pr.Close()
		t.rows = pr.NumRows()
		fr, err := pqarrow.NewFileReader(pr, pqarrow.ArrowReadProperties{BatchSize: batchRows(pr)}, memory.DefaultAllocator)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
		}
		if sc, err = fr.Schema(); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
		}
		col, err := t.columnIndex(sc)
		if err != nil {
			return err
		}
		var cols []int
		if col >= 0 { // read only the sample column's leaves
			cols = []int{fr.Manifest.Fields[col].ColIndex}
		}
		rr, err := fr.GetRecordReader(ctx, cols, nil)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
		}
		closeFn = rr.Release
		next = func() (arrow.RecordBatch, error) {
			if rr.Next() {
				return rr.RecordBatch(), nil
			}
			if err := rr.Err(); err != nil && err != io.EOF {
				return nil, fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
			}
			return nil, nil
		}
		if col >= 0 {
			col = 0 // the reader yields the projected column only
		}
		defer closeFn()
		return fn(sc, col, next)
	default: // arrow: the IPC file format (ARROW1), else the stream format
		var head [6]byte
		f.ReadAt(head[:], 0)
		if string(head[:]) == "ARROW1" {
			fr, err := ipc.NewFileReader(sr)
			if err != nil {
				return fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
			}
			defer fr.Close()
			sc = fr.Schema()
			i := 0
			next = func() (arrow.RecordBatch, error) {
				if i >= fr.NumRecords() {
					return nil, nil
				}
				rec, err := fr.RecordBatch(i)
				i++
				if err != nil {
					return nil, fmt.Errorf("%w: %s: batch %d: %w", ErrData, t.name, i-1, err)
				}
				return rec, nil
			}
		} else {
			rr, err := ipc.NewReader(sr)
			if err != nil {
				return fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
			}
			defer rr.Release()
			sc = rr.Schema()
			next = func() (arrow.RecordBatch, error) {
				if rr.Next() {
					return rr.RecordBatch(), nil
				}
				if err := rr.Err(); err != nil && err != io.EOF {
					return nil, fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
				}
				return nil, nil
			}
		}
		col, err := t.columnIndex(sc)
		if err != nil {
			return err
		}
		return fn(sc, col, next)
	}
}

// batchRows sizes record batches at about 16 MiB (from the file's
// uncompressed size per row), so that neither a table of large blobs nor
// one of short strings makes batches of extreme sizes.
func batchRows(pr *file.Reader) int64 {
	md := pr.MetaData()
	var bytes, rows int64
	for i := 0; i < md.NumRowGroups(); i++ {
		rg := md.RowGroup(i)
		bytes += rg.TotalByteSize()
		rows += rg.NumRows()
	}
	if rows <= 0 || bytes <= 0 {
		return 4096
	}
	return min(65536, max(16, (16<<20)/max(1, bytes/rows)))
}

// columnIndex finds the sample column, checking its type; -1 without one.
func (t *table) columnIndex(sc *arrow.Schema) (int, error) {
	if t.column == "" {
		return -1, nil
	}
	idx := sc.FieldIndices(t.column)
	if len(idx) != 1 {
		names := make([]string, sc.NumFields())
		for i, f := range sc.Fields() {
			names[i] = f.Name
		}
		return 0, fmt.Errorf("%w: %s has no column %q (it has %v)", ErrUsage, t.name, t.column, names)
	}
	switch sc.Field(idx[0]).Type.ID() {
	case arrow.BINARY, arrow.LARGE_BINARY, arrow.STRING, arrow.LARGE_STRING, arrow.BINARY_VIEW, arrow.STRING_VIEW:
	default:
		return 0, fmt.Errorf("%w: column %q of %s has type %s; a sample column must be binary or string", ErrUsage, t.column, t.name, sc.Field(idx[0]).Type)
	}
	return idx[0], nil
}

// valueBytes is row i of a binary or string array, without a copy.
func valueBytes(a arrow.Array, i int) []byte {
	switch x := a.(type) {
	case *array.Binary:
		return x.Value(i)
	case *array.LargeBinary:
		return x.Value(i)
	case *array.BinaryView:
		return x.Value(i)
	case *array.String:
		s := x.Value(i)
		return unsafe.Slice(unsafe.StringData(s), len(s))
	case *array.LargeString:
		s := x.Value(i)
		return unsafe.Slice(unsafe.StringData(s), len(s))
	case *array.StringView:
		s := x.Value(i)
		return unsafe.Slice(unsafe.StringData(s), len(s))
	}
	return nil
}

func (t *table) Walk(ctx context.Context, fn func(Sample, io.Reader) error) error {
	if t.format == "parquet" && t.column != "" {
		if err := t.walkParquetLeaf(ctx, fn); err != errNotLeaf {
			return err
		}
	}
	base := path.Base(t.name) + ":"
	return t.batches(ctx, func(sc *arrow.Schema, col int, next func() (arrow.RecordBatch, error)) error {
		var row int64
		var r bytes.Reader
		var js bytes.Buffer
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			rec, err := next()
			if err != nil {
				return err
			}
			if rec == nil {
				return nil
			}
			n := int(rec.NumRows())
			if col < 0 {
				js.Reset()
				if err := array.RecordToJSON(rec, &js); err != nil {
					return fmt.Errorf("pack: %s: rows %d..: %w", t.name, row, err)
				}
				lines := bytes.SplitN(js.Bytes(), []byte{'\n'}, n+1)
				for i := 0; i < n; i++ {
					r.Reset(lines[i])
					if err := fn(Sample{Name: base + strconv.FormatInt(row, 10), Size: int64(len(lines[i]))}, &r); err != nil {
						return err
					}
					row++
				}
				continue
			}
			a := rec.Column(col)
			for i := 0; i < n; i++ {
				if a.IsNull(i) {
					return fmt.Errorf("%w: %s: row %d: column %q is NULL", ErrData, t.name, row, t.column)
				}
				b := valueBytes(a, i)
				r.Reset(b)
				if err := fn(Sample{Name: base + strconv.FormatInt(row, 10), Size: int64(len(b))}, &r); err != nil {
					return err
				}
				row++
			}
		}
	})
}

// errNotLeaf: the sample column is not one flat BYTE_ARRAY leaf; Walk
// reads it through Arrow instead.
var errNotLeaf = errors.New("pack: not a flat binary leaf")

// walkParquetLeaf walks a Parquet sample column that is one flat
// BYTE_ARRAY leaf (the usual binary or string column) with the column
// chunk reader: each value is a slice of its decoded page, handed to fn
// as it is, without building Arrow arrays (which copied every value twice
// more and grew their buffers by copying again: packing a Parquet column
// was a fifth of the speed of packing WebDataset shards). Other columns
// return errNotLeaf before fn is called.
func (t *table) walkParquetLeaf(ctx context.Context, fn func(Sample, io.Reader) error) (err error) {
	f, err := t.fsys.Open(ctx, t.name, fs.OpenOptions{})
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	defer f.Close()
	defer func() { // the Parquet reader panics on some malformed input
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: malformed parquet file: %v", ErrData, t.name, r)
		}
	}()
	props := parquet.NewReaderProperties(memory.DefaultAllocator)
	props.MaxCompressedPageSize, props.MaxUncompressedPageSize = 2<<30, 2<<30
	// Stream each column chunk through a small buffer rather than reading
	// it whole (a row group of images is hundreds of MiB, freshly
	// allocated and faulted in for each row group).
	props.BufferedStreamEnabled, props.BufferSize = true, 4<<20
	pr, err := file.NewParquetReader(io.NewSectionReader(f, 0, f.Size()), file.WithReadProps(props))
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrData, t.name, err)
	}
	defer pr.Close()
	sc := pr.MetaData().Schema
	ci := sc.ColumnIndexByName(t.column)
	if ci < 0 {
		return errNotLeaf
	}
	leaf := sc.Column(ci)
	if leaf.PhysicalType() != parquet.Types.ByteArray || leaf.MaxRepetitionLevel() != 0 || leaf.Path() != t.column {
		return errNotLeaf
	}
	maxDef := leaf.MaxDefinitionLevel()
	base := path.Base(t.name) + ":"
	if k, ok := decodeAhead(pr, ci); ok { // see parquetwalk.go
		var r bytes.Reader
		return decodeRowGroups(ctx, pr, ci, t.name, t.column, maxDef, k, func(g int, row int64, v *rowGroupVals) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			start := 0
			for _, end := range v.ends {
				b := v.buf[start:end:end]
				start = end
				r.Reset(b)
				if err := fn(Sample{Name: base + strconv.FormatInt(row, 10), Size: int64(len(b))}, &r); err != nil {
					return err
				}
				row++
			}
			return nil
		})
	}
	const batch = 256
	vals := make([]parquet.ByteArray, batch)
	var defs []int16
	if maxDef > 0 {
		defs = make([]int16, batch)
	}
	var row int64
	var r bytes.Reader
	for g := 0; g < pr.NumRowGroups(); g++ {
		cr, err := pr.RowGroup(g).Column(ci)
		if err != nil {
			return fmt.Errorf("%w: %s: row group %d: %w", ErrData, t.name, g, err)
		}
		br, ok := cr.(*file.ByteArrayColumnChunkReader)
		if !ok {
			return fmt.Errorf("%w: %s: column %q: unexpected reader %T", ErrData, t.name, t.column, cr)
		}
		for br.HasNext() {
			if err := ctx.Err(); err != nil {
				return err
			}
			// Values point into the current page: used before the next call.
			total, n, err := br.ReadBatchInPage(batch, vals, defs, nil)
			if err != nil {
				return fmt.Errorf("%w: %s: row group %d: %w", ErrData, t.name, g, err)
			}
			if int64(n) != total {
				for i := range total {
					if defs[i] < maxDef {
						return fmt.Errorf("%w: %s: row %d: column %q is NULL", ErrData, t.name, row+i, t.column)
					}
				}
			}
			for _, b := range vals[:n] {
				r.Reset(b)
				if err := fn(Sample{Name: base + strconv.FormatInt(row, 10), Size: int64(len(b))}, &r); err != nil {
					return err
				}
				row++
			}
		}
	}
	return nil
}
