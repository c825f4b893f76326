package scan

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/ffkit/ffkit/scan/expr"
)

// Native partial sort (Job.SortBy): each partition's rows are read into
// memory, ordered by one key column and written once through the job's
// sink. Keys: string or binary (bytewise, as DuckDB orders BLOB and
// VARCHAR) or integer; NULLs last; equal keys keep their input order. The
// sort orders (8-byte key prefix, row) pairs, comparing whole keys only
// when prefixes tie. Other keys, several keys, and partitions larger than
// SortMemoryBytes go through DuckDB (SELECT * FROM input ORDER BY ...).

// SortMemoryBytes bounds the uncompressed size of a partition sorted in
// memory; a larger one is sorted by DuckDB, which spills.
var SortMemoryBytes int64 = 1 << 30

// sortSQL is the DuckDB query of a sort.
func sortSQL(by []string) string {
	keys := make([]string, len(by))
	for i, c := range by {
		keys[i] = (&expr.Col{Name: c}).String()
	}
	return "SELECT * FROM input ORDER BY " + strings.Join(keys, ", ")
}

// nativeSortKey is the position of the one sort column among the read
// columns, or -1 when the sort goes through DuckDB.
func nativeSortKey(q *query, by []string, src *Source) int {
	if len(by) != 1 {
		return -1
	}
	p := slices.Index(q.readNames, resolveName(src.Files[0].Schema, by[0]))
	if p < 0 {
		return -1
	}
	switch q.readSchema.Field(p).Type.ID() {
	case arrow.STRING, arrow.BINARY, arrow.INT8, arrow.INT16, arrow.INT32, arrow.INT64:
		return p
	}
	return -1
}

// sortTask sorts partition p (ranges) by the key column.
func (r *runner) sortTask(p int, ranges []fileRange, par int) taskFn {
	return func(ctx context.Context, stage string) ([]string, int64, error) {
		var size int64
		for _, fr := range ranges {
			for rg := 0; rg < fr.file.NumRowGroups(); rg++ {
				size += fr.file.meta.RowGroup(rg).TotalByteSize()
			}
		}
		if size > SortMemoryBytes {
			return r.sqlTask(p, ranges, par)(ctx, stage)
		}
		units := r.units(ranges, false)
		recs := make([]arrow.RecordBatch, len(units))
		defer func() { releaseBatches(recs) }()
		err := orderedMap(ctx, len(units), par,
			func(ctx context.Context, i int) (arrow.RecordBatch, error) { return r.q.read(ctx, units[i]) },
			func(i int, rec arrow.RecordBatch) error {
				recs[i] = rec
				r.addDone(units[i].rows())
				return nil
			}, func(rec arrow.RecordBatch) {
				if rec != nil {
					rec.Release()
				}
			})
		if err != nil {
			return nil, 0, err
		}
		return r.writeSortedPart(ctx, stage, p, recs)
	}
}

// writeSortedPart writes partition p's rows (recs, in input order; nil
// and empty batches allowed) sorted by the key column, as the one file
// part-PPPPP (schema only when there are no rows).
func (r *runner) writeSortedPart(ctx context.Context, stage string, p int, recs []arrow.RecordBatch) ([]string, int64, error) {
	var have []arrow.RecordBatch
	for _, rec := range recs {
		if rec != nil && rec.NumRows() > 0 {
			have = append(have, rec)
		}
	}
	name := partName(p)
	s, err := newSink(ctx, r.sinkOpts(stage, name, r.q.readSchema, r.kv(name, p)))
	if err != nil {
		return nil, 0, err
	}
	if len(have) > 0 {
		write := r.writeSorted
		if GatherAcrossBatches && gatherable(r.q.readSchema) {
			write = r.writeSortedGather
		}
		if err := write(ctx, s, have); err != nil {
			s.Abort()
			return nil, 0, err
		}
	}
	return s.Close()
}

// writeSortedGather is writeSorted without concatenating recs: only the
// sort key is; each output row group is gathered from recs.
func (r *runner) writeSortedGather(ctx context.Context, s sink, recs []arrow.RecordBatch) error {
	var refs []rowRef
	keys := make([]arrow.Array, len(recs))
	for bi, rec := range recs {
		keys[bi] = rec.Column(r.sortKey)
		for row := int32(0); row < int32(rec.NumRows()); row++ {
			refs = append(refs, rowRef{int32(bi), row})
		}
	}
	return r.gatherSorted(s, recs, refs, keys)
}

func (r *runner) writeSorted(ctx context.Context, s sink, recs []arrow.RecordBatch) error {
	all, err := concatBatches(recs)
	if err != nil {
		return fmt.Errorf("scan: sort: gather rows: %w", err)
	}
	defer all.Release()
	perm, err := sortPerm(all.Column(r.sortKey))
	if err != nil {
		return err
	}
	sorted, err := takeRows(ctx, all, perm)
	if err != nil {
		return fmt.Errorf("scan: sort: %w", err)
	}
	defer sorted.Release()
	step := r.job.RowGroupRows
	write := s.Write
	if w, ok := s.(interface{ WriteRowGroup(arrow.RecordBatch) error }); ok {
		write = w.WriteRowGroup
	}
	for lo := int64(0); lo < sorted.NumRows(); lo += step {
		part := sorted.NewSlice(lo, min(lo+step, sorted.NumRows()))
		err := write(part)
		part.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// sortPerm returns the rows of a in ascending order (NULLs last, ties in
// row order).
func sortPerm(a arrow.Array) ([]int32, error) {
	n := a.Len()
	ents := make([]ent, 0, n)
	var nulls []int32
	var key func(i int32) []byte // full key, for prefix ties (nil: the prefix is the key)
	switch c := a.(type) {
	case *array.Binary, *array.String:
		offs := a.Data().Buffers()[1]
		data := a.Data().Buffers()[2]
		if offs == nil || data == nil {
			return nil, fmt.Errorf("scan: sort: %s column without buffers", a.DataType())
		}
		o := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(offs.Bytes()))), offs.Len()/4)[a.Data().Offset():]
		b := data.Bytes()
		key = func(i int32) []byte { return b[o[i]:o[i+1]] }
		var pad [8]byte
		for i := 0; i < n; i++ {
			if c.IsNull(i) {
				nulls = append(nulls, int32(i))
				continue
			}
			k := b[o[i]:o[i+1]]
			var pfx uint64
			if len(k) >= 8 {
				pfx = binary.BigEndian.Uint64(k)
			} else {
				pad = [8]byte{}
				copy(pad[:], k)
				pfx = binary.BigEndian.Uint64(pad[:])
			}
			ents = append(ents, ent{pfx, int32(i)})
		}
	default:
		v, err := expr.FromArrow(a)
		if err != nil || v.T != expr.TInt {
			return nil, fmt.Errorf("scan: sort: unsupported key type %s", a.DataType())
		}
		for i := 0; i < n; i++ {
			if v.IsNull(i) {
				nulls = append(nulls, int32(i))
				continue
			}
			ents = append(ents, ent{uint64(v.I[i]) ^ 1<<63, int32(i)})
		}
	}
	ents = radixSortPrefix(ents)
	if key != nil {
		// runs of equal prefixes (rare for random keys) are ordered by the
		// whole key; the radix sort is stable, so equal keys stay in row
		// order
		for lo := 0; lo < len(ents); {
			hi := lo + 1
			for hi < len(ents) && ents[hi].pfx == ents[lo].pfx {
				hi++
			}
			if hi-lo > 1 {
				slices.SortStableFunc(ents[lo:hi], func(x, y ent) int { return bytes.Compare(key(x.row), key(y.row)) })
			}
			lo = hi
		}
	}
	perm := make([]int32, 0, n)
	for _, e := range ents {
		perm = append(perm, e.row)
	}
	return append(perm, nulls...), nil
}

// ent is a row and the 8-byte prefix of its key, in unsigned order.
type ent struct {
	pfx uint64
	row int32
}

// radixSortPrefix orders ents by pfx, stably (a least-significant-digit
// radix sort, one byte a pass, skipping the bytes every prefix shares:
// eight passes over the entries instead of n log n comparisons). It may
// return its argument or a new slice.
func radixSortPrefix(ents []ent) []ent {
	if len(ents) < 256 {
		slices.SortStableFunc(ents, func(x, y ent) int { return cmp.Compare(x.pfx, y.pfx) })
		return ents
	}
	var counts [8][256]int
	for _, e := range ents {
		for d := 0; d < 8; d++ {
			counts[d][byte(e.pfx>>(8*d))]++
		}
	}
	src, dst := ents, make([]ent, len(ents))
	for d := 0; d < 8; d++ {
		c := &counts[d]
		if c[byte(src[0].pfx>>(8*d))] == len(src) {
			continue // every prefix has this byte
		}
		pos, sum := [256]int{}, 0
		for b := 0; b < 256; b++ {
			pos[b], sum = sum, sum+c[b]
		}
		shift := 8 * d
		for _, e := range src {
			b := byte(e.pfx >> shift)
			dst[pos[b]] = e
			pos[b]++
		}
		src, dst = dst, src
	}
	return src
}
