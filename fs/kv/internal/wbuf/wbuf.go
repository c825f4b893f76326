// Package wbuf is the write buffer that the memkv and etcdkv backends share:
// a transaction's Sets, Deletes and DeleteRanges, kept until commit, with
// the read-your-writes overlay for Get and Range, and the shape of a range
// read over it (how much to ask the store for, what range was observed).
//
// Ordering: a DeleteRange drops earlier point writes inside it; a later
// point write overrides the range. So at commit the ranges are applied
// first, then the point writes.
//
// A Buffer belongs to one transaction and is not safe for concurrent use.
package wbuf

import (
	"bytes"
	"sort"

	"github.com/ffkit/ffkit/fs/kv"
)

// Op is one buffered point write.
type Op struct {
	Value  []byte
	Delete bool
}

// Range is the half-open key range [Begin, End); End nil means no upper
// bound.
type Range struct{ Begin, End []byte }

// Contains reports whether k is in r.
func (r Range) Contains(k []byte) bool {
	return bytes.Compare(k, r.Begin) >= 0 && (r.End == nil || bytes.Compare(k, r.End) < 0)
}

// Buffer holds a transaction's writes.
type Buffer struct {
	points map[string]Op
	ranges []Range
	bytes  int // approximate size of the buffered writes
}

// Set buffers key=value.
func (b *Buffer) Set(key, value []byte) {
	if b.points == nil {
		b.points = map[string]Op{}
	}
	b.points[string(key)] = Op{Value: append([]byte(nil), value...)}
	b.bytes += len(key) + len(value)
}

// Delete buffers the removal of key.
func (b *Buffer) Delete(key []byte) {
	if b.points == nil {
		b.points = map[string]Op{}
	}
	b.points[string(key)] = Op{Delete: true}
	b.bytes += len(key)
}

// DeleteRange buffers the removal of [begin, end).
func (b *Buffer) DeleteRange(begin, end []byte) {
	r := Range{append([]byte(nil), begin...), nil}
	if end != nil {
		r.End = append([]byte(nil), end...)
		if bytes.Compare(r.End, r.Begin) <= 0 {
			return
		}
	}
	for k := range b.points {
		if r.Contains([]byte(k)) {
			delete(b.points, k)
		}
	}
	b.ranges = append(b.ranges, r)
	b.bytes += len(begin) + len(end)
}

// Empty reports whether nothing was written.
func (b *Buffer) Empty() bool { return len(b.points) == 0 && len(b.ranges) == 0 }

// Size is the approximate number of bytes buffered.
func (b *Buffer) Size() int { return b.bytes }

// Lookup returns the buffered state of key: found=false means the buffer
// says nothing and the store must be read.
func (b *Buffer) Lookup(key []byte) (value []byte, ok, found bool) {
	if op, hit := b.points[string(key)]; hit {
		if op.Delete {
			return nil, false, true
		}
		return op.Value, true, true
	}
	for _, r := range b.ranges {
		if r.Contains(key) {
			return nil, false, true
		}
	}
	return nil, false, false
}

// Touches reports whether the buffer holds any write inside [begin, end),
// in which case a limited range read of the store must read without limit
// before the overlay.
func (b *Buffer) Touches(begin, end []byte) bool {
	q := Range{begin, end}
	for k := range b.points {
		if q.Contains([]byte(k)) {
			return true
		}
	}
	for _, r := range b.ranges {
		if overlaps(q, r) {
			return true
		}
	}
	return false
}

// StoreLimit is how many pairs a range read over [begin, end) with limit
// asks the store for: limit, or all of them (0) when the buffer holds a
// write in the range, as the overlay may then drop pairs the limit kept.
func (b *Buffer) StoreLimit(begin, end []byte, limit int) int {
	if b.Touches(begin, end) {
		return 0
	}
	return limit
}

// Observed is the part of [begin, end) that a range read with limit
// returning out has seen, the range its conflict check must watch: all of
// it, or, when the read stopped at the limit, only up to and including the
// last key returned.
func Observed(begin, end []byte, limit int, out []kv.KeyValue) Range {
	r := Range{Begin: append([]byte(nil), begin...), End: end}
	if limit > 0 && len(out) == limit {
		r.End = append(append([]byte(nil), out[len(out)-1].Key...), 0)
	}
	return r
}

func overlaps(a, b Range) bool {
	// a.Begin < b.End && b.Begin < a.End, with nil ends unbounded.
	if b.End != nil && bytes.Compare(a.Begin, b.End) >= 0 {
		return false
	}
	if a.End != nil && bytes.Compare(b.Begin, a.End) >= 0 {
		return false
	}
	return true
}

// Overlay applies the buffer to store, the sorted pairs the store holds in
// [begin, end), and returns at most limit pairs (limit <= 0: all).
func (b *Buffer) Overlay(store []kv.KeyValue, begin, end []byte, limit int) []kv.KeyValue {
	q := Range{begin, end}
	out := make([]kv.KeyValue, 0, len(store))
	for _, p := range store {
		if _, _, found := b.Lookup(p.Key); found {
			continue // overridden or deleted here; sets are added below
		}
		out = append(out, p)
	}
	added := false
	for k, op := range b.points {
		if !op.Delete && q.Contains([]byte(k)) {
			out = append(out, kv.KeyValue{Key: []byte(k), Value: op.Value})
			added = true
		}
	}
	if added {
		sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].Key, out[j].Key) < 0 })
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// Normalized returns the writes in a form every store accepts in one
// atomic batch: non-overlapping delete ranges in key order that contain
// no point write, then the point writes in key order. Point deletes inside
// a range are dropped (the range removes them).
func (b *Buffer) Normalized() (ranges []Range, keys []string, ops []Op) {
	rs := append([]Range(nil), b.ranges...)
	sort.Slice(rs, func(i, j int) bool { return bytes.Compare(rs[i].Begin, rs[j].Begin) < 0 })
	var merged []Range
	for _, r := range rs {
		if n := len(merged); n > 0 && overlapsOrTouches(merged[n-1], r) {
			last := &merged[n-1]
			if last.End != nil && (r.End == nil || bytes.Compare(r.End, last.End) > 0) {
				last.End = r.End
			}
			continue
		}
		merged = append(merged, r)
	}
	for k := range b.points {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Cut every set key out of the ranges (it lies in at most one).
	for _, k := range keys {
		op := b.points[k]
		kb := []byte(k)
		for i := 0; i < len(merged); i++ {
			r := merged[i]
			if !r.Contains(kb) {
				continue
			}
			if op.Delete {
				break
			}
			next := append(append([]byte(nil), kb...), 0)
			left := Range{r.Begin, kb}
			right := Range{next, r.End}
			var repl []Range
			if bytes.Compare(left.Begin, left.End) < 0 {
				repl = append(repl, left)
			}
			if right.End == nil || bytes.Compare(right.Begin, right.End) < 0 {
				repl = append(repl, right)
			}
			merged = append(merged[:i], append(repl, merged[i+1:]...)...)
			break
		}
	}
	for _, k := range keys {
		op := b.points[k]
		if op.Delete {
			covered := false
			for _, r := range merged {
				if r.Contains([]byte(k)) {
					covered = true
					break
				}
			}
			if covered {
				continue
			}
		}
		ops = append(ops, op)
		keys[len(ops)-1] = k
	}
	return merged, keys[:len(ops)], ops
}

func overlapsOrTouches(a, b Range) bool {
	// a starts before b (sorted); they merge if b.Begin <= a.End.
	return a.End == nil || bytes.Compare(b.Begin, a.End) <= 0
}
