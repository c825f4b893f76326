package scan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/ffkit/ffkit/fs"
)

// A range repartition and partial sort in one job (Job.SortBy with
// PartitionBy "range:COL", as the local executor runs a DataFrame's
// repartition(range_by=...).partial_sort(...)): each input batch is split
// by range into per-partition batches held in memory, then each partition
// is sorted and written as part-PPPPP, the file the two stages would have
// written, with the same rows in the same order (the split keeps input
// order within a partition, as the repartition stage's files do, and the
// sort is stable). An input larger than RangeSortMemoryBytes, a key the
// native sort does not take, or a job run task by task (Ray) goes the
// two-stage way inside the job: the split is written to intermediate
// files under the work directory, and each partition's files are sorted.

// RangeSortMemoryBytes bounds the uncompressed input size (row-group
// sizes) split in memory by a range-partitioned sort; a larger input is
// split into intermediate files.
var RangeSortMemoryBytes int64 = 2 << 30

func (r *runner) rangeSort(ctx context.Context) ([]marker, error) {
	j := &r.job
	n := r.partitions
	par := max(1, j.Workers/max(1, min(n, j.Workers)))
	var all []unit
	var size int64
	for _, pr := range partitionRanges(r.src, "", 1) {
		for _, fr := range pr {
			for rg := 0; rg < fr.file.NumRowGroups(); rg++ {
				size += fr.file.meta.RowGroup(rg).TotalByteSize()
			}
		}
		all = append(all, r.units(pr, true)...)
	}
	if r.sortKey < 0 || r.sel != nil || size > RangeSortMemoryBytes {
		if !r.published(ctx, n) {
			if err := r.shuffle(ctx, r.src, "in", false); err != nil {
				return nil, err
			}
			if err := r.barrier(); err != nil {
				return nil, err
			}
		}
		return r.runTasks(ctx, n, func(p int) (string, taskFn) {
			return partName(p), r.sortShuffledTask(p, par)
		})
	}
	parts := make([][]arrow.RecordBatch, n)
	defer func() {
		for _, recs := range parts {
			releaseBatches(recs)
		}
	}()
	if !r.published(ctx, n) {
		keyPos := []int{slices.Index(r.q.readNames, resolveName(r.src.Files[0].Schema, j.keyColumns()[0]))}
		for _, u := range all {
			r.addPlanned(u.rows())
		}
		err := orderedMap(ctx, len(all), j.Workers,
			func(ctx context.Context, i int) ([]arrow.RecordBatch, error) {
				rec, err := r.q.read(ctx, all[i])
				if err != nil || rec == nil {
					return nil, err
				}
				defer rec.Release()
				return splitRows(ctx, rec, keyPos, n, false, j.Bounds)
			},
			func(i int, pieces []arrow.RecordBatch) error {
				r.addDone(all[i].rows())
				for p, pc := range pieces {
					if pc != nil {
						parts[p] = append(parts[p], pc)
					}
				}
				return nil
			}, releaseBatches)
		if err != nil {
			return nil, err
		}
	}
	return r.runTasks(ctx, n, func(p int) (string, taskFn) {
		return partName(p), func(ctx context.Context, stage string) ([]string, int64, error) {
			return r.writeSortedPart(ctx, stage, p, parts[p])
		}
	})
}

// GatherAcrossBatches: the native sort gathers each output row group from
// the partition's batches (else it concatenates them first, then gathers
// from the copy). A switch for benchmarks.
var GatherAcrossBatches = true

// gatherSorted writes the rows of recs (in order: rows refs, keys their
// sort keys) sorted, gathering each output row group from recs.
func (r *runner) gatherSorted(s sink, recs []arrow.RecordBatch, refs []rowRef, keys []arrow.Array) error {
	key, err := array.Concatenate(keys, memory.DefaultAllocator)
	if err != nil {
		return fmt.Errorf("scan: sort: gather keys: %w", err)
	}
	perm, err := sortPerm(key)
	key.Release()
	if err != nil {
		return err
	}
	write := s.Write
	if w, ok := s.(interface{ WriteRowGroup(arrow.RecordBatch) error }); ok {
		write = w.WriteRowGroup
	}
	sc := r.q.readSchema
	srcs := make([]arrow.Array, len(recs))
	chunk := make([]rowRef, 0, min(int64(len(perm)), r.job.RowGroupRows))
	for lo := 0; lo < len(perm); lo += int(r.job.RowGroupRows) {
		chunk = chunk[:0]
		for _, g := range perm[lo:min(lo+int(r.job.RowGroupRows), len(perm))] {
			chunk = append(chunk, refs[g])
		}
		cols := make([]arrow.Array, sc.NumFields())
		for c := range cols {
			for bi, rec := range recs {
				srcs[bi] = rec.Column(c)
			}
			cols[c] = gatherRows(sc.Field(c).Type, srcs, chunk)
		}
		rec := array.NewRecordBatch(sc, cols, int64(len(chunk)))
		releaseArrays(cols)
		err := write(rec)
		rec.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

func releaseArrays(as []arrow.Array) {
	for _, a := range as {
		if a != nil {
			a.Release()
		}
	}
}

// rowRef is row row of batch batch.
type rowRef struct{ batch, row int32 }

// gatherable: every column of sc has a gatherRows path.
func gatherable(sc *arrow.Schema) bool {
	for _, f := range sc.Fields() {
		switch f.Type.ID() {
		case arrow.STRING, arrow.BINARY, arrow.INT32, arrow.UINT32, arrow.FLOAT32, arrow.DATE32, arrow.TIME32,
			arrow.INT64, arrow.UINT64, arrow.FLOAT64, arrow.DATE64, arrow.TIME64, arrow.TIMESTAMP, arrow.DURATION:
		default:
			return false
		}
	}
	return true
}

// gatherRows is the column of type t holding, in order, the rows refs of
// srcs (one array per batch, of a type gatherable accepts).
func gatherRows(t arrow.DataType, srcs []arrow.Array, refs []rowRef) arrow.Array {
	n := len(refs)
	var valid []byte
	nulls := 0
	for _, a := range srcs {
		if a.NullN() > 0 {
			valid = make([]byte, bitutil.BytesForBits(int64(n)))
			for k, ref := range refs {
				if srcs[ref.batch].IsValid(int(ref.row)) {
					bitutil.SetBit(valid, k)
				} else {
					nulls++
				}
			}
			break
		}
	}
	var vb *memory.Buffer
	if nulls > 0 {
		vb = memory.NewBufferBytes(valid)
	}
	var bufs []*memory.Buffer
	switch t.ID() {
	case arrow.STRING, arrow.BINARY:
		offs := make([][]int32, len(srcs))
		data := make([][]byte, len(srcs))
		for i, a := range srcs {
			d := a.Data()
			offs[i] = unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(d.Buffers()[1].Bytes()))), d.Len()+d.Offset()+1)[d.Offset():]
			if len(d.Buffers()) > 2 && d.Buffers()[2] != nil {
				data[i] = d.Buffers()[2].Bytes()
			}
		}
		total := 0
		for _, ref := range refs {
			o := offs[ref.batch]
			total += int(o[ref.row+1] - o[ref.row])
		}
		outOffs := make([]int32, n+1)
		outData := make([]byte, total)
		pos := int32(0)
		for k, ref := range refs {
			o := offs[ref.batch]
			lo, hi := o[ref.row], o[ref.row+1]
			copy(outData[pos:], data[ref.batch][lo:hi])
			pos += hi - lo
			outOffs[k+1] = pos
		}
		ob := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(outOffs))), 4*(n+1))
		bufs = []*memory.Buffer{vb, memory.NewBufferBytes(ob), memory.NewBufferBytes(outData)}
	default:
		width := t.(arrow.FixedWidthDataType).BitWidth() / 8
		out := make([]byte, n*width)
		vals := make([][]byte, len(srcs))
		for i, a := range srcs {
			d := a.Data()
			vals[i] = d.Buffers()[1].Bytes()[d.Offset()*width:]
		}
		for k, ref := range refs {
			o := int(ref.row) * width
			copy(out[k*width:(k+1)*width], vals[ref.batch][o:o+width])
		}
		bufs = []*memory.Buffer{vb, memory.NewBufferBytes(out)}
	}
	ad := array.NewData(t, n, bufs, nil, nulls, 0)
	defer ad.Release()
	return array.MakeFromData(ad)
}

// sortShuffledTask sorts partition p of a range-partitioned sort from its
// intermediate files (in producer order, which is input order).
func (r *runner) sortShuffledTask(p, par int) taskFn {
	return func(ctx context.Context, stage string) ([]string, int64, error) {
		shuffle := fs.Join(r.work, "shuffle")
		fsys, inner, err := fs.Resolve(ctx, shuffle)
		if err != nil {
			return nil, 0, err
		}
		ents, err := fsys.List(ctx, inner)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, 0, fmt.Errorf("scan: list %s: %w", shuffle, err)
		}
		var names []string
		prefix := fmt.Sprintf("p%05d-in-", p)
		for _, e := range ents {
			if strings.HasPrefix(e.Name, prefix) {
				names = append(names, e.Name)
			}
		}
		slices.Sort(names)
		var ranges []fileRange
		for _, name := range names {
			f, err := OpenFile(ctx, fs.Join(shuffle, name), nil)
			if err != nil {
				return nil, 0, err
			}
			defer f.Close()
			ranges = append(ranges, fileRange{f, 0, f.Rows})
			r.addPlanned(f.Rows) // read a second time
		}
		if r.sortKey < 0 || len(ranges) == 0 {
			if len(ranges) == 0 {
				return r.writeSortedPart(ctx, stage, p, nil)
			}
			return r.sqlTask(p, ranges, par)(ctx, stage)
		}
		return r.sortTask(p, ranges, par)(ctx, stage)
	}
}
