package pack

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"path"
	"slices"
	"strconv"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/parquet-go/parquet-go/encoding/rle"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"

	"github.com/ffkit/ffkit/fs"
)

// A Parquet sample column whose pages are stored as they are (no
// compression, PLAIN encoding: each value is a 4-byte length and its
// bytes) is listed rather than walked: one pass over the page headers and
// the value lengths finds every value's place in the file, and the source
// becomes a Listed one, whose values Pack reads with several reads at once
// straight into their place in the output, as it does a directory's files
// or WebDataset members. Walking the column instead went through the
// Parquet reader's copy of each page and the sharded writer's in-memory
// shard: two more copies of every byte, on one goroutine (0.47x of the
// disk's write speed, against 0.88x for WebDataset shards).
//
// Anything else (compressed or dictionary-encoded pages, a NULL value,
// bytes that do not add up) leaves the column to the walk, which reads
// every Parquet file and reports malformed ones precisely. Both paths give
// the same samples, so the same bytes.

// listParquetMinValue is the smallest mean value size listed: a column of
// short strings is walked, as one goroutine copies small values faster
// than workers hand them around. A variable for tests.
var listParquetMinValue int64 = 4 << 10

// errNotListable: the column is not stored so that it can be listed.
var errNotListable = errors.New("pack: parquet column not listable")

// pqColumn is an open Parquet file and a column of it that can be
// listed: flat BYTE_ARRAY (at most optional), each chunk in the file
// itself, unencrypted, with one of the codecs asked for.
type pqColumn struct {
	f           fs.File
	pr          *file.Reader
	md          *metadata.FileMetaData
	ci          int   // the column's index
	maxDef      int16 // 1 when optional
	rows, bytes int64 // rows, and the column's uncompressed bytes
}

// openPQColumn opens name and checks its column; errNotListable when the
// column is not one that can be listed (a panic of the footer reader
// counts as that). On error nothing is left open; else the caller closes
// c.pr and c.f.
func openPQColumn(ctx context.Context, fsys fs.FS, name, column string, codecs ...compress.Compression) (c pqColumn, err error) {
	f, err := fsys.Open(ctx, name, fs.OpenOptions{})
	if err != nil {
		return c, err
	}
	var pr *file.Reader
	defer func() {
		if r := recover(); r != nil { // the footer reader panics on some input
			err = errNotListable
		}
		if err != nil {
			if pr != nil {
				pr.Close()
			}
			f.Close()
		}
	}()
	pr, err = file.NewParquetReader(io.NewSectionReader(f, 0, f.Size()), file.WithReadProps(parquet.NewReaderProperties(memory.DefaultAllocator)))
	if err != nil {
		return c, err
	}
	md := pr.MetaData()
	ci := md.Schema.ColumnIndexByName(column)
	if ci < 0 {
		return c, errNotListable
	}
	leaf := md.Schema.Column(ci)
	if leaf.PhysicalType() != parquet.Types.ByteArray || leaf.MaxRepetitionLevel() != 0 || leaf.Path() != column || leaf.MaxDefinitionLevel() > 1 {
		return c, errNotListable
	}
	c = pqColumn{f: f, pr: pr, md: md, ci: ci, maxDef: leaf.MaxDefinitionLevel()}
	for g := range md.NumRowGroups() {
		cc, err := md.RowGroup(g).ColumnChunk(ci)
		if err != nil {
			return pqColumn{}, err
		}
		if !slices.Contains(codecs, cc.Compression()) || cc.FilePath() != "" || cc.CryptoMetadata() != nil {
			return pqColumn{}, errNotListable
		}
		c.rows += md.RowGroup(g).NumRows()
		c.bytes += cc.TotalUncompressedSize()
	}
	return c, nil
}

// listParquet lists the values of a flat BYTE_ARRAY column whose pages are
// uncompressed and PLAIN-encoded, as extents of the file. It returns
// errNotListable (or another error, which the caller treats the same: the
// walk reports it) when the column is not like that.
func listParquet(ctx context.Context, fsys fs.FS, name, column string) (_ *listed, err error) {
	c, err := openPQColumn(ctx, fsys, name, column, compress.Codecs.Uncompressed)
	if err != nil {
		return nil, err
	}
	f, md, ci, maxDef, rows, bytes := c.f, c.md, c.ci, c.maxDef, c.rows, c.bytes
	defer c.pr.Close()
	defer func() {
		if r := recover(); r != nil { // the page headers' reader may panic on some input
			err = errNotListable
		}
		if err != nil {
			f.Close()
		}
	}()
	if rows == 0 || bytes/rows < listParquetMinValue { // an empty table is walked
		return nil, errNotListable
	}
	l := newListed(ctx, "parquet", fsys)
	fi := l.addFile(name, f)
	l.samples = make([]Sample, 0, rows)
	l.ext1 = make([]extent, 0, rows)
	base := path.Base(name) + ":"
	pl := pageLister{r: f, size: f.Size(), maxDef: maxDef}
	for g := range md.NumRowGroups() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rg := md.RowGroup(g)
		cc, _ := rg.ColumnChunk(ci)
		start := cc.DataPageOffset()
		if cc.HasDictionaryPage() && cc.DictionaryPageOffset() > 0 && cc.DictionaryPageOffset() < start {
			start = cc.DictionaryPageOffset()
		}
		before := len(l.ext1)
		if err := pl.chunk(start, start+cc.TotalCompressedSize(), func(off, size int64) {
			l.samples = append(l.samples, Sample{Name: base + strconv.Itoa(len(l.samples)), Size: size})
			l.ext1 = append(l.ext1, extent{file: fi, off: off, size: size})
		}); err != nil {
			return nil, err
		}
		if int64(len(l.ext1)-before) != rg.NumRows() {
			return nil, errNotListable
		}
	}
	return l, nil
}

// pageLister reads a column chunk's page headers and value lengths.
type pageLister struct {
	r      io.ReaderAt
	size   int64
	maxDef int16
	proto  thrift.CompactProtocol
	win    []byte // bytes of the file from winOff
	winOff int64
	levels []uint8
}

// at returns n bytes of the file at off (n <= 1 MiB), from a small window
// read ahead: a value's length prefix and the next page's header are often
// in the bytes just read.
func (p *pageLister) at(off int64, n int) ([]byte, error) {
	if off >= p.winOff && off+int64(n) <= p.winOff+int64(len(p.win)) {
		return p.win[off-p.winOff : off-p.winOff+int64(n)], nil
	}
	if off < 0 || off+int64(n) > p.size {
		return nil, errNotListable
	}
	k := min(max(n, 4<<10), int(p.size-off))
	if cap(p.win) < k {
		p.win = make([]byte, k)
	}
	p.win = p.win[:k]
	if got, err := p.r.ReadAt(p.win, off); got < k {
		p.win = p.win[:0]
		if err == nil || err == io.EOF {
			err = errNotListable // the file is shorter than it was
		}
		return nil, err
	}
	p.winOff = off
	return p.win[:n], nil
}

// header decodes the page header at off and returns it with its length.
func (p *pageLister) header(off, end int64) (h format.PageHeader, n int, err error) {
	for want := 256; ; want *= 4 {
		k := int(min(int64(want), end-off))
		b, err := p.at(off, k)
		if err != nil {
			return h, 0, err
		}
		h = format.PageHeader{}
		rd := p.proto.NewReaderFromBytes(b)
		if err := thrift.NewDecoder(rd).Decode(&h); err == nil {
			return h, rd.BytesRead(), nil
		} else if k < want || want >= 1<<20 { // the whole rest was there: bad bytes
			return h, 0, errNotListable
		}
	}
}

// chunk lists the values of the pages in [off, end), calling value with
// each value's place in the file.
func (p *pageLister) chunk(off, end int64, value func(off, size int64)) error {
	if off < 0 || end > p.size || off > end {
		return errNotListable
	}
	for off < end {
		h, hl, err := p.header(off, end)
		if err != nil {
			return err
		}
		body := off + int64(hl)
		next := body + int64(h.CompressedPageSize)
		if h.CompressedPageSize < 0 || next > end || h.CompressedPageSize != h.UncompressedPageSize {
			return errNotListable
		}
		var n int64
		switch h.Type {
		case format.DictionaryPage, format.IndexPage:
			off = next
			continue
		case format.DataPage:
			if !h.DataPageHeader.Valid || h.DataPageHeader.V.Encoding != format.Plain {
				return errNotListable
			}
			n = int64(h.DataPageHeader.V.NumValues)
			if p.maxDef > 0 {
				if h.DataPageHeader.V.DefinitionLevelEncoding != format.RLE {
					return errNotListable
				}
				lb, err := p.at(body, 4)
				if err != nil {
					return err
				}
				ll := int64(binary.LittleEndian.Uint32(lb))
				if ll > next-body-4 || ll > 1<<20 {
					return errNotListable
				}
				if err := p.allDefined(body+4, int(ll), n); err != nil {
					return err
				}
				body += 4 + ll
			}
		case format.DataPageV2:
			dh := h.DataPageHeaderV2.V
			if !h.DataPageHeaderV2.Valid || dh.Encoding != format.Plain || dh.NumNulls != 0 || dh.RepetitionLevelsByteLength != 0 || dh.DefinitionLevelsByteLength < 0 {
				return errNotListable
			}
			n = int64(dh.NumValues)
			body += int64(dh.DefinitionLevelsByteLength)
		default:
			return errNotListable
		}
		for range n {
			lb, err := p.at(body, 4)
			if err != nil {
				return err
			}
			size := int64(binary.LittleEndian.Uint32(lb))
			if size > next-body-4 {
				return errNotListable
			}
			value(body+4, size)
			body += 4 + size
		}
		if body != next {
			return errNotListable
		}
		off = next
	}
	return nil
}

// allDefined checks that the first n of the RLE definition levels of k
// bytes at off are all 1 (no NULL value: a NULL sample is an error, which
// the walk reports with its row).
func (p *pageLister) allDefined(off int64, k int, n int64) error {
	b, err := p.at(off, k)
	if err != nil {
		return err
	}
	lv, err := (&rle.Encoding{BitWidth: 1}).DecodeLevels(p.levels[:0], b)
	if err != nil || int64(len(lv)) < n {
		return errNotListable
	}
	p.levels = lv
	for _, v := range lv[:n] {
		if v != 1 {
			return errNotListable
		}
	}
	return nil
}
