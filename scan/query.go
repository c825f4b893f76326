package scan

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/compute"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/scan/expr"
)

// unit is a piece of work: rows [lo, hi) of one row group of one file
// (hi < 0: the whole row group).
type unit struct {
	file   *File
	rg     int
	lo, hi int64
}

func (u unit) rows() int64 {
	if u.hi < 0 {
		return u.file.RowGroupRows(u.rg)
	}
	return u.hi - u.lo
}

// query is the compiled native part of a job: what to read, the filter and
// the output columns.
type query struct {
	readNames  []string
	readSchema *arrow.Schema
	whereNode  expr.Node
	where      *expr.Program // compiled against the filter columns only
	filterPos  []int         // positions in readNames the filter reads
	otherPos   []int         // the rest
	items      []outItem
	outSchema  *arrow.Schema
	idx        indexCache
	// dict marks read columns (by position) decoded as dictionaries
	dict []bool
	// keepDict: project passes dictionary columns through (to a Parquet
	// sink, which writes their indices) instead of decoding them
	keepDict bool
	// pageCol is the position of the filter's only column (-1: the filter
	// reads none or several); its page index can prune pages
	pageCol      int
	pagesSkipped atomic.Int64
}

func pick(b []bool, pos []int) []bool {
	if b == nil {
		return nil
	}
	out := make([]bool, len(pos))
	for i, p := range pos {
		out[i] = b[p]
	}
	return out
}

type outItem struct {
	name string
	pos  int           // position in readNames, or -1
	prog *expr.Program // computed column
}

// compileQuery binds the select list and filter to the source. extra names
// columns some later step needs (hash keys, aggregate inputs).
func compileQuery(src *Source, columns, where string, extra []string) (*query, error) {
	q := &query{pageCol: -1}
	var items []expr.Item
	if columns != "" {
		list, err := expr.ParseList(columns)
		if err != nil {
			return nil, fmt.Errorf("--columns: %w", err)
		}
		for _, it := range list {
			if c, ok := it.Expr.(*expr.Col); ok && c.Name == "*" && it.Name == "*" {
				for _, f := range src.Files[0].Schema.Fields() {
					items = append(items, expr.Item{Expr: &expr.Col{Name: f.Name}, Name: f.Name})
				}
				continue
			}
			items = append(items, it)
		}
	} else {
		for _, f := range src.Files[0].Schema.Fields() {
			items = append(items, expr.Item{Expr: &expr.Col{Name: f.Name}, Name: f.Name})
		}
	}
	need := func(n string) {
		if !slices.Contains(q.readNames, n) {
			q.readNames = append(q.readNames, n)
		}
	}
	if where != "" {
		n, err := expr.Parse(where)
		if err != nil {
			return nil, fmt.Errorf("--where: %w", err)
		}
		q.whereNode = n
	}
	for _, it := range items {
		for _, c := range expr.Columns(it.Expr) {
			need(resolveName(src.Files[0].Schema, c))
		}
	}
	if q.whereNode != nil {
		for _, c := range expr.Columns(q.whereNode) {
			need(resolveName(src.Files[0].Schema, c))
		}
	}
	for _, c := range extra {
		need(resolveName(src.Files[0].Schema, c))
	}
	sc, err := src.Schema(q.readNames)
	if err != nil {
		return nil, err
	}
	q.readSchema = sc
	if q.whereNode != nil {
		var ffields []arrow.Field
		fcols := expr.Columns(q.whereNode)
		for i, n := range q.readNames {
			isF := false
			for _, c := range fcols {
				if resolveName(src.Files[0].Schema, c) == n {
					isF = true
				}
			}
			if isF {
				q.filterPos = append(q.filterPos, i)
				ffields = append(ffields, sc.Field(i))
			} else {
				q.otherPos = append(q.otherPos, i)
			}
		}
		if len(q.filterPos) == 1 {
			q.pageCol = q.filterPos[0]
		}
		// string filter columns are decoded as dictionaries: a one-column
		// filter then runs once per distinct value (expr's evalDict), and
		// the others index the dictionary instead of copying every string
		for _, p := range q.filterPos {
			switch sc.Field(p).Type.ID() {
			case arrow.STRING, arrow.LARGE_STRING, arrow.BINARY, arrow.LARGE_BINARY:
				if q.dict == nil {
					q.dict = make([]bool, len(q.readNames))
				}
				q.dict[p] = true
			}
		}
		q.where, err = expr.Compile(q.whereNode, arrow.NewSchema(ffields, nil))
		if err != nil {
			return nil, fmt.Errorf("--where: %w", err)
		}
		if t := q.where.Type(); t != expr.TBool && t != expr.TNull {
			return nil, fmt.Errorf("%w: --where must be a boolean expression, %s is %s", ErrUsage, where, t)
		}
	}
	var fields []arrow.Field
	seen := map[string]bool{}
	for _, it := range items {
		if seen[it.Name] {
			return nil, fmt.Errorf("%w: output column %q appears twice; rename one with AS", ErrUsage, it.Name)
		}
		seen[it.Name] = true
		if c, ok := it.Expr.(*expr.Col); ok {
			pos := slices.Index(q.readNames, resolveName(src.Files[0].Schema, c.Name))
			f := sc.Field(pos)
			f.Name = it.Name
			q.items = append(q.items, outItem{name: it.Name, pos: pos})
			fields = append(fields, f)
			continue
		}
		p, err := expr.Compile(it.Expr, sc)
		if err != nil {
			return nil, fmt.Errorf("--columns: %w", err)
		}
		q.items = append(q.items, outItem{name: it.Name, pos: -1, prog: p})
		fields = append(fields, arrow.Field{Name: it.Name, Type: expr.NaturalType(p.Type()), Nullable: true})
	}
	q.outSchema = arrow.NewSchema(fields, nil)
	return q, nil
}

// passDictionaries reads the string columns as dictionaries and keeps
// them so through project: for a shuffle into Parquet files, which then
// write the indices (dictionary pass-through, see sinkdict.go). Call it
// before the query is shared.
func (q *query) passDictionaries() {
	for p, f := range q.readSchema.Fields() {
		if f.Type.ID() == arrow.STRING {
			if q.dict == nil {
				q.dict = make([]bool, len(q.readNames))
			}
			q.dict[p] = true
			q.keepDict = true
		}
	}
}

// resolveName maps a column reference to the schema's spelling (SQL
// identifiers are case-insensitive when unambiguous).
func resolveName(sc *arrow.Schema, n string) string {
	if len(sc.FieldIndices(n)) > 0 {
		return n
	}
	found := ""
	for _, f := range sc.Fields() {
		if equalFold(f.Name, n) {
			if found != "" {
				return n
			}
			found = f.Name
		}
	}
	if found == "" {
		return n
	}
	return found
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// mayMatch reports whether row group rg of f can hold a row the filter keeps.
func (q *query) mayMatch(f *File, rg int) bool {
	if q.whereNode == nil {
		return true
	}
	return expr.MayMatch(q.whereNode, func(col string) (expr.Stats, bool) {
		idx := f.Schema.FieldIndices(resolveName(f.Schema, col))
		if len(idx) != 1 {
			return expr.Stats{}, false
		}
		return f.Stats(rg, idx[0])
	})
}

func (q *query) fileCols(f *File, pos []int) []int {
	all := q.idx.of(f, q.readNames)
	out := make([]int, len(pos))
	for i, p := range pos {
		out[i] = all[p]
	}
	return out
}

func allPos(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	return p
}

// read reads unit u and applies the filter. It returns nil when no row
// passes. The batch has readSchema; the caller releases it. The filter
// columns are read first; the others only when some row passes.
func (q *query) read(ctx context.Context, u unit) (arrow.RecordBatch, error) {
	if q.where != nil && u.hi < 0 && FastPath && q.pageCol >= 0 {
		if ranges, ok := q.pagePrune(u); ok {
			if len(ranges) == 0 {
				return nil, nil
			}
			var recs []arrow.RecordBatch
			defer func() { releaseBatches(recs) }()
			for _, r := range ranges {
				rec, err := q.readRange(ctx, unit{file: u.file, rg: u.rg, lo: r[0], hi: r[1]})
				if err != nil {
					return nil, err
				}
				if rec != nil {
					recs = append(recs, rec)
				}
			}
			return concatBatches(recs)
		}
	}
	if rec, ok, err := q.readFlat(u); ok {
		return rec, err
	}
	return q.readRange(ctx, u)
}

// pagePrune narrows a row group to the row ranges whose pages the column
// index of the filter's one column does not rule out. ok is false when
// the page index does not help (absent, or no page ruled out).
func (q *query) pagePrune(u unit) ([][2]int64, bool) {
	fc := q.fileCols(u.file, []int{q.pageCol})[0]
	ranges, _, skipped, ok := u.file.pageRanges(u.rg, fc, q.whereNode)
	if !ok || skipped == 0 {
		return nil, false
	}
	if len(ranges) > 1 {
		// columns off the fast path are decoded whole for every range:
		// worth it for one range only
		for _, c := range q.fileCols(u.file, allPos(len(q.readNames))) {
			if !u.file.fastOK(c) {
				return nil, false
			}
		}
	}
	q.pagesSkipped.Add(int64(skipped))
	return ranges, true
}

// concatBatches joins batches of one schema into one (and releases them).
func concatBatches(recs []arrow.RecordBatch) (arrow.RecordBatch, error) {
	switch len(recs) {
	case 0:
		return nil, nil
	case 1:
		recs[0].Retain()
		return recs[0], nil
	}
	cols := make([]arrow.Array, recs[0].NumCols())
	var n int64
	for _, r := range recs {
		n += r.NumRows()
	}
	for i := range cols {
		parts := make([]arrow.Array, len(recs))
		for j, r := range recs {
			parts[j] = r.Column(i)
		}
		a, err := array.Concatenate(parts, memory.DefaultAllocator)
		if err != nil {
			for _, c := range cols[:i] {
				c.Release()
			}
			return nil, err
		}
		cols[i] = a
	}
	out := array.NewRecordBatch(recs[0].Schema(), cols, n)
	for _, c := range cols {
		c.Release()
	}
	return out, nil
}

// readRange reads the rows of u (a whole row group or a row range) and
// applies the filter.
func (q *query) readRange(ctx context.Context, u unit) (arrow.RecordBatch, error) {
	lo, hi := u.lo, u.hi
	if hi < 0 {
		lo = 0
	}
	if q.where == nil && len(q.readNames) == 0 {
		// count(*) alone reads no column: the batch is just its length
		// (a reader given no columns returns them all)
		n := hi - lo
		if hi < 0 {
			n = u.file.RowGroupRows(u.rg)
		}
		return array.NewRecordBatch(q.readSchema, nil, n), nil
	}
	if q.where == nil {
		r, err := u.file.readRowGroup(ctx, u.rg, q.fileCols(u.file, allPos(len(q.readNames))), q.dict, lo, hi)
		if err != nil {
			return nil, err
		}
		return q.conform(r), nil
	}
	fr, err := u.file.readRowGroup(ctx, u.rg, q.fileCols(u.file, q.filterPos), pick(q.dict, q.filterPos), lo, hi)
	if err != nil {
		return nil, err
	}
	defer fr.Release()
	mask, err := q.where.Eval(fr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", u.file.Path, err)
	}
	n := int(fr.NumRows())
	pass := 0
	if mask.T == expr.TBool && !mask.Scalar && mask.Null == nil {
		for _, b := range mask.B[:n] {
			if b {
				pass++
			}
		}
	} else {
		for i := 0; i < n; i++ {
			if mask.True(i) {
				pass++
			}
		}
	}
	if pass == 0 {
		return nil, nil
	}
	cols := make([]arrow.Array, len(q.readNames))
	for i, p := range q.filterPos {
		cols[p] = fr.Column(i)
	}
	if len(q.otherPos) > 0 {
		or, err := u.file.readRowGroup(ctx, u.rg, q.fileCols(u.file, q.otherPos), pick(q.dict, q.otherPos), lo, hi)
		if err != nil {
			return nil, err
		}
		defer or.Release()
		for i, p := range q.otherPos {
			cols[p] = or.Column(i)
		}
	}
	full := array.NewRecordBatch(q.schemaFor(cols), cols, int64(n))
	if pass == n {
		return full, nil
	}
	defer full.Release()
	bm := memory.NewResizableBuffer(memory.DefaultAllocator)
	bm.Resize(int(bitutil.BytesForBits(int64(n))))
	bits := bm.Bytes()
	if mask.T == expr.TBool && !mask.Scalar && mask.Null == nil {
		for i, b := range mask.B[:n] {
			if b {
				bitutil.SetBit(bits, i)
			}
		}
	} else {
		for i := 0; i < n; i++ {
			if mask.True(i) {
				bitutil.SetBit(bits, i)
			}
		}
	}
	filter := array.NewBoolean(n, bm, nil, 0)
	bm.Release()
	defer filter.Release()
	out, err := compute.FilterRecordBatch(ctx, full, filter, compute.DefaultFilterOptions())
	if err != nil {
		return nil, fmt.Errorf("scan: filter %s: %w", u.file.Path, err)
	}
	return out, nil
}

// schemaFor is readSchema unless the decoder returned other physical
// types (a dictionary array for a string column).
func (q *query) schemaFor(cols []arrow.Array) *arrow.Schema {
	for i, c := range cols {
		if !arrow.TypeEqual(c.DataType(), q.readSchema.Field(i).Type) {
			fields := slices.Clone(q.readSchema.Fields())
			for j, c := range cols {
				fields[j].Type = c.DataType()
			}
			return arrow.NewSchema(fields, nil)
		}
	}
	return q.readSchema
}

// conform relabels a batch read with file indices to readSchema's names.
func (q *query) conform(r arrow.RecordBatch) arrow.RecordBatch {
	if r.Schema().Equal(q.readSchema) {
		return r
	}
	out := array.NewRecordBatch(q.schemaFor(r.Columns()), r.Columns(), r.NumRows())
	r.Release()
	return out
}

// project computes the output columns from a batch of readSchema.
func (q *query) project(rec arrow.RecordBatch) (arrow.RecordBatch, error) {
	n := int(rec.NumRows())
	cols := make([]arrow.Array, len(q.items))
	fields := slices.Clone(q.outSchema.Fields())
	for i, it := range q.items {
		if it.pos >= 0 {
			cols[i] = rec.Column(it.pos)
			if d, ok := cols[i].(*array.Dictionary); ok && !q.keepDict && !arrow.TypeEqual(q.readSchema.Field(it.pos).Type, d.DataType()) {
				plain, err := undict(d, q.readSchema.Field(it.pos).Type)
				if err != nil {
					for _, c := range cols[:i] {
						c.Release()
					}
					return nil, fmt.Errorf("column %s: %w", it.name, err)
				}
				cols[i] = plain
			} else {
				cols[i].Retain()
			}
			fields[i].Type = cols[i].DataType()
			continue
		}
		v, err := it.prog.Eval(rec)
		if err == nil {
			cols[i], err = v.Array(memory.DefaultAllocator, n, nil)
		}
		if err != nil {
			for _, c := range cols[:i] {
				c.Release()
			}
			return nil, fmt.Errorf("column %s: %w", it.name, err)
		}
	}
	out := array.NewRecordBatch(arrow.NewSchema(fields, nil), cols, int64(n))
	for _, c := range cols {
		c.Release()
	}
	return out, nil
}

// orderedMap runs work(i) for i in [0, n) on par goroutines and hands the
// results to consume in index order, never concurrently, keeping at most
// orderedWindow*par results in flight. There is no feeder or consumer
// goroutine: workers claim indices in order, and the worker that completes
// the next result to consume drains every result ready in order (another
// worker finishing meanwhile just leaves its result and goes on). Fewer
// hand-offs between goroutines mean fewer thread wake-ups, which a busy
// shared machine makes slow; and the window is wide enough that a worker
// whose thread the OS has descheduled does not stall the others at once.
// release frees results that are not consumed after an error.
func orderedMap[T any](ctx context.Context, n, par int, work func(context.Context, int) (T, error),
	consume func(int, T) error, release func(T)) error {
	if par < 1 {
		par = 1
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		ready    = map[int]T{} // done, not consumed; guarded by mu
		head     int           // next index to consume; guarded by mu
		draining bool          // a worker is consuming; guarded by mu
		firstErr error         // guarded by mu
		claimed  atomic.Int64
	)
	window := make(chan struct{}, orderedWindow*par)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	var g errgroup.Group
	for w := 0; w < par; w++ {
		g.Go(func() error {
			for {
				select {
				case window <- struct{}{}:
				case <-wctx.Done():
					return nil
				}
				i := int(claimed.Add(1) - 1)
				if i >= n {
					return nil
				}
				v, err := work(wctx, i)
				if err != nil {
					fail(err)
					return nil
				}
				mu.Lock()
				ready[i] = v
				if draining {
					mu.Unlock()
					continue
				}
				draining = true
				for firstErr == nil {
					v, ok := ready[head]
					if !ok {
						break
					}
					delete(ready, head)
					idx := head
					head++
					mu.Unlock()
					err := consume(idx, v)
					<-window
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
						cancel()
					}
				}
				draining = false
				mu.Unlock()
			}
		})
	}
	g.Wait()
	for _, v := range ready {
		release(v)
	}
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if head != n {
		return fmt.Errorf("scan: %d of %d results consumed", head, n) // not reached
	}
	return nil
}

// orderedWindow is orderedMap's results in flight per worker.
const orderedWindow = 4

func releaseBatch(r arrow.RecordBatch) {
	if r != nil {
		r.Release()
	}
}

// ScanOptions configure Scan.
type ScanOptions struct {
	// Columns is a select list ("a, b, x*2 AS y"); empty means every column.
	Columns string
	// Where is a SQL boolean filter; empty keeps every row.
	Where string
	// Workers bounds the row groups decoded at once. Default GOMAXPROCS.
	Workers int
}

// ScanStats are the counters of a Scan.
type ScanStats struct {
	Files            int   `json:"files"`
	RowsIn           int64 `json:"rows_in"`
	RowsOut          int64 `json:"rows_out"`
	BytesRead        int64 `json:"bytes_read"`
	RowGroups        int   `json:"row_groups"`
	RowGroupsSkipped int   `json:"row_groups_skipped"`
	PagesSkipped     int64 `json:"pages_skipped"`
}

// Scan reads the Parquet inputs (files, globs, directories), filters and
// projects them, and calls fn with each non-empty batch in input order
// (file, then row group). Batches are released after fn returns: fn must
// Retain what it keeps. fn is never called concurrently.
func Scan(ctx context.Context, inputs []string, opts ScanOptions, fn func(arrow.RecordBatch) error) (*ScanStats, error) {
	workers := opts.Workers
	if workers <= 0 {
		workers = defaultWorkers()
	}
	src, err := OpenSource(ctx, inputs, workers)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	q, err := compileQuery(src, opts.Columns, opts.Where, nil)
	if err != nil {
		return nil, err
	}
	st := &ScanStats{Files: len(src.Files), RowsIn: src.Rows()}
	var units []unit
	for _, f := range src.Files {
		for rg := 0; rg < f.NumRowGroups(); rg++ {
			st.RowGroups++
			if !q.mayMatch(f, rg) {
				st.RowGroupsSkipped++
				continue
			}
			units = append(units, unit{file: f, rg: rg, hi: -1})
		}
	}
	var rowsOut atomic.Int64
	err = orderedMap(ctx, len(units), workers,
		func(ctx context.Context, i int) (arrow.RecordBatch, error) {
			r, err := q.read(ctx, units[i])
			if err != nil || r == nil {
				return nil, err
			}
			defer r.Release()
			return q.project(r)
		},
		func(i int, r arrow.RecordBatch) error {
			if r == nil {
				return nil
			}
			defer r.Release()
			rowsOut.Add(r.NumRows())
			return fn(r)
		}, releaseBatch)
	st.RowsOut = rowsOut.Load()
	st.BytesRead = src.BytesRead.Load()
	st.PagesSkipped = q.pagesSkipped.Load()
	return st, err
}

// undict decodes a dictionary array into a plain array of type dt.
func undict(d *array.Dictionary, dt arrow.DataType) (arrow.Array, error) {
	return compute.TakeArray(context.Background(), d.Dictionary(), d.Indices())
}
