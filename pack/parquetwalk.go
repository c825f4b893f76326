package pack

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"
)

// A Parquet column that is not listed (compressed or dictionary-encoded
// pages: pyarrow's defaults) is decoded a row group at a time by a few
// goroutines ahead of the writer, each copying its row group's values
// into one buffer, which the walk hands to fn in row order. Decoding on
// the walking goroutine (decompress, then copy into the shard, then
// write, one after the other) packed a snappy file at 0.7x of the disk's
// write speed. Memory is bounded by workers+1 row groups; a column whose
// row groups are larger than parallelRowGroupMax is decoded serially.

// parallelRowGroupMax is the largest uncompressed column chunk decoded
// ahead; a variable for tests.
var parallelRowGroupMax int64 = 256 << 20

// rowGroupsDecodedAhead counts the row groups decoded ahead, for tests.
var rowGroupsDecodedAhead atomic.Int64

// rowGroupVals is one row group's values: value i is
// buf[ends[i-1]:ends[i]]. err is the first error met decoding it, after
// the values before it.
type rowGroupVals struct {
	buf  []byte
	ends []int
	err  error
}

// decodeAhead returns whether the column is decoded in parallel, and the
// number of decoders.
func decodeAhead(pr *file.Reader, ci int) (int, bool) {
	n := pr.NumRowGroups()
	if n < 2 {
		return 0, false
	}
	for g := range n {
		cc, err := pr.MetaData().RowGroup(g).ColumnChunk(ci)
		if err != nil || cc.TotalUncompressedSize() > parallelRowGroupMax {
			return 0, false
		}
	}
	k := min(max(runtime.GOMAXPROCS(0), 2), 4, n)
	return k, true
}

// decodeRowGroups decodes the row groups of column ci with k goroutines
// and calls each in row order; each's buffers are reused after it
// returns. It stops the decoders before returning.
func decodeRowGroups(ctx context.Context, pr *file.Reader, ci int, name, column string, maxDef int16, k int, each func(g int, row int64, v *rowGroupVals) error) error {
	ctx, cancel := context.WithCancel(ctx)
	n := pr.NumRowGroups()
	first := make([]int64, n) // each row group's first row
	for g := 1; g < n; g++ {
		first[g] = first[g-1] + pr.MetaData().RowGroup(g-1).NumRows()
	}
	res := make([]chan *rowGroupVals, n)
	for g := range res {
		res[g] = make(chan *rowGroupVals, 1)
	}
	// A row group is decoded only with a token, given back once fn has
	// used it: workers take row groups in order, so the oldest one not
	// yet used always holds a token and the walk never waits forever.
	tokens := make(chan *rowGroupVals, k+1)
	for range k + 1 {
		tokens <- &rowGroupVals{}
	}
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var v *rowGroupVals
				select {
				case v = <-tokens:
				case <-ctx.Done():
					return
				}
				mu.Lock()
				g := next
				next++
				mu.Unlock()
				if g >= n {
					return
				}
				decodeRowGroup(pr, ci, g, first[g], name, column, maxDef, v)
				rowGroupsDecodedAhead.Add(1)
				res[g] <- v
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }() // the decoders stop at their next row group
	for g := range n {
		var v *rowGroupVals
		select {
		case v = <-res[g]:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := each(g, first[g], v); err != nil {
			return err
		}
		if v.err != nil {
			return v.err
		}
		tokens <- v
	}
	return nil
}

// decodeRowGroup decodes row group g's values of column ci into v,
// reusing its buffers.
func decodeRowGroup(pr *file.Reader, ci, g int, row int64, name, column string, maxDef int16, v *rowGroupVals) {
	v.buf, v.ends, v.err = v.buf[:0], v.ends[:0], nil
	defer func() { // the Parquet reader panics on some malformed input
		if r := recover(); r != nil {
			v.err = fmt.Errorf("%w: %s: malformed parquet file: %v", ErrData, name, r)
		}
	}()
	if cc, err := pr.MetaData().RowGroup(g).ColumnChunk(ci); err == nil {
		if size := cc.TotalUncompressedSize(); int64(cap(v.buf)) < size {
			v.buf = make([]byte, 0, size)
		}
	}
	cr, err := pr.RowGroup(g).Column(ci)
	if err != nil {
		v.err = fmt.Errorf("%w: %s: row group %d: %w", ErrData, name, g, err)
		return
	}
	br, ok := cr.(*file.ByteArrayColumnChunkReader)
	if !ok {
		v.err = fmt.Errorf("%w: %s: column %q: unexpected reader %T", ErrData, name, column, cr)
		return
	}
	const batch = 256
	vals := make([]parquet.ByteArray, batch)
	var defs []int16
	if maxDef > 0 {
		defs = make([]int16, batch)
	}
	for br.HasNext() {
		total, m, err := br.ReadBatchInPage(batch, vals, defs, nil)
		if err != nil {
			v.err = fmt.Errorf("%w: %s: row group %d: %w", ErrData, name, g, err)
			return
		}
		if int64(m) != total { // a NULL in the batch: none of it is used, as in the serial walk
			for i := range total {
				if defs[i] < maxDef {
					v.err = fmt.Errorf("%w: %s: row %d: column %q is NULL", ErrData, name, row+i, column)
					return
				}
			}
		}
		for _, b := range vals[:m] {
			v.buf = append(v.buf, b...)
			v.ends = append(v.ends, len(v.buf))
		}
		row += total
	}
}
