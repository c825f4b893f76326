package scan

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Dictionary pass-through. A string column read as an Arrow dictionary
// (the file's dictionary page and int32 indices, see dictArray) reaches a
// Parquet sink still encoded: the sink hands the indices to pqarrow's
// direct dictionary write instead of decoding every string for the
// encoder to hash it again. Files hold the same values, statistics and
// Arrow schema (the plain string type) as a decoded write.
//
// pqarrow keeps one dictionary per column chunk (row group): the first
// dictionary written is kept, and a later batch with another dictionary
// would make it fall back to PLAIN. So the sink translates each batch's
// indices into the row group's first dictionary (the input's row groups
// usually share their values, in another order); a batch holding a value
// that dictionary lacks is written decoded (pqarrow hashes it into the
// same column chunk's dictionary, as for any plain batch), and so is every
// batch of a row group whose first write was decoded.

// plainSchema is sc with dictionary fields replaced by their value type.
func plainSchema(sc *arrow.Schema) *arrow.Schema {
	var fields []arrow.Field
	for i, f := range sc.Fields() {
		if dt, ok := f.Type.(*arrow.DictionaryType); ok {
			if fields == nil {
				fields = append([]arrow.Field(nil), sc.Fields()...)
			}
			fields[i].Type = dt.ValueType
		}
	}
	if fields == nil {
		return sc
	}
	md := sc.Metadata()
	return arrow.NewSchema(fields, &md)
}

// hasDict reports whether any column of rec is a dictionary array.
func hasDict(rec arrow.RecordBatch) bool {
	for _, c := range rec.Columns() {
		if c.DataType().ID() == arrow.DICTIONARY {
			return true
		}
	}
	return false
}

// undictRecord decodes the dictionary columns of rec into plain arrays of
// sc's types (sc: plainSchema of rec's). The result is a new reference.
func undictRecord(rec arrow.RecordBatch, sc *arrow.Schema) (arrow.RecordBatch, error) {
	cols := make([]arrow.Array, rec.NumCols())
	defer func() {
		for _, c := range cols {
			if c != nil {
				c.Release()
			}
		}
	}()
	for i, c := range rec.Columns() {
		if d, ok := c.(*array.Dictionary); ok {
			p, err := undict(d, sc.Field(i).Type)
			if err != nil {
				return nil, fmt.Errorf("scan: decode dictionary column %s: %w", sc.Field(i).Name, err)
			}
			cols[i] = p
			continue
		}
		c.Retain()
		cols[i] = c
	}
	return array.NewRecordBatch(sc, cols, rec.NumRows()), nil
}

// relabeled is a batch that reports another schema than its columns'
// types: dictionary columns under their plain type, which pqarrow's
// FileWriter checks the batch against while it writes each column by the
// array's own type.
type relabeled struct {
	arrow.RecordBatch
	sc *arrow.Schema
}

func (r relabeled) Schema() *arrow.Schema { return r.sc }

// dictColumn is a sink's state for one column in the current row group.
type dictColumn struct {
	dict  arrow.ArrayData  // the dictionary pqarrow holds (nil: none yet)
	dense bool             // the row group's first write was decoded
	memo  map[string]int32 // dict's values -> index (built on first need)
}

func (c *dictColumn) reset() {
	if c.dict != nil {
		c.dict.Release()
	}
	*c = dictColumn{}
}

// dictWriter conforms batches for one Parquet sink.
type dictWriter struct {
	cols []dictColumn
	rg   int // the row group cols describes; the sink counts its row groups
}

func (w *dictWriter) release() {
	for i := range w.cols {
		w.cols[i].reset()
	}
}

// conform returns rec's columns as they go to pqarrow for row group rg
// (owned by the caller: release them).
func (w *dictWriter) conform(rec arrow.RecordBatch, rg int, sc *arrow.Schema) ([]arrow.Array, error) {
	if w.cols == nil {
		w.cols = make([]dictColumn, rec.NumCols())
	}
	if rg != w.rg {
		w.release()
		w.rg = rg
	}
	out := make([]arrow.Array, rec.NumCols())
	for i, c := range rec.Columns() {
		a, err := w.cols[i].conform(c, sc.Field(i).Type)
		if err != nil {
			for _, o := range out[:i] {
				o.Release()
			}
			return nil, fmt.Errorf("scan: column %s: %w", sc.Field(i).Name, err)
		}
		out[i] = a
	}
	return out, nil
}

func (c *dictColumn) conform(a arrow.Array, plain arrow.DataType) (arrow.Array, error) {
	d, ok := a.(*array.Dictionary)
	if !ok || d.Indices().DataType().ID() != arrow.INT32 {
		if ok {
			return undict(d, plain)
		}
		if c.dict == nil {
			c.dense = true
		}
		a.Retain()
		return a, nil
	}
	if c.dense {
		return undict(d, plain)
	}
	if c.dict == nil {
		c.dict = d.Data().Dictionary()
		c.dict.Retain()
		d.Retain()
		return d, nil
	}
	// a new array object over the kept dictionary: pqarrow then compares
	// it by value and computes the page statistics from the referenced
	// values only, as for the first batch
	dict := array.MakeFromData(c.dict)
	defer dict.Release()
	ix := d.Indices().(*array.Int32)
	if d.Data().Dictionary() == c.dict {
		return array.NewDictionaryArray(d.DataType(), ix, dict), nil
	}
	if c.memo == nil {
		vals, ok := dict.(interface {
			Len() int
			Value(int) string
		})
		if !ok {
			return undict(d, plain)
		}
		c.memo = make(map[string]int32, vals.Len())
		for k := 0; k < vals.Len(); k++ {
			if _, dup := c.memo[vals.Value(k)]; !dup {
				c.memo[vals.Value(k)] = int32(k)
			}
		}
	}
	src, ok := d.Dictionary().(interface{ Value(int) string })
	if !ok {
		return undict(d, plain)
	}
	// remap[j]: index in the kept dictionary of the batch's entry j
	// (-1: not looked up yet), looked up only for entries the rows use
	remap := make([]int32, d.Dictionary().Len())
	for j := range remap {
		remap[j] = -1
	}
	in := ix.Int32Values()
	outIx := make([]int32, len(in))
	for r, j := range in {
		if ix.IsNull(r) {
			continue
		}
		k := remap[j]
		if k < 0 {
			var found bool
			k, found = c.memo[src.Value(int(j))]
			if !found {
				return undict(d, plain) // a value the kept dictionary lacks
			}
			remap[j] = k
		}
		outIx[r] = k
	}
	var valid *memory.Buffer
	if ix.NullN() > 0 {
		valid, _ = takeValidityBuffer(ix)
	}
	idata := array.NewData(arrow.PrimitiveTypes.Int32, len(in),
		[]*memory.Buffer{valid, memory.NewBufferBytes(arrow.Int32Traits.CastToBytes(outIx))}, nil, ix.NullN(), 0)
	defer idata.Release()
	indices := array.MakeFromData(idata)
	defer indices.Release()
	return array.NewDictionaryArray(d.DataType(), indices, dict), nil
}

// takeValidityBuffer copies a's validity bits to a buffer starting at bit 0.
func takeValidityBuffer(a arrow.Array) (*memory.Buffer, int) {
	idx := make([]int32, a.Len())
	for i := range idx {
		idx[i] = int32(i)
	}
	bits, nulls := takeValidity(a.Data(), idx)
	return memory.NewBufferBytes(bits), nulls
}

// writeParquetDict writes rec into a sink whose schema has dictionary
// columns, cutting row groups at the row limit itself (so that every
// write lands in one row group, whose dictionaries dicts tracks) and at
// the byte cap.
func (s *fileSink) writeParquetDict(rec arrow.RecordBatch) error {
	for off := int64(0); off < rec.NumRows(); {
		cur, err := s.pq.RowGroupNumRows()
		if err != nil {
			return err
		}
		if int64(cur) >= s.rgRowLimit {
			if err := s.newRowGroup(); err != nil {
				return err
			}
			cur = 0
		}
		n := min(rec.NumRows()-off, s.rgRowLimit-int64(cur))
		part := rec.NewSlice(off, off+n)
		cols, err := s.dicts.conform(part, s.rgSeq, s.schema)
		if err != nil {
			part.Release()
			return err
		}
		b := array.NewRecordBatch(schemaOf(part, cols), cols, n)
		for _, c := range cols {
			c.Release()
		}
		err = s.pq.WriteBuffered(relabeled{b, s.schema})
		b.Release()
		s.rgBytes += recordBytes(part)
		part.Release()
		if err != nil {
			return fmt.Errorf("scan: write %s: %w", s.base, err)
		}
		off += n
		if s.rgBytes > s.maxRG {
			if err := s.newRowGroup(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *fileSink) newRowGroup() error {
	s.rgBytes, s.rgRows = 0, 0
	s.rgSeq++
	return s.pq.NewBufferedRowGroupChecked()
}

// schemaOf is rec's schema with the types of cols.
func schemaOf(rec arrow.RecordBatch, cols []arrow.Array) *arrow.Schema {
	fields := append([]arrow.Field(nil), rec.Schema().Fields()...)
	for i, c := range cols {
		fields[i].Type = c.DataType()
	}
	return arrow.NewSchema(fields, nil)
}
