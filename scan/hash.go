package scan

import (
	"context"
	"fmt"
	"math"
	"sort"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/zeebo/xxh3"

	"github.com/ffkit/ffkit/internal/errkind"
	"github.com/ffkit/ffkit/scan/expr"
)

// The hash partitioning rule, stable across processes, machines and
// releases: a row's partition is H % N, where H folds the key columns in
// order, starting from hashSeed, with H = mix(H ^ h(v)), and h is
//   - NULL:                 nullHash
//   - integers, dates, timestamps (days / microseconds), booleans (0/1),
//     and floats that hold an integral value: mix(uint64(v))
//   - other floats:         mix(IEEE-754 bits), -0 as 0, one NaN
//   - strings and binary:   xxh3-64 of the bytes
//
// so that equal values of different integer widths (and 2 and 2.0) land in
// the same partition, which a partition-wise join needs.
const (
	hashSeed = 0x9e3779b97f4a7c15
	nullHash = 0x2545f4914f6cdd1d
)

func mix(h uint64) uint64 {
	// splitmix64 finaliser
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// hashRows returns the hash of every row over the key columns.
func hashRows(keys []expr.Vec, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = hashSeed
	}
	for k := range keys {
		v := &keys[k]
		for i := 0; i < n; i++ {
			var x uint64
			switch {
			case v.IsNull(i):
				x = nullHash
			default:
				switch v.T {
				case expr.TInt, expr.TDate, expr.TTimestamp:
					x = mix(uint64(v.I[i]))
				case expr.TBool:
					x = mix(uint64(b2i(v.B[i])))
				case expr.TFloat:
					f := v.F[i]
					if f == math.Trunc(f) && math.Abs(f) < 1<<63 {
						x = mix(uint64(int64(f)))
					} else if f != f {
						x = mix(0x7ff8000000000001)
					} else {
						x = mix(math.Float64bits(f))
					}
				case expr.TString:
					x = xxh3.HashString(v.S[i])
				}
			}
			h[i] = mix(h[i] ^ x)
		}
	}
	return h
}

// PartitionOf is the partition of a row whose key columns hold vals, as
// hash partitioning computes it. It lets tests and other tools locate a key.
func PartitionOf(vals []expr.Value, n int) int {
	keys := make([]expr.Vec, len(vals))
	for i, v := range vals {
		keys[i] = expr.Vec{T: v.T, Null: []bool{v.Null || v.T == expr.TNull}}
		switch v.T {
		case expr.TBool:
			keys[i].B = []bool{v.B}
		case expr.TInt, expr.TDate, expr.TTimestamp:
			keys[i].I = []int64{v.I}
		case expr.TFloat:
			keys[i].F = []float64{v.F}
		case expr.TString:
			keys[i].S = []string{v.S}
		}
	}
	return int(hashRows(keys, 1)[0] % uint64(n))
}

// ErrPartitionValue: a row's partition column (--partition-by column:COL)
// is NULL or outside [0, partitions).
var ErrPartitionValue = errkind.New(errkind.Data, "scan: partition column value out of range")

// splitRows splits rec into n batches by the hash of the key columns
// (positions in rec), with byValue by the value of the one key column,
// which must be in [0, n), or with bounds (n-1 of them) by where the one
// key column falls between them. Batches of empty partitions are nil.
func splitRows(ctx context.Context, rec arrow.RecordBatch, keyPos []int, n int, byValue bool, bounds [][]byte) ([]arrow.RecordBatch, error) {
	part, err := rowPartitions(rec, keyPos, n, byValue, bounds)
	if err != nil {
		return nil, err
	}
	counts, idx := groupRows(part, n)
	sorted, err := takeRows(ctx, rec, idx)
	if err != nil {
		return nil, fmt.Errorf("scan: partition rows: %w", err)
	}
	defer sorted.Release()
	out := make([]arrow.RecordBatch, n)
	for p := 0; p < n; p++ {
		if counts[p+1] > counts[p] {
			out[p] = sorted.NewSlice(int64(counts[p]), int64(counts[p+1]))
		}
	}
	return out, nil
}

// groupRows orders the row indices by partition (a counting sort: rows
// ascending within a partition); partition p's rows are
// idx[counts[p]:counts[p+1]].
func groupRows(part []int32, n int) (counts []int, idx []int32) {
	counts = make([]int, n+1)
	for _, p := range part {
		counts[p+1]++
	}
	for p := 1; p <= n; p++ {
		counts[p] += counts[p-1]
	}
	idx = make([]int32, len(part))
	pos := make([]int, n)
	copy(pos, counts[:n])
	for i, p := range part {
		idx[pos[p]] = int32(i)
		pos[p]++
	}
	return counts, idx
}

// rowPartitions is the partition of each row of rec, as splitRows splits.
func rowPartitions(rec arrow.RecordBatch, keyPos []int, n int, byValue bool, bounds [][]byte) ([]int32, error) {
	rows := int(rec.NumRows())
	keys := make([]expr.Vec, len(keyPos))
	for i, p := range keyPos {
		v, err := expr.FromArrow(rec.Column(p))
		if err != nil {
			return nil, fmt.Errorf("partition key %s: %w", rec.ColumnName(p), err)
		}
		keys[i] = v
	}
	part := make([]int32, rows)
	if byValue {
		v := &keys[0]
		if v.T != expr.TInt {
			return nil, fmt.Errorf("%w: partition column %s is not an integer", ErrUsage, rec.ColumnName(keyPos[0]))
		}
		for i := range part {
			if v.IsNull(i) || v.I[i] < 0 || v.I[i] >= int64(n) {
				val := "NULL"
				if !v.IsNull(i) {
					val = fmt.Sprint(v.I[i])
				}
				return nil, fmt.Errorf("%w: column %s holds %s, want [0, %d)", ErrPartitionValue, rec.ColumnName(keyPos[0]), val, n)
			}
			part[i] = int32(v.I[i])
		}
	} else if bounds != nil {
		v := &keys[0]
		if v.T != expr.TString {
			return nil, fmt.Errorf("%w: range partition column %s is not a string or binary", ErrUsage, rec.ColumnName(keyPos[0]))
		}
		for i := range part {
			if v.IsNull(i) {
				continue
			}
			k := v.S[i]
			part[i] = int32(sort.Search(len(bounds), func(b int) bool { return string(bounds[b]) > k }))
		}
	} else {
		for i, x := range hashRows(keys, rows) {
			part[i] = int32(x % uint64(n))
		}
	}
	return part, nil
}
