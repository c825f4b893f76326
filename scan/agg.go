package scan

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/ffkit/ffkit/scan/expr"
)

// aggSpec is one aggregate of --agg.
type aggSpec struct {
	fn   string // count, sum, min, max, mean
	star bool
	prog *expr.Program
	in   expr.Type
	name string
	// out is the Arrow type of the result.
	out arrow.DataType
}

// aggPlan is the compiled --group-by/--agg.
type aggPlan struct {
	keyPos   []int // positions of the key columns in the read schema
	keyNames []string
	keyTypes []arrow.DataType
	keyKinds []expr.Type
	aggs     []aggSpec
}

func compileAgg(readSchema *arrow.Schema, groupBy []string, aggs []expr.Item) (*aggPlan, error) {
	p := &aggPlan{}
	for _, k := range groupBy {
		n := resolveName(readSchema, k)
		idx := readSchema.FieldIndices(n)
		if len(idx) != 1 {
			return nil, fmt.Errorf("%w: --group-by column %q not found (columns: %s)", ErrSchema, k, fieldNames(readSchema))
		}
		f := readSchema.Field(idx[0])
		kind, ok := expr.TypeOf(f.Type)
		if !ok {
			return nil, fmt.Errorf("%w: cannot group by %q of type %s", ErrUsage, k, f.Type)
		}
		p.keyPos = append(p.keyPos, idx[0])
		p.keyNames = append(p.keyNames, f.Name)
		p.keyTypes = append(p.keyTypes, f.Type)
		p.keyKinds = append(p.keyKinds, kind)
	}
	for _, it := range aggs {
		c, ok := it.Expr.(*expr.Call)
		if !ok {
			return nil, fmt.Errorf("%w: --agg %q is not an aggregate call (count, sum, min, max, mean)", ErrUsage, it.Name)
		}
		s := aggSpec{fn: c.Name, star: c.Star, name: it.Name}
		if s.fn == "avg" {
			s.fn = "mean"
		}
		switch s.fn {
		case "count", "sum", "min", "max", "mean":
		default:
			return nil, fmt.Errorf("%w: unknown aggregate %s (want count, sum, min, max, mean)", ErrUsage, c.Name)
		}
		if c.Star {
			if s.fn != "count" {
				return nil, fmt.Errorf("%w: only count takes *", ErrUsage)
			}
			s.out = arrow.PrimitiveTypes.Int64
			p.aggs = append(p.aggs, s)
			continue
		}
		if len(c.Args) != 1 {
			return nil, fmt.Errorf("%w: %s takes one argument", ErrUsage, c.Name)
		}
		prog, err := expr.Compile(c.Args[0], readSchema)
		if err != nil {
			return nil, fmt.Errorf("--agg %s: %w", it.Name, err)
		}
		s.prog, s.in = prog, prog.Type()
		switch s.fn {
		case "count":
			s.out = arrow.PrimitiveTypes.Int64
		case "sum":
			switch s.in {
			case expr.TInt:
				s.out = arrow.PrimitiveTypes.Int64
			case expr.TFloat:
				s.out = arrow.PrimitiveTypes.Float64
			default:
				return nil, fmt.Errorf("%w: sum needs a number, %s is %s", ErrUsage, c.Args[0], s.in)
			}
		case "mean":
			if s.in != expr.TInt && s.in != expr.TFloat {
				return nil, fmt.Errorf("%w: mean needs a number, %s is %s", ErrUsage, c.Args[0], s.in)
			}
			s.out = arrow.PrimitiveTypes.Float64
		case "min", "max":
			if s.in == expr.TNull {
				s.out = arrow.Null
			} else if col, ok := c.Args[0].(*expr.Col); ok {
				s.out = readSchema.Field(readSchema.FieldIndices(resolveName(readSchema, col.Name))[0]).Type
			} else {
				s.out = expr.NaturalType(s.in)
			}
		}
		p.aggs = append(p.aggs, s)
	}
	if len(p.aggs) == 0 && len(p.keyPos) == 0 {
		return nil, fmt.Errorf("%w: --group-by needs --agg (or the other way round)", ErrUsage)
	}
	return p, nil
}

// outSchema is the group keys then the aggregates.
func (p *aggPlan) outSchema() *arrow.Schema {
	var fields []arrow.Field
	for i, n := range p.keyNames {
		fields = append(fields, arrow.Field{Name: n, Type: p.keyTypes[i], Nullable: true})
	}
	for _, a := range p.aggs {
		fields = append(fields, arrow.Field{Name: a.name, Type: a.out, Nullable: true})
	}
	return arrow.NewSchema(fields, nil)
}

// aggState holds one aggregate's running state for every group.
type aggState struct {
	cnt  []int64 // non-null inputs (rows for count(*))
	sumI []int64
	sumF []float64
	ext  expr.Vec // min/max so far; Null marks "no value yet"
}

// groupTable is a hash aggregation table (a partial aggregate: tables of
// several tasks merge into one).
type groupTable struct {
	plan  *aggPlan
	keys  []expr.Vec // one growing column per key
	n     int
	index map[string]int32 // encoded key -> group
	ints  *intTable        // single integer-like key
	null  int32            // group of the NULL key with ints; -1 none
	aggs  []aggState
	buf   []byte
}

func newGroupTable(p *aggPlan) *groupTable {
	t := &groupTable{plan: p, null: -1, index: map[string]int32{}}
	for _, k := range p.keyKinds {
		t.keys = append(t.keys, expr.Vec{T: k, Null: []bool{}})
	}
	if len(p.keyKinds) == 1 && (p.keyKinds[0] == expr.TInt || p.keyKinds[0] == expr.TDate || p.keyKinds[0] == expr.TTimestamp) {
		t.ints = newIntTable()
	}
	t.aggs = make([]aggState, len(p.aggs))
	for i, a := range p.aggs {
		if a.fn == "min" || a.fn == "max" {
			t.aggs[i].ext = expr.Vec{T: a.in}
		}
	}
	if len(p.keyKinds) == 0 {
		t.addGroup(nil, 0) // a global aggregate has exactly one group
	}
	return t
}

func (t *groupTable) addGroup(keys []expr.Vec, row int) int32 {
	g := int32(t.n)
	t.n++
	for k := range t.keys {
		kv := &t.keys[k]
		null := keys[k].IsNull(row)
		kv.Null = append(kv.Null, null)
		switch kv.T {
		case expr.TBool:
			kv.B = append(kv.B, !null && keys[k].B[row])
		case expr.TInt, expr.TDate, expr.TTimestamp:
			var v int64
			if !null {
				v = keys[k].I[row]
			}
			kv.I = append(kv.I, v)
		case expr.TFloat:
			var v float64
			if !null {
				v = keys[k].F[row]
			}
			kv.F = append(kv.F, v)
		case expr.TString:
			var v string
			if !null {
				v = strings.Clone(keys[k].S[row])
			}
			kv.S = append(kv.S, v)
		}
	}
	for i := range t.aggs {
		a := &t.aggs[i]
		a.cnt = append(a.cnt, 0)
		switch t.plan.aggs[i].fn {
		case "sum", "mean":
			a.sumI = append(a.sumI, 0)
			a.sumF = append(a.sumF, 0)
		case "min", "max":
			a.ext.Null = append(a.ext.Null, true)
			switch a.ext.T {
			case expr.TBool:
				a.ext.B = append(a.ext.B, false)
			case expr.TInt, expr.TDate, expr.TTimestamp:
				a.ext.I = append(a.ext.I, 0)
			case expr.TFloat:
				a.ext.F = append(a.ext.F, 0)
			case expr.TString:
				a.ext.S = append(a.ext.S, "")
			}
		}
	}
	return g
}

func (t *groupTable) encode(keys []expr.Vec, row int) []byte {
	b := t.buf[:0]
	for k := range keys {
		if keys[k].IsNull(row) {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		switch keys[k].T {
		case expr.TBool:
			if keys[k].B[row] {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		case expr.TInt, expr.TDate, expr.TTimestamp:
			b = binary.LittleEndian.AppendUint64(b, uint64(keys[k].I[row]))
		case expr.TFloat:
			f := keys[k].F[row]
			if f == 0 {
				f = 0 // -0 groups with 0
			}
			if f != f {
				f = math.NaN()
			}
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
		case expr.TString:
			b = binary.LittleEndian.AppendUint32(b, uint32(len(keys[k].S[row])))
			b = append(b, keys[k].S[row]...)
		}
	}
	t.buf = b
	return b
}

// groups maps every row of keys to its group, adding new groups.
func (t *groupTable) groups(keys []expr.Vec, n int) []int32 {
	gids := make([]int32, n)
	if len(keys) == 0 {
		return gids
	}
	if t.ints != nil {
		k := &keys[0]
		for i := 0; i < n; i++ {
			if k.IsNull(i) {
				if t.null < 0 {
					t.null = t.addGroup(keys, i)
				}
				gids[i] = t.null
				continue
			}
			slot, found := t.ints.find(k.I[i])
			if found {
				gids[i] = t.ints.group(slot)
				continue
			}
			g := t.addGroup(keys, i)
			t.ints.set(slot, k.I[i], g) // may grow the table: slot is stale after
			gids[i] = g
		}
		return gids
	}
	for i := 0; i < n; i++ {
		b := t.encode(keys, i)
		g, ok := t.index[string(b)]
		if !ok {
			g = t.addGroup(keys, i)
			t.index[string(b)] = g
		}
		gids[i] = g
	}
	return gids
}

// add aggregates a batch of the read schema.
func (t *groupTable) add(rec arrow.RecordBatch) error {
	n := int(rec.NumRows())
	var gids []int32
	if d, ok := dictKey(rec, t.plan.keyPos); ok {
		var err error
		if gids, err = t.groupsDict(d); err != nil {
			return err
		}
	} else {
		keys := make([]expr.Vec, len(t.plan.keyPos))
		for i, p := range t.plan.keyPos {
			v, err := expr.FromArrow(rec.Column(p))
			if err != nil {
				return err
			}
			keys[i] = v
		}
		gids = t.groups(keys, n)
	}
	for ai, spec := range t.plan.aggs {
		a := &t.aggs[ai]
		if spec.star {
			for _, g := range gids {
				a.cnt[g]++
			}
			continue
		}
		v, err := spec.prog.Eval(rec)
		if err != nil {
			return err
		}
		if v.Null == nil && !v.Scalar && a.fast(spec.fn, &v, gids) {
			continue
		}
		m := -1
		if v.Scalar {
			m = 0
		}
		for i, g := range gids {
			j := i & m
			if v.IsNull(j) {
				continue
			}
			a.cnt[g]++
			switch spec.fn {
			case "sum", "mean":
				if v.T == expr.TInt {
					a.sumI[g] += v.I[j]
				} else {
					a.sumF[g] += v.F[j]
				}
			case "min", "max":
				a.update(g, &v, j, spec.fn == "min")
			}
		}
	}
	return nil
}

func (a *aggState) update(g int32, v *expr.Vec, j int, isMin bool) {
	e := &a.ext
	first := e.Null[g]
	e.Null[g] = false
	better := func(c int) bool { return first || (isMin && c < 0) || (!isMin && c > 0) }
	switch v.T {
	case expr.TInt, expr.TDate, expr.TTimestamp:
		if better(cmp.Compare(v.I[j], e.I[g])) {
			e.I[g] = v.I[j]
		}
	case expr.TFloat:
		if better(cmpFloat(v.F[j], e.F[g])) {
			e.F[g] = v.F[j]
		}
	case expr.TString:
		if better(strings.Compare(v.S[j], e.S[g])) {
			e.S[g] = strings.Clone(v.S[j])
		}
	case expr.TBool:
		x, y := 0, 0
		if v.B[j] {
			x = 1
		}
		if e.B[g] {
			y = 1
		}
		if better(x - y) {
			e.B[g] = v.B[j]
		}
	}
}

// cmpFloat orders floats as SQL engines do: NaN above everything.
func cmpFloat(a, b float64) int {
	an, bn := a != a, b != b
	switch {
	case an && bn:
		return 0
	case an:
		return 1
	case bn:
		return -1
	}
	return cmp.Compare(a, b)
}

// merge folds the partial aggregate o into t.
func (t *groupTable) merge(o *groupTable) {
	var gids []int32
	if len(t.keys) == 0 {
		gids = make([]int32, o.n)
	} else {
		gids = t.groups(o.keys, o.n)
	}
	for ai, spec := range t.plan.aggs {
		a, b := &t.aggs[ai], &o.aggs[ai]
		for og, g := range gids {
			if spec.star || spec.fn == "count" {
				a.cnt[g] += b.cnt[og]
				continue
			}
			if b.cnt[og] == 0 {
				continue
			}
			a.cnt[g] += b.cnt[og]
			switch spec.fn {
			case "sum", "mean":
				a.sumI[g] += b.sumI[og]
				a.sumF[g] += b.sumF[og]
			case "min", "max":
				a.update(g, &b.ext, og, spec.fn == "min")
			}
		}
	}
}

// result builds the output batch: one row per group, sorted by the keys
// (NULLs last) so that the output is deterministic.
func (t *groupTable) result() (arrow.RecordBatch, error) {
	order := make([]int, t.n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int {
		for k := range t.keys {
			kv := &t.keys[k]
			xn, yn := kv.Null[x], kv.Null[y]
			if xn || yn {
				if xn && yn {
					continue
				}
				if xn {
					return 1
				}
				return -1
			}
			var c int
			switch kv.T {
			case expr.TInt, expr.TDate, expr.TTimestamp:
				c = cmp.Compare(kv.I[x], kv.I[y])
			case expr.TFloat:
				c = cmpFloat(kv.F[x], kv.F[y])
			case expr.TString:
				c = strings.Compare(kv.S[x], kv.S[y])
			case expr.TBool:
				c = cmp.Compare(b2i(kv.B[x]), b2i(kv.B[y]))
			}
			if c != 0 {
				return c
			}
		}
		return 0
	})
	sc := t.plan.outSchema()
	var cols []arrow.Array
	release := func() {
		for _, c := range cols {
			c.Release()
		}
	}
	for k := range t.keys {
		v := permute(&t.keys[k], order)
		a, err := v.Array(memory.DefaultAllocator, t.n, t.plan.keyTypes[k])
		if err != nil {
			release()
			return nil, err
		}
		cols = append(cols, a)
	}
	for ai, spec := range t.plan.aggs {
		a := &t.aggs[ai]
		var v expr.Vec
		switch spec.fn {
		case "count":
			v = expr.Vec{T: expr.TInt, I: make([]int64, t.n)}
			for i, g := range order {
				v.I[i] = a.cnt[g]
			}
		case "sum":
			v = expr.Vec{T: expr.TInt, Null: make([]bool, t.n)}
			if spec.in == expr.TFloat {
				v.T = expr.TFloat
			}
			for _, g := range order {
				v.I = append(v.I, a.sumI[g])
				v.F = append(v.F, a.sumF[g])
			}
			for i, g := range order {
				v.Null[i] = a.cnt[g] == 0
			}
		case "mean":
			v = expr.Vec{T: expr.TFloat, F: make([]float64, t.n), Null: make([]bool, t.n)}
			for i, g := range order {
				if a.cnt[g] == 0 {
					v.Null[i] = true
					continue
				}
				s := a.sumF[g]
				if spec.in == expr.TInt {
					s = float64(a.sumI[g])
				}
				v.F[i] = s / float64(a.cnt[g])
			}
		case "min", "max":
			v = permute(&a.ext, order)
		}
		arr, err := v.Array(memory.DefaultAllocator, t.n, spec.out)
		if err != nil {
			release()
			return nil, err
		}
		cols = append(cols, arr)
	}
	rec := array.NewRecordBatch(sc, cols, int64(t.n))
	release()
	return rec, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func permute(v *expr.Vec, order []int) expr.Vec {
	out := expr.Vec{T: v.T}
	if v.Null != nil {
		out.Null = make([]bool, len(order))
		for i, g := range order {
			out.Null[i] = v.Null[g]
		}
	}
	switch v.T {
	case expr.TBool:
		out.B = make([]bool, len(order))
		for i, g := range order {
			out.B[i] = v.B[g]
		}
	case expr.TInt, expr.TDate, expr.TTimestamp:
		out.I = make([]int64, len(order))
		for i, g := range order {
			out.I[i] = v.I[g]
		}
	case expr.TFloat:
		out.F = make([]float64, len(order))
		for i, g := range order {
			out.F[i] = v.F[g]
		}
	case expr.TString:
		out.S = make([]string, len(order))
		for i, g := range order {
			out.S[i] = v.S[g]
		}
	case expr.TNull:
		out.Null = make([]bool, len(order))
		for i := range out.Null {
			out.Null[i] = true
		}
	}
	return out
}

func dictKey(rec arrow.RecordBatch, keyPos []int) (*array.Dictionary, bool) {
	if len(keyPos) != 1 {
		return nil, false
	}
	d, ok := rec.Column(keyPos[0]).(*array.Dictionary)
	return d, ok
}

// groupsDict maps rows to groups through the dictionary: each distinct
// dictionary entry is looked up once, each row costs an index.
func (t *groupTable) groupsDict(d *array.Dictionary) ([]int32, error) {
	dv, err := expr.FromArrow(d.Dictionary())
	if err != nil {
		return nil, err
	}
	n := d.Len()
	gids := make([]int32, n)
	memo := make([]int32, dv.Len())
	for i := range memo {
		memo[i] = -1
	}
	one := []expr.Vec{dv}
	nullKey := []expr.Vec{{T: dv.T, Null: []bool{true}, S: []string{""}}}
	idx32, _ := d.Indices().(*array.Int32)
	for i := 0; i < n; i++ {
		if d.IsNull(i) {
			gids[i] = t.lookup(nullKey, 0)
			continue
		}
		var k int
		if idx32 != nil {
			k = int(idx32.Value(i))
		} else {
			k = d.GetValueIndex(i)
		}
		g := memo[k]
		if g < 0 {
			g = t.lookup(one, k)
			memo[k] = g
		}
		gids[i] = g
	}
	return gids, nil
}

// lookup finds or adds the group of row i of keys.
func (t *groupTable) lookup(keys []expr.Vec, i int) int32 {
	b := t.encode(keys, i)
	g, ok := t.index[string(b)]
	if !ok {
		g = t.addGroup(keys, i)
		t.index[string(b)] = g
	}
	return g
}

// fast runs the common aggregates over a vector without nulls in tight
// loops; it reports false for the cases it leaves to the general loop.
func (a *aggState) fast(fn string, v *expr.Vec, gids []int32) bool {
	switch {
	case fn == "count":
		for _, g := range gids {
			a.cnt[g]++
		}
	case (fn == "sum" || fn == "mean") && v.T == expr.TInt:
		x := v.I[:len(gids)]
		for i, g := range gids {
			a.cnt[g]++
			a.sumI[g] += x[i]
		}
	case (fn == "sum" || fn == "mean") && v.T == expr.TFloat:
		x := v.F[:len(gids)]
		for i, g := range gids {
			a.cnt[g]++
			a.sumF[g] += x[i]
		}
	case (fn == "min" || fn == "max") && v.T == expr.TFloat:
		x, e := v.F[:len(gids)], &a.ext
		isMin := fn == "min"
		for i, g := range gids {
			a.cnt[g]++
			f := x[i]
			if e.Null[g] {
				e.Null[g], e.F[g] = false, f
				continue
			}
			if f != f || e.F[g] != e.F[g] {
				if cmpFloat(f, e.F[g]) < 0 == isMin && cmpFloat(f, e.F[g]) != 0 {
					e.F[g] = f
				}
				continue
			}
			if isMin && f < e.F[g] || !isMin && f > e.F[g] {
				e.F[g] = f
			}
		}
	case (fn == "min" || fn == "max") && (v.T == expr.TInt || v.T == expr.TDate || v.T == expr.TTimestamp):
		x, e := v.I[:len(gids)], &a.ext
		isMin := fn == "min"
		for i, g := range gids {
			a.cnt[g]++
			n := x[i]
			if e.Null[g] {
				e.Null[g], e.I[g] = false, n
				continue
			}
			if isMin && n < e.I[g] || !isMin && n > e.I[g] {
				e.I[g] = n
			}
		}
	default:
		return false
	}
	return true
}

// intTable is an open-addressing (linear probing) hash table from int64
// keys to group numbers, for the common single-integer group key. Key and
// group share a slot, so a probe costs one cache miss.
type intTable struct {
	slots []intSlot
	mask  uint64
	n     int
}

type intSlot struct {
	key int64
	val int32 // group + 1; 0 marks an empty slot
}

func newIntTable() *intTable {
	const size = 1024
	return &intTable{slots: make([]intSlot, size), mask: size - 1}
}

// find returns the slot of k, or the empty slot where it would go.
func (t *intTable) find(k int64) (int, bool) {
	i := mix(uint64(k)) & t.mask
	for {
		s := &t.slots[i]
		if s.val == 0 {
			return int(i), false
		}
		if s.key == k {
			return int(i), true
		}
		i = (i + 1) & t.mask
	}
}

// group is the group in a slot find reported as found.
func (t *intTable) group(slot int) int32 { return t.slots[slot].val - 1 }

// set stores k -> g in the empty slot found for k, growing the table.
func (t *intTable) set(slot int, k int64, g int32) {
	t.slots[slot] = intSlot{k, g + 1}
	t.n++
	if uint64(t.n)*2 > t.mask {
		old := t.slots
		size := (t.mask + 1) * 2
		t.slots, t.mask = make([]intSlot, size), size-1
		for _, s := range old {
			if s.val != 0 {
				j, _ := t.find(s.key)
				t.slots[j] = s
			}
		}
	}
}
