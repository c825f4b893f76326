package scan

import (
	"context"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/compute"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// takeRows gathers rows idx of every column of rec into a new batch: a
// plain copy loop for fixed-width columns (4 or 8 bytes: ints, floats,
// dates, timestamps), string/binary columns and the indices of dictionary
// columns (which keep their dictionary), compute.Take for the rest.
// idx values must be in [0, rec.NumRows()).
func takeRows(ctx context.Context, rec arrow.RecordBatch, idx []int32) (arrow.RecordBatch, error) {
	cols := make([]arrow.Array, rec.NumCols())
	release := func() {
		for _, c := range cols {
			if c != nil {
				c.Release()
			}
		}
	}
	var idxArr arrow.Array
	defer func() {
		if idxArr != nil {
			idxArr.Release()
		}
	}()
	for i, c := range rec.Columns() {
		if a := takeFast(c, idx); a != nil {
			cols[i] = a
			continue
		}
		if idxArr == nil {
			b := array.NewInt32Builder(memory.DefaultAllocator)
			b.AppendValues(idx, nil)
			idxArr = b.NewArray()
			b.Release()
		}
		a, err := compute.TakeArray(ctx, c, idxArr)
		if err != nil {
			release()
			return nil, err
		}
		cols[i] = a
	}
	out := array.NewRecordBatch(rec.Schema(), cols, int64(len(idx)))
	release()
	return out, nil
}

// takeValidity gathers the validity bits of rows idx (nil: no nulls).
func takeValidity(d arrow.ArrayData, idx []int32) ([]byte, int) {
	if d.NullN() == 0 || len(d.Buffers()) == 0 || d.Buffers()[0] == nil {
		return nil, 0
	}
	in, off := d.Buffers()[0].Bytes(), d.Offset()
	out := make([]byte, bitutil.BytesForBits(int64(len(idx))))
	nulls := 0
	for k, i := range idx {
		if bitutil.BitIsSet(in, off+int(i)) {
			bitutil.SetBit(out, k)
		} else {
			nulls++
		}
	}
	return out, nulls
}

// takeFast is takeRows for one column, or nil when it has no fast path.
func takeFast(c arrow.Array, idx []int32) arrow.Array {
	d := c.Data()
	n := len(idx)
	switch c.DataType().ID() {
	case arrow.INT32, arrow.UINT32, arrow.FLOAT32, arrow.DATE32, arrow.TIME32,
		arrow.INT64, arrow.UINT64, arrow.FLOAT64, arrow.DATE64, arrow.TIME64, arrow.TIMESTAMP, arrow.DURATION:
		width := c.DataType().(arrow.FixedWidthDataType).BitWidth() / 8
		vals := d.Buffers()[1].Bytes()
		out := make([]byte, n*width)
		if width == 8 {
			src := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(vals))), len(vals)/8)[d.Offset():]
			dst := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(out))), n)
			for k, i := range idx {
				dst[k] = src[i]
			}
		} else {
			src := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(vals))), len(vals)/4)[d.Offset():]
			dst := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(out))), n)
			for k, i := range idx {
				dst[k] = src[i]
			}
		}
		valid, nulls := takeValidity(d, idx)
		var vb *memory.Buffer
		if nulls > 0 {
			vb = memory.NewBufferBytes(valid)
		}
		ad := array.NewData(c.DataType(), n, []*memory.Buffer{vb, memory.NewBufferBytes(out)}, nil, nulls, 0)
		defer ad.Release()
		return array.MakeFromData(ad)
	case arrow.DICTIONARY:
		// the indices are gathered, the dictionary is shared
		da := c.(*array.Dictionary)
		if da.DataType().(*arrow.DictionaryType).IndexType.ID() != arrow.INT32 {
			return nil
		}
		ix := takeFast(da.Indices(), idx)
		if ix == nil {
			return nil
		}
		defer ix.Release()
		return array.NewDictionaryArray(c.DataType(), ix, da.Dictionary())
	case arrow.STRING, arrow.BINARY:
		if d.Buffers()[1] == nil || d.Buffers()[1].Len() < 4*(d.Len()+d.Offset()+1) {
			return nil
		}
		offs := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(d.Buffers()[1].Bytes()))), d.Len()+d.Offset()+1)[d.Offset():]
		var data []byte
		if len(d.Buffers()) > 2 && d.Buffers()[2] != nil {
			data = d.Buffers()[2].Bytes()
		}
		total := 0
		for _, i := range idx {
			total += int(offs[i+1] - offs[i])
		}
		if total > 1<<31-1 {
			return nil // large: compute.Take reports the overflow
		}
		outOffs := make([]int32, n+1)
		outData := make([]byte, total)
		pos := int32(0)
		for k, i := range idx {
			lo, hi := offs[i], offs[i+1]
			copy(outData[pos:], data[lo:hi])
			pos += hi - lo
			outOffs[k+1] = pos
		}
		valid, nulls := takeValidity(d, idx)
		var vb *memory.Buffer
		if nulls > 0 {
			vb = memory.NewBufferBytes(valid)
		}
		ob := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(outOffs))), 4*(n+1))
		ad := array.NewData(c.DataType(), n, []*memory.Buffer{vb, memory.NewBufferBytes(ob), memory.NewBufferBytes(outData)}, nil, nulls, 0)
		defer ad.Release()
		return array.MakeFromData(ad)
	}
	return nil
}
