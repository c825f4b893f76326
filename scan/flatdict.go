package scan

import (
	"encoding/binary"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/parquet-go/parquet-go/encoding/rle"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// dictArray reads a flat string or binary column chunk whose data pages
// are all dictionary-encoded as an Arrow dictionary array (int32 indices
// into the chunk's dictionary), the type pqarrow returns when asked for a
// dictionary: the indices are unpacked with parquet-go's bit unpacker and
// the dictionary page is parsed once, no string is copied per row. Filters
// and group keys on strings read their columns this way. errDecline: the
// chunk is not for this reader (a data page fell back to PLAIN, another
// codec, a nested or large column).
func (pf *File) dictArray(rg, col int) (arr arrow.Array, err error) {
	defer faultPanics()()
	defer func() {
		if r := recover(); r != nil {
			err = pf.decodePanic(rg, col, r)
		}
	}()
	if len(pf.leaves[col]) != 1 {
		return nil, errDecline
	}
	vt := pf.Schema.Field(col).Type
	switch vt.ID() {
	case arrow.STRING, arrow.BINARY:
	default:
		return nil, errDecline
	}
	leaf := pf.leaves[col][0]
	d := pf.meta.Schema.Column(leaf)
	if d.MaxRepetitionLevel() != 0 || d.MaxDefinitionLevel() > 1 || d.PhysicalType() != parquet.Types.ByteArray {
		return nil, errDecline
	}
	maxDef := d.MaxDefinitionLevel()
	cc, err := pf.meta.RowGroup(rg).ColumnChunk(leaf)
	if err != nil {
		return nil, corruptf(pf.Path, err)
	}
	codec := cc.Compression()
	if !flatCodec(codec) {
		return nil, errDecline
	}
	name := pf.Schema.Field(col).Name
	bad := badf(func(format string, a ...any) error {
		return corruptf(pf.Path, fmt.Errorf("row group %d column %q: %s", rg, name, fmt.Sprintf(format, a...)))
	})
	s := getScratch()
	defer putScratch(s)
	start, end := chunkRange(cc)
	chunk, err := pf.chunkBytes(start, end, &s.raw)
	if err != nil {
		return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: %w", rg, name, err))
	}
	defer pf.dropChunk(start, end)
	rows := int(pf.RowGroupRows(rg))
	idx := make([]int32, rows)
	var valid []byte
	nulls := 0
	var dict arrow.Array
	defer func() {
		if dict != nil {
			dict.Release()
		}
	}()
	nd := 0
	raw := chunk
	pos := 0
	var proto thrift.CompactProtocol
	for len(raw) > 0 && pos < rows {
		h, body, rest, err := nextPage(&proto, chunk, raw, bad)
		if err != nil {
			return nil, err
		}
		raw = rest
		switch h.Type {
		case format.DictionaryPage:
			dh := h.DictionaryPageHeader.V
			if !h.DictionaryPageHeader.Valid || dict != nil || (dh.Encoding != format.Plain && dh.Encoding != format.PlainDictionary) {
				return nil, errDecline
			}
			p, err := s.inflate(codec, body, int(h.UncompressedPageSize), "dictionary page", bad)
			if err != nil {
				return nil, err
			}
			nd = int(dh.NumValues)
			if nd < 0 || nd > len(p)/4 {
				return nil, bad("dictionary of %d values in %d bytes", nd, len(p))
			}
			offs := make([]int32, nd+1)
			vals := make([]byte, 0, len(p)-4*nd)
			q := p
			for k := 0; k < nd; k++ {
				if len(q) < 4 {
					return nil, bad("dictionary value %d truncated", k)
				}
				l := int(binary.LittleEndian.Uint32(q))
				if l < 0 || 4+l > len(q) {
					return nil, bad("dictionary value %d of %d bytes overruns the page", k, l)
				}
				vals = append(vals, q[4:4+l]...)
				offs[k+1] = int32(len(vals))
				q = q[4+l:]
			}
			ob := memory.NewBufferBytes(arrow.Int32Traits.CastToBytes(offs))
			ad := array.NewData(vt, nd, []*memory.Buffer{nil, ob, memory.NewBufferBytes(vals)}, nil, 0, 0)
			dict = array.MakeFromData(ad)
			ad.Release()
			continue
		case format.DataPage, format.DataPageV2:
		default:
			continue // index pages and the like
		}
		n, enc, levels, data, err := s.dataPage(codec, &h, body, maxDef, bad)
		if err != nil {
			return nil, err
		}
		if enc != format.PlainDictionary && enc != format.RLEDictionary {
			return nil, errDecline
		}
		if dict == nil {
			return nil, bad("dictionary-encoded page without a dictionary page")
		}
		if n < 0 || pos+n > rows {
			return nil, bad("pages hold more than %d rows", rows)
		}
		present := n
		if levels != nil {
			lv, err := (&rle.Encoding{BitWidth: 1}).DecodeLevels(s.levels, levels)
			if err != nil {
				return nil, bad("definition levels: %v", err)
			}
			s.levels = lv
			if len(lv) < n {
				return nil, bad("%d definition levels for %d values", len(lv), n)
			}
			present = 0
			for _, l := range lv[:n] {
				present += int(l & 1)
			}
		}
		if len(data) < 1 || data[0] > 32 {
			return nil, bad("bad dictionary index width")
		}
		ix, err := (&rle.Encoding{BitWidth: int(data[0])}).DecodeInt32(s.idx[:0], data[1:])
		if err != nil {
			return nil, bad("dictionary indices: %v", err)
		}
		s.idx = ix
		if len(ix) < present {
			return nil, bad("%d dictionary indices for %d values", len(ix), present)
		}
		ix = ix[:present]
		for _, i := range ix {
			if uint32(i) >= uint32(nd) {
				return nil, bad("dictionary index %d of a %d-value dictionary", i, nd)
			}
		}
		if present == n {
			copy(idx[pos:], ix)
		} else {
			if valid == nil {
				valid = make([]byte, bitutil.BytesForBits(int64(rows)))
				bitutil.SetBitsTo(valid, 0, int64(pos), true)
			}
			j := 0
			for k, l := range s.levels[:n] {
				if l&1 == 0 {
					nulls++
					continue
				}
				idx[pos+k] = ix[j]
				bitutil.SetBit(valid, pos+k)
				j++
			}
		}
		if valid != nil && present == n {
			bitutil.SetBitsTo(valid, int64(pos), int64(n), true)
		}
		pos += n
	}
	if pos != rows {
		return nil, bad("%d rows decoded, want %d", pos, rows)
	}
	if dict == nil { // no data pages: an empty row group
		return nil, errDecline
	}
	var vb *memory.Buffer
	if nulls > 0 {
		vb = memory.NewBufferBytes(valid)
	}
	ia := array.NewData(arrow.PrimitiveTypes.Int32, rows, []*memory.Buffer{vb, memory.NewBufferBytes(arrow.Int32Traits.CastToBytes(idx))}, nil, nulls, 0)
	defer ia.Release()
	indices := array.MakeFromData(ia)
	defer indices.Release()
	dt := &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int32, ValueType: vt}
	return array.NewDictionaryArray(dt, indices, dict), nil
}
