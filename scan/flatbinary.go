package scan

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/parquet-go/parquet-go/encoding/rle"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// The flat binary decoder reads a whole BYTE_ARRAY chunk (binary or
// string; required or optional; PLAIN or dictionary encoded, or both, as
// when a writer's dictionary overflows; data pages v1 or v2; uncompressed,
// snappy, gzip or zstd) straight into an Arrow array's
// offsets and data, sized from the page lengths: no builder that grows
// by copying, one copy of each value. Shuffle files and the GraySort
// input (random keys and payloads, written without a dictionary) are
// such chunks. Another encoding or a codec the flat decoder lacks
// declines (errDecline) to arrow-go's reader. Uncompressed pages are read
// in place from the mapped file (under faultPanics), not copied first.

// binaryOK reports whether top-level column col may be read by binaryArray.
func (pf *File) binaryOK(col int) bool {
	if len(pf.leaves[col]) != 1 {
		return false
	}
	switch pf.Schema.Field(col).Type.ID() {
	case arrow.BINARY, arrow.STRING:
	default:
		return false
	}
	d := pf.meta.Schema.Column(pf.leaves[col][0])
	return d.PhysicalType() == parquet.Types.ByteArray && d.MaxRepetitionLevel() == 0 && d.MaxDefinitionLevel() <= 1
}

// binaryArray decodes the whole chunk of binary or string column col in
// row group rg into a new array (its buffers are the caller's).
func (pf *File) binaryArray(rg, col int) (arr arrow.Array, err error) {
	if !pf.binaryOK(col) {
		return nil, errDecline
	}
	defer faultPanics()()
	defer func() {
		if r := recover(); r != nil {
			err = pf.decodePanic(rg, col, r)
		}
	}()
	leaf := pf.leaves[col][0]
	maxDef := pf.meta.Schema.Column(leaf).MaxDefinitionLevel()
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
	s.inPlace = true
	defer func() { s.inPlace = false; putScratch(s) }()
	start, end := chunkRange(cc)
	chunk, err := pf.chunkBytes(start, end, &s.raw)
	if err != nil {
		return nil, corruptf(pf.Path, fmt.Errorf("row group %d column %q: %w", rg, name, err))
	}
	defer pf.dropChunk(start, end)
	rows := int(pf.RowGroupRows(rg))
	offs := make([]int32, rows+1)
	var data []byte
	if u := cc.TotalUncompressedSize() - 4*int64(rows); u > 0 && u < 1<<31 {
		data = make([]byte, 0, u) // the values and page headers: an upper bound
	}
	var valid []byte
	nulls := 0
	raw := chunk
	pos := 0 // rows decoded
	var proto thrift.CompactProtocol
	haveDict := false
	var dictEnds []int32
	for len(raw) > 0 && pos < rows {
		h, body, rest, err := nextPage(&proto, chunk, raw, bad)
		if err != nil {
			return nil, err
		}
		raw = rest
		switch h.Type {
		case format.DictionaryPage:
			dh := h.DictionaryPageHeader.V
			if !h.DictionaryPageHeader.Valid || (dh.Encoding != format.Plain && dh.Encoding != format.PlainDictionary) {
				return nil, errDecline
			}
			p, err := s.inflate(codec, body, int(h.UncompressedPageSize), "dictionary page", bad)
			if err != nil {
				return nil, err
			}
			// the dictionary's values end to end (s.dict), and where each
			// ends (dictEnds)
			nd := int(dh.NumValues)
			if nd < 0 || nd > len(p)/4 {
				return nil, bad("dictionary of %d values in %d bytes", nd, len(p))
			}
			s.dict, dictEnds = s.dict[:0], dictEnds[:0]
			at := 0
			for i := 0; i < nd; i++ {
				if len(p)-at < 4 {
					return nil, bad("dictionary value %d runs past its page", i)
				}
				l := int(binary.LittleEndian.Uint32(p[at:]))
				if l < 0 || l > len(p)-at-4 {
					return nil, bad("dictionary value %d of %d bytes runs past its page", i, l)
				}
				s.dict = append(s.dict, p[at+4:at+4+l]...)
				dictEnds = append(dictEnds, int32(len(s.dict)))
				at += 4 + l
			}
			haveDict = true
			continue
		case format.DataPage, format.DataPageV2:
		default:
			continue // index pages and the like
		}
		n, enc, levels, page, err := s.dataPage(codec, &h, body, maxDef, bad)
		if err != nil {
			return nil, err
		}
		if n < 0 || pos+n > rows {
			return nil, bad("pages hold more than %d rows", rows)
		}
		var lv []uint8
		if levels != nil {
			if lv, err = (&rle.Encoding{BitWidth: 1}).DecodeLevels(s.levels, levels); err != nil {
				return nil, bad("definition levels: %v", err)
			}
			s.levels = lv
			if len(lv) < n {
				return nil, bad("%d definition levels for %d values", len(lv), n)
			}
			lv = lv[:n]
		}
		present := n
		if lv != nil {
			present = 0
			for _, l := range lv {
				present += int(l & 1)
			}
		}
		var idx []int32 // dictionary indices of the page's values
		switch enc {
		case format.Plain:
		case format.PlainDictionary, format.RLEDictionary:
			if !haveDict {
				return nil, bad("dictionary-encoded page without a dictionary page")
			}
			if len(page) < 1 || page[0] > 32 {
				return nil, bad("bad dictionary index width")
			}
			if idx, err = (&rle.Encoding{BitWidth: int(page[0])}).DecodeInt32(s.idx[:0], page[1:]); err != nil {
				return nil, bad("dictionary indices: %v", err)
			}
			s.idx = idx
			if len(idx) < present {
				return nil, bad("%d dictionary indices for %d values", len(idx), present)
			}
			idx = idx[:present]
			for _, i := range idx {
				if uint32(i) >= uint32(len(dictEnds)) {
					return nil, bad("dictionary index %d of a %d-value dictionary", i, len(dictEnds))
				}
			}
		default:
			return nil, errDecline
		}
		room := len(page) // what the page's values may add to data
		if idx != nil {
			room = 0
			for _, i := range idx {
				room += int(dictEnds[i])
				if i > 0 {
					room -= int(dictEnds[i-1])
				}
			}
		}
		if cap(data)-len(data) < room {
			data = append(make([]byte, 0, max(2*cap(data), len(data)+room)), data...)
		}
		at := 0 // read position in page, or in idx
		for i := 0; i < n; i++ {
			row := pos + i
			if lv != nil && lv[i]&1 == 0 {
				if valid == nil {
					valid = make([]byte, bitutil.BytesForBits(int64(rows)))
					bitutil.SetBitsTo(valid, 0, int64(rows), true)
				}
				bitutil.ClearBit(valid, row)
				nulls++
				offs[row+1] = offs[row]
				continue
			}
			if idx != nil {
				lo := int32(0)
				if k := idx[at]; k > 0 {
					lo = dictEnds[k-1]
				}
				data = append(data, s.dict[lo:dictEnds[idx[at]]]...)
				at++
			} else {
				if len(page)-at < 4 {
					return nil, bad("value %d of a page runs past its %d bytes", i, len(page))
				}
				l := int(binary.LittleEndian.Uint32(page[at:]))
				if l < 0 || l > len(page)-at-4 {
					return nil, bad("value %d of %d bytes runs past its page", i, l)
				}
				data = append(data, page[at+4:at+4+l]...)
				at += 4 + l
			}
			if len(data) > 1<<31-1 {
				return nil, errDecline // large: arrow-go reports it
			}
			offs[row+1] = int32(len(data))
		}
		pos += n
	}
	if pos != rows {
		return nil, bad("%d rows decoded, want %d", pos, rows)
	}
	if data == nil {
		data = []byte{}
	}
	ob := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(offs))), 4*len(offs))
	var vb *memory.Buffer
	if nulls > 0 {
		vb = memory.NewBufferBytes(valid)
	}
	ad := array.NewData(pf.Schema.Field(col).Type, rows, []*memory.Buffer{vb, memory.NewBufferBytes(ob), memory.NewBufferBytes(data)}, nil, nulls, 0)
	defer ad.Release()
	return array.MakeFromData(ad), nil
}
