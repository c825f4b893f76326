package scan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"

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
