package loader

import (
	"sort"

	"github.com/ffkit/ffkit/ffrecord"
)

// OrderQuality measures both sides of the locality/randomness trade-off of
// a delivered order (see "Block shuffle" in the package documentation):
//
//   - ReadsPerBatch: the read requests a batch costs once its samples are
//     sorted by (file, offset) and neighbours closer than MergeGap bytes
//     are merged, as ffrecord's planner does. Fewer is kinder to slow
//     media.
//   - NearFrac: the share of consecutive deliveries that are dataset
//     neighbours (indices within NearDistance of each other). About
//     2*NearDistance/n for an exact shuffle, close to 1 for sequential
//     reading; lower is more random.
//
// Observe the batches of one loader in delivery order. Not safe for
// concurrent use.
type OrderQuality struct {
	MergeGap     int64
	NearDistance int64

	readers []*ffrecord.Reader
	batches int64
	reads   int64
	pairs   int64
	near    int64
	prev    sampleKey
	hasPrev bool
	spans   []span
}

type span struct {
	file     int
	src      int
	off, end int64
}

// NewOrderQuality measures the order of l's batches, merging reads as
// ffrecord does by default.
func NewOrderQuality(l *Loader) *OrderQuality {
	gap := l.opts.MergeGap
	if gap == 0 {
		gap = ffrecord.DefaultMergeGap
	}
	return &OrderQuality{MergeGap: gap, NearDistance: 16, readers: l.readers}
}

// Observe adds one batch.
func (q *OrderQuality) Observe(b *Batch) {
	q.batches++
	q.spans = q.spans[:0]
	for i, idx := range b.Indices {
		src := 0
		if b.Sources != nil {
			src = b.Sources[i]
		}
		k := sampleKey{src, idx}
		if q.hasPrev {
			q.pairs++
			d := idx - q.prev.index
			if k.source == q.prev.source && d >= -q.NearDistance && d <= q.NearDistance {
				q.near++
			}
		}
		q.prev, q.hasPrev = k, true
		f, off, n, err := q.readers[src].Locate(idx)
		if err != nil {
			continue
		}
		q.spans = append(q.spans, span{file: f, src: src, off: off, end: off + n})
	}
	sort.Slice(q.spans, func(a, c int) bool {
		x, y := q.spans[a], q.spans[c]
		if x.src != y.src {
			return x.src < y.src
		}
		if x.file != y.file {
			return x.file < y.file
		}
		return x.off < y.off
	})
	for i, s := range q.spans {
		if i > 0 {
			p := q.spans[i-1]
			if p.src == s.src && p.file == s.file && s.off-p.end <= q.MergeGap {
				if s.end > p.end {
					q.spans[i].end = s.end
				} else {
					q.spans[i].end = p.end
				}
				continue
			}
		}
		q.reads++
	}
}

// ReadsPerBatch is the mean number of merged read requests per batch.
func (q *OrderQuality) ReadsPerBatch() float64 {
	if q.batches == 0 {
		return 0
	}
	return float64(q.reads) / float64(q.batches)
}

// NearFrac is the share of consecutive deliveries that are neighbours.
func (q *OrderQuality) NearFrac() float64 {
	if q.pairs == 0 {
		return 0
	}
	return float64(q.near) / float64(q.pairs)
}
