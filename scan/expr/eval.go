package expr

import (
	"cmp"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// Program is an expression compiled against a schema.
type Program struct {
	root *cnode
	Node Node
	// Cols are the schema indices of the columns the expression reads.
	Cols []int
}

// Type is the kind of value the program returns.
func (p *Program) Type() Type { return p.root.t }

type cnode struct {
	t     Type
	konst *Value // non-nil for constants
	eval  func(c *ctx) Vec
}

type ctx struct {
	batch arrow.RecordBatch
	n     int
	cache map[int]Vec
	err   error
}

// Compile binds n to schema.
func Compile(n Node, schema *arrow.Schema) (*Program, error) {
	b := &binder{schema: schema, seen: map[int]bool{}}
	root, err := b.node(n)
	if err != nil {
		return nil, err
	}
	return &Program{root: root, Node: n, Cols: b.cols}, nil
}

// Eval evaluates the program over batch. The batch must have the schema the
// program was compiled against.
func (p *Program) Eval(batch arrow.RecordBatch) (Vec, error) {
	if len(p.Cols) == 1 {
		if d, ok := batch.Column(p.Cols[0]).(*array.Dictionary); ok {
			return p.evalDict(d)
		}
	}
	c := &ctx{batch: batch, n: int(batch.NumRows()), cache: map[int]Vec{}}
	v := p.root.eval(c)
	if c.err != nil {
		return Vec{}, c.err
	}
	return v, nil
}

type binder struct {
	schema *arrow.Schema
	cols   []int
	seen   map[int]bool
}

func typeErr(n Node, format string, args ...any) error {
	return fmt.Errorf("%w: %s in %s", ErrType, fmt.Sprintf(format, args...), n.String())
}

func constNode(v Value) *cnode {
	vv := v
	return &cnode{t: v.T, konst: &vv, eval: func(*ctx) Vec { return scalarOf(vv) }}
}

func scalarOf(v Value) Vec {
	out := Vec{T: v.T, Scalar: true}
	if v.Null || v.T == TNull {
		out.Null = []bool{true}
	}
	switch v.T {
	case TBool:
		out.B = []bool{v.B}
	case TInt, TDate, TTimestamp:
		out.I = []int64{v.I}
	case TFloat:
		out.F = []float64{v.F}
	case TString:
		out.S = []string{v.S}
	}
	return out
}

func (b *binder) node(n Node) (*cnode, error) {
	switch x := n.(type) {
	case *Lit:
		return constNode(x.V), nil
	case *Col:
		idx := b.schema.FieldIndices(x.Name)
		if len(idx) == 0 {
			// fall back to a case-insensitive match, as SQL does
			for i, f := range b.schema.Fields() {
				if strings.EqualFold(f.Name, x.Name) {
					idx = append(idx, i)
				}
			}
		}
		if len(idx) != 1 {
			var names []string
			for _, f := range b.schema.Fields() {
				names = append(names, f.Name)
			}
			if len(idx) == 0 {
				return nil, fmt.Errorf("%w: unknown column %q (columns: %s)", ErrType, x.Name, strings.Join(names, ", "))
			}
			return nil, fmt.Errorf("%w: ambiguous column %q", ErrType, x.Name)
		}
		i := idx[0]
		t, ok := TypeOf(b.schema.Field(i).Type)
		if !ok {
			return nil, fmt.Errorf("%w: column %q has type %s, which expressions do not support", ErrType, x.Name, b.schema.Field(i).Type)
		}
		if !b.seen[i] {
			b.seen[i] = true
			b.cols = append(b.cols, i)
		}
		return &cnode{t: t, eval: func(c *ctx) Vec {
			if v, ok := c.cache[i]; ok {
				return v
			}
			v, err := FromArrow(c.batch.Column(i))
			if err != nil && c.err == nil {
				c.err = err
			}
			c.cache[i] = v
			return v
		}}, nil
	case *Unary:
		a, err := b.node(x.X)
		if err != nil {
			return nil, err
		}
		if x.Op == "NOT" {
			if a.t != TBool && a.t != TNull {
				return nil, typeErr(n, "NOT needs a boolean, got %s", a.t)
			}
			return &cnode{t: TBool, eval: func(c *ctx) Vec { return notVec(a.eval(c)) }}, nil
		}
		if !a.t.numeric() && a.t != TNull {
			return nil, typeErr(n, "unary minus needs a number, got %s", a.t)
		}
		zero := constNode(Value{T: TInt})
		return b.arith(n, "-", zero, a)
	case *Binary:
		l, err := b.node(x.L)
		if err != nil {
			return nil, err
		}
		r, err := b.node(x.R)
		if err != nil {
			return nil, err
		}
		switch x.Op {
		case "AND", "OR":
			for _, s := range []*cnode{l, r} {
				if s.t != TBool && s.t != TNull {
					return nil, typeErr(n, "%s needs booleans, got %s", x.Op, s.t)
				}
			}
			and := x.Op == "AND"
			return &cnode{t: TBool, eval: func(c *ctx) Vec { return kleene(and, l.eval(c), r.eval(c), c.n) }}, nil
		case "=", "!=", "<", "<=", ">", ">=":
			return b.compare(n, x.Op, l, r)
		case "||":
			return &cnode{t: TString, eval: func(c *ctx) Vec { return concatVec(l.eval(c), r.eval(c), c.n) }}, nil
		}
		return b.arith(n, x.Op, l, r)
	case *Between:
		var e Node = &Binary{Op: "AND", L: &Binary{Op: ">=", L: x.X, R: x.Lo}, R: &Binary{Op: "<=", L: x.X, R: x.Hi}}
		if x.Not {
			e = &Unary{Op: "NOT", X: e}
		}
		return b.node(e)
	case *IsNull:
		a, err := b.node(x.X)
		if err != nil {
			return nil, err
		}
		not := x.Not
		return &cnode{t: TBool, eval: func(c *ctx) Vec {
			v := a.eval(c)
			out := Vec{T: TBool, Scalar: v.Scalar}
			m := c.n
			if v.Scalar {
				m = 1
			}
			out.B = make([]bool, m)
			for i := range out.B {
				out.B[i] = v.IsNull(i) != not
			}
			return out
		}}, nil
	case *In:
		return b.in(x)
	case *Like:
		return b.like(x)
	case *Call:
		return b.call(x)
	}
	return nil, fmt.Errorf("%w: unsupported expression %s", ErrType, n)
}

func (b *binder) arith(n Node, op string, l, r *cnode) (*cnode, error) {
	lt, rt := l.t, r.t
	var t Type
	switch {
	case lt == TNull || rt == TNull:
		t = TNull
		if lt.numeric() || lt == TDate {
			t = lt
		} else if rt.numeric() || rt == TDate {
			t = rt
		}
		if t == TNull {
			t = TInt
		}
		if op == "/" {
			t = TFloat
		}
		return constNode(Value{T: t, Null: true}), nil
	case lt.numeric() && rt.numeric():
		t = TInt
		if lt == TFloat || rt == TFloat || op == "/" {
			t = TFloat
		}
	case lt == TDate && rt == TInt && (op == "+" || op == "-"):
		t = TDate
	case lt == TInt && rt == TDate && op == "+":
		t = TDate
	case lt == TDate && rt == TDate && op == "-":
		t = TInt
	case lt == TTimestamp && rt == TTimestamp && op == "-":
		t = TInt
	default:
		return nil, typeErr(n, "operator %s cannot combine %s and %s", op, lt, rt)
	}
	return &cnode{t: t, eval: func(c *ctx) Vec { return arithVec(op, t, l.eval(c), r.eval(c), c.n) }}, nil
}

// coerce makes a constant string comparable with a date/timestamp column.
func coerce(n Node, a, b *cnode) (*cnode, error) {
	if b.konst == nil || b.konst.Null {
		return b, nil
	}
	if b.t == TString && (a.t == TDate || a.t == TTimestamp) {
		var v int64
		var err error
		if a.t == TDate {
			v, err = ParseDate(b.konst.S)
		} else {
			v, err = ParseTimestamp(b.konst.S)
		}
		if err != nil {
			return nil, typeErr(n, "%v", err)
		}
		return constNode(Value{T: a.t, I: v}), nil
	}
	return b, nil
}

func (b *binder) compare(n Node, op string, l, r *cnode) (*cnode, error) {
	var err error
	if r, err = coerce(n, l, r); err != nil {
		return nil, err
	}
	if l, err = coerce(n, r, l); err != nil {
		return nil, err
	}
	if l.t == TNull || r.t == TNull {
		return constNode(Value{T: TBool, Null: true}), nil
	}
	lt, rt := l.t, r.t
	ok := lt == rt || lt.numeric() && rt.numeric() ||
		(lt == TDate && rt == TTimestamp) || (lt == TTimestamp && rt == TDate)
	if !ok {
		return nil, typeErr(n, "cannot compare %s with %s", lt, rt)
	}
	return &cnode{t: TBool, eval: func(c *ctx) Vec { return compareVec(op, l.eval(c), r.eval(c), c.n) }}, nil
}

func (b *binder) in(x *In) (*cnode, error) {
	a, err := b.node(x.X)
	if err != nil {
		return nil, err
	}
	var list []Value
	hasNull := false
	for _, e := range x.List {
		cn, err := b.node(e)
		if err != nil {
			return nil, err
		}
		if cn.konst == nil {
			return nil, typeErr(x, "IN lists must hold constants")
		}
		if cn, err = coerce(x, a, cn); err != nil {
			return nil, err
		}
		v := *cn.konst
		if v.Null || v.T == TNull {
			hasNull = true
			continue
		}
		if !(v.T == a.t || v.T.numeric() && a.t.numeric() || a.t == TNull) {
			return nil, typeErr(x, "IN list value %s does not match %s", v.SQL(), a.t)
		}
		list = append(list, v)
	}
	not := x.Not
	var member func(v *Vec, i int) bool
	switch a.t {
	case TString:
		set := map[string]bool{}
		for _, v := range list {
			set[v.S] = true
		}
		member = func(v *Vec, i int) bool { return set[v.S[i]] }
	case TFloat:
		set := map[float64]bool{}
		for _, v := range list {
			if v.T == TInt {
				v.F = float64(v.I)
			}
			set[v.F] = true
		}
		member = func(v *Vec, i int) bool { return set[v.F[i]] }
	case TInt, TDate, TTimestamp:
		set := map[int64]bool{}
		fset := map[float64]bool{}
		for _, v := range list {
			if v.T == TFloat {
				fset[v.F] = true
			} else {
				set[v.I] = true
			}
		}
		member = func(v *Vec, i int) bool {
			return set[v.I[i]] || len(fset) > 0 && fset[float64(v.I[i])]
		}
	case TBool:
		set := map[bool]bool{}
		for _, v := range list {
			set[v.B] = true
		}
		member = func(v *Vec, i int) bool { return set[v.B[i]] }
	default:
		return constNode(Value{T: TBool, Null: true}), nil
	}
	return &cnode{t: TBool, eval: func(c *ctx) Vec {
		v := a.eval(c)
		m := c.n
		if v.Scalar {
			m = 1
		}
		out := Vec{T: TBool, Scalar: v.Scalar, B: make([]bool, m)}
		for i := 0; i < m; i++ {
			if v.IsNull(i) {
				out.setNull(i, m)
				continue
			}
			if member(&v, i) {
				out.B[i] = !not
			} else if hasNull {
				out.setNull(i, m)
			} else {
				out.B[i] = not
			}
		}
		return out
	}}, nil
}

func (v *Vec) setNull(i, n int) {
	if v.Null == nil {
		v.Null = make([]bool, n)
	}
	v.Null[i] = true
}

// likeMatcher compiles a LIKE pattern.
func likeMatcher(pat string, fold bool) func(string) bool {
	if fold {
		pat = strings.ToLower(pat)
	}
	var m func(string) bool
	inner := strings.Trim(pat, "%")
	plain := !strings.ContainsAny(inner, "%_\\")
	switch {
	case plain && pat == inner:
		m = func(s string) bool { return s == pat }
	case plain && pat == "%"+inner+"%":
		m = func(s string) bool { return strings.Contains(s, inner) }
	case plain && pat == inner+"%":
		m = func(s string) bool { return strings.HasPrefix(s, inner) }
	case plain && pat == "%"+inner:
		m = func(s string) bool { return strings.HasSuffix(s, inner) }
	default:
		var re strings.Builder
		re.WriteString("(?s)^")
		for i := 0; i < len(pat); i++ {
			switch c := pat[i]; c {
			case '%':
				re.WriteString(".*")
			case '_':
				re.WriteString(".")
			case '\\':
				if i+1 < len(pat) {
					i++
					re.WriteString(regexp.QuoteMeta(pat[i : i+1]))
				}
			default:
				_, size := utf8.DecodeRuneInString(pat[i:])
				re.WriteString(regexp.QuoteMeta(pat[i : i+size]))
				i += size - 1
			}
		}
		re.WriteString("$")
		rx := regexp.MustCompile(re.String())
		m = rx.MatchString
	}
	if fold {
		return func(s string) bool { return m(strings.ToLower(s)) }
	}
	return m
}

func (b *binder) like(x *Like) (*cnode, error) {
	a, err := b.node(x.X)
	if err != nil {
		return nil, err
	}
	p, err := b.node(x.Pattern)
	if err != nil {
		return nil, err
	}
	if p.konst == nil || (p.t != TString && p.t != TNull) {
		return nil, typeErr(x, "LIKE needs a constant string pattern")
	}
	if a.t != TString && a.t != TNull {
		return nil, typeErr(x, "LIKE needs a string, got %s", a.t)
	}
	if p.t == TNull || a.t == TNull {
		return constNode(Value{T: TBool, Null: true}), nil
	}
	match := likeMatcher(p.konst.S, x.Fold)
	not := x.Not
	return &cnode{t: TBool, eval: func(c *ctx) Vec {
		v := a.eval(c)
		m := len(v.S)
		out := Vec{T: TBool, Scalar: v.Scalar, B: make([]bool, m), Null: v.Null}
		for i, s := range v.S {
			out.B[i] = match(s) != not
		}
		return out
	}}, nil
}

func (b *binder) call(x *Call) (*cnode, error) {
	var args []*cnode
	for _, e := range x.Args {
		a, err := b.node(e)
		if err != nil {
			return nil, err
		}
		args = append(args, a)
	}
	want := func(k int) error {
		if len(args) != k {
			return typeErr(x, "%s takes %d argument(s)", x.Name, k)
		}
		return nil
	}
	switch x.Name {
	case "lower", "upper":
		if err := want(1); err != nil {
			return nil, err
		}
		if args[0].t != TString {
			return nil, typeErr(x, "%s needs a string", x.Name)
		}
		f := strings.ToLower
		if x.Name == "upper" {
			f = strings.ToUpper
		}
		a := args[0]
		return &cnode{t: TString, eval: func(c *ctx) Vec {
			v := a.eval(c)
			out := Vec{T: TString, Scalar: v.Scalar, Null: v.Null, S: make([]string, len(v.S))}
			for i, s := range v.S {
				out.S[i] = f(s)
			}
			return out
		}}, nil
	case "length":
		if err := want(1); err != nil {
			return nil, err
		}
		if args[0].t != TString {
			return nil, typeErr(x, "length needs a string")
		}
		a := args[0]
		return &cnode{t: TInt, eval: func(c *ctx) Vec {
			v := a.eval(c)
			out := Vec{T: TInt, Scalar: v.Scalar, Null: v.Null, I: make([]int64, len(v.S))}
			for i, s := range v.S {
				out.I[i] = int64(utf8.RuneCountInString(s))
			}
			return out
		}}, nil
	case "abs":
		if err := want(1); err != nil {
			return nil, err
		}
		a := args[0]
		if !a.t.numeric() {
			return nil, typeErr(x, "abs needs a number")
		}
		return &cnode{t: a.t, eval: func(c *ctx) Vec {
			v := a.eval(c)
			out := Vec{T: v.T, Scalar: v.Scalar, Null: v.Null}
			if v.T == TFloat {
				out.F = make([]float64, len(v.F))
				for i, f := range v.F {
					out.F[i] = math.Abs(f)
				}
			} else {
				out.I = make([]int64, len(v.I))
				for i, n := range v.I {
					if n < 0 {
						n = -n
					}
					out.I[i] = n
				}
			}
			return out
		}}, nil
	case "coalesce":
		if len(args) == 0 {
			return nil, typeErr(x, "coalesce needs arguments")
		}
		t := TNull
		for _, a := range args {
			switch {
			case a.t == TNull:
			case t == TNull:
				t = a.t
			case t.numeric() && a.t.numeric():
				if a.t == TFloat {
					t = TFloat
				}
			case t != a.t:
				return nil, typeErr(x, "coalesce mixes %s and %s", t, a.t)
			}
		}
		return &cnode{t: t, eval: func(c *ctx) Vec {
			vs := make([]Vec, len(args))
			for k, a := range args {
				vs[k] = a.eval(c)
			}
			out := Vec{T: t}
			for i := 0; i < c.n; i++ {
				done := false
				for k := range vs {
					j := i
					if vs[k].Scalar {
						j = 0
					}
					if !vs[k].IsNull(j) {
						out.appendFrom(&vs[k], j, t)
						done = true
						break
					}
				}
				if !done {
					out.appendNull(i, c.n)
				}
			}
			return out
		}}, nil
	}
	return nil, typeErr(x, "unknown function %s", x.Name)
}

func (v *Vec) appendFrom(src *Vec, j int, t Type) {
	switch t {
	case TBool:
		v.B = append(v.B, src.B[j])
	case TInt, TDate, TTimestamp:
		v.I = append(v.I, src.I[j])
	case TFloat:
		v.F = append(v.F, src.floatAt(j))
	case TString:
		v.S = append(v.S, src.S[j])
	}
	if v.Null != nil {
		v.Null = append(v.Null, false)
	}
}

func (v *Vec) appendNull(i, n int) {
	if v.Null == nil {
		v.Null = make([]bool, i, n)
	}
	v.Null = append(v.Null, true)
	switch v.T {
	case TBool:
		v.B = append(v.B, false)
	case TInt, TDate, TTimestamp:
		v.I = append(v.I, 0)
	case TFloat:
		v.F = append(v.F, 0)
	case TString:
		v.S = append(v.S, "")
	}
}

// mergeNulls ORs the null masks of a and b into a fresh mask of n rows.
func mergeNulls(a, b *Vec, n int) []bool {
	if a.Null == nil && b.Null == nil {
		return nil
	}
	out := make([]bool, n)
	for i := range out {
		out[i] = a.IsNull(i&maskOf(a)) || b.IsNull(i&maskOf(b))
	}
	return out
}

// maskOf is ANDed with a row index: 0 for scalars (always row 0), all ones
// for vectors. It keeps the kernels free of per-row branches.
func maskOf(v *Vec) int {
	if v.Scalar {
		return 0
	}
	return -1
}

func outLen(a, b *Vec, n int) (int, bool) {
	if a.Scalar && b.Scalar {
		return 1, true
	}
	return n, false
}

func floats(v *Vec) []float64 {
	if v.T == TFloat {
		return v.F
	}
	out := make([]float64, len(v.I))
	for i, x := range v.I {
		out[i] = float64(x)
	}
	return out
}

func arithVec(op string, t Type, a, b Vec, n int) Vec {
	m, scalar := outLen(&a, &b, n)
	out := Vec{T: t, Scalar: scalar, Null: mergeNulls(&a, &b, m)}
	am, bm := maskOf(&a), maskOf(&b)
	if t == TFloat {
		x, y := floats(&a), floats(&b)
		out.F = make([]float64, m)
		switch op {
		case "+":
			for i := range out.F {
				out.F[i] = x[i&am] + y[i&bm]
			}
		case "-":
			for i := range out.F {
				out.F[i] = x[i&am] - y[i&bm]
			}
		case "*":
			for i := range out.F {
				out.F[i] = x[i&am] * y[i&bm]
			}
		case "/", "%":
			for i := range out.F {
				d := y[i&bm]
				if d == 0 {
					out.setNull(i, m)
					continue
				}
				if op == "/" {
					out.F[i] = x[i&am] / d
				} else {
					out.F[i] = math.Mod(x[i&am], d)
				}
			}
		}
		return out
	}
	x, y := a.I, b.I
	out.I = make([]int64, m)
	switch op {
	case "+":
		for i := range out.I {
			out.I[i] = x[i&am] + y[i&bm]
		}
	case "-":
		for i := range out.I {
			out.I[i] = x[i&am] - y[i&bm]
		}
	case "*":
		for i := range out.I {
			out.I[i] = x[i&am] * y[i&bm]
		}
	case "%":
		for i := range out.I {
			d := y[i&bm]
			if d == 0 {
				out.setNull(i, m)
				continue
			}
			out.I[i] = x[i&am] % d
		}
	}
	return out
}

func cmpLoop[T cmp.Ordered](op string, x []T, am int, y []T, bm int, out []bool) {
	switch op {
	case "=":
		for i := range out {
			out[i] = x[i&am] == y[i&bm]
		}
	case "!=":
		for i := range out {
			out[i] = x[i&am] != y[i&bm]
		}
	case "<":
		for i := range out {
			out[i] = x[i&am] < y[i&bm]
		}
	case "<=":
		for i := range out {
			out[i] = x[i&am] <= y[i&bm]
		}
	case ">":
		for i := range out {
			out[i] = x[i&am] > y[i&bm]
		}
	case ">=":
		for i := range out {
			out[i] = x[i&am] >= y[i&bm]
		}
	}
}

// cmpScalarInt is the hot path of most filters: an integer column against
// a constant.
func cmpScalarLoop[T cmp.Ordered](op string, x []T, s T, out []bool) {
	switch op {
	case "=":
		for i, v := range x {
			out[i] = v == s
		}
	case "!=":
		for i, v := range x {
			out[i] = v != s
		}
	case "<":
		for i, v := range x {
			out[i] = v < s
		}
	case "<=":
		for i, v := range x {
			out[i] = v <= s
		}
	case ">":
		for i, v := range x {
			out[i] = v > s
		}
	case ">=":
		for i, v := range x {
			out[i] = v >= s
		}
	}
}

var flipOp = map[string]string{"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

func toMicrosVec(v *Vec) []int64 {
	if v.T != TDate {
		return v.I
	}
	out := make([]int64, len(v.I))
	for i, d := range v.I {
		out[i] = d * 86400e6
	}
	return out
}

func boolInts(v *Vec) []int64 {
	out := make([]int64, len(v.B))
	for i, b := range v.B {
		if b {
			out[i] = 1
		}
	}
	return out
}

func compareVec(op string, a, b Vec, n int) Vec {
	m, scalar := outLen(&a, &b, n)
	out := Vec{T: TBool, Scalar: scalar, Null: mergeNulls(&a, &b, m), B: make([]bool, m)}
	if !a.Scalar && b.Scalar || a.Scalar && !b.Scalar {
		// vector against constant: no index masking in the loop
		v, s := &a, &b
		o := op
		if a.Scalar {
			v, s, o = &b, &a, flipOp[op]
		}
		switch {
		case v.T == TFloat || s.T == TFloat:
			cmpScalarLoop(o, floats(v), floats(s)[0], out.B)
		case v.T == TString:
			cmpScalarLoop(o, v.S, s.S[0], out.B)
		case v.T == TBool:
			cmpScalarLoop(o, boolInts(v), boolInts(s)[0], out.B)
		case v.T != s.T && (v.T == TDate || s.T == TDate):
			cmpScalarLoop(o, toMicrosVec(v), toMicrosVec(s)[0], out.B)
		default:
			cmpScalarLoop(o, v.I, s.I[0], out.B)
		}
		return out
	}
	am, bm := maskOf(&a), maskOf(&b)
	switch {
	case a.T == TFloat || b.T == TFloat:
		cmpLoop(op, floats(&a), am, floats(&b), bm, out.B)
	case a.T == TString:
		cmpLoop(op, a.S, am, b.S, bm, out.B)
	case a.T == TBool:
		cmpLoop(op, boolInts(&a), am, boolInts(&b), bm, out.B)
	case a.T != b.T:
		cmpLoop(op, toMicrosVec(&a), am, toMicrosVec(&b), bm, out.B)
	default:
		cmpLoop(op, a.I, am, b.I, bm, out.B)
	}
	return out
}

func notVec(a Vec) Vec {
	if a.T == TNull {
		return a
	}
	out := Vec{T: TBool, Scalar: a.Scalar, Null: a.Null, B: make([]bool, len(a.B))}
	for i, b := range a.B {
		out.B[i] = !b
	}
	return out
}

func kleene(and bool, a, b Vec, n int) Vec {
	m, scalar := outLen(&a, &b, n)
	out := Vec{T: TBool, Scalar: scalar, B: make([]bool, m)}
	am, bm := maskOf(&a), maskOf(&b)
	if a.T == TBool && b.T == TBool && a.Null == nil && b.Null == nil {
		if and {
			for i := range out.B {
				out.B[i] = a.B[i&am] && b.B[i&bm]
			}
		} else {
			for i := range out.B {
				out.B[i] = a.B[i&am] || b.B[i&bm]
			}
		}
		return out
	}
	for i := 0; i < m; i++ {
		an, bn := a.IsNull(i&am), b.IsNull(i&bm)
		av := !an && a.B[i&am]
		bv := !bn && b.B[i&bm]
		if and {
			switch {
			case !an && !av || !bn && !bv:
				out.B[i] = false
			case an || bn:
				out.setNull(i, m)
			default:
				out.B[i] = true
			}
		} else {
			switch {
			case av || bv:
				out.B[i] = true
			case an || bn:
				out.setNull(i, m)
			default:
				out.B[i] = false
			}
		}
	}
	return out
}

func concatVec(a, b Vec, n int) Vec {
	m, scalar := outLen(&a, &b, n)
	out := Vec{T: TString, Scalar: scalar, Null: mergeNulls(&a, &b, m), S: make([]string, m)}
	if a.T == TNull || b.T == TNull {
		out.Null = make([]bool, m)
		for i := range out.Null {
			out.Null[i] = true
		}
		return out
	}
	am, bm := maskOf(&a), maskOf(&b)
	for i := range out.S {
		if out.Null != nil && out.Null[i] {
			continue
		}
		out.S[i] = a.stringAt(i&am) + b.stringAt(i&bm)
	}
	return out
}

// FormatValue renders a value for CSV and messages.
func FormatValue(v Value) string {
	if v.Null {
		return ""
	}
	if v.T == TFloat {
		return strconv.FormatFloat(v.F, 'g', -1, 64)
	}
	if v.T == TInt {
		return strconv.FormatInt(v.I, 10)
	}
	return valueText(v)
}

// evalDict evaluates a one-column program over a dictionary-encoded column:
// once per dictionary entry (and once for NULL), then gathers the results
// through the indices, so a string filter costs an index lookup per row.
func (p *Program) evalDict(d *array.Dictionary) (Vec, error) {
	col := p.Cols[0]
	dv, err := FromArrow(d.Dictionary())
	if err != nil {
		return Vec{}, err
	}
	c := &ctx{n: dv.Len(), cache: map[int]Vec{col: dv}}
	res := p.root.eval(c)
	if c.err != nil {
		return Vec{}, c.err
	}
	nullIn := Vec{T: dv.T, Scalar: true, Null: []bool{true}}
	switch dv.T {
	case TBool:
		nullIn.B = []bool{false}
	case TInt, TDate, TTimestamp:
		nullIn.I = []int64{0}
	case TFloat:
		nullIn.F = []float64{0}
	case TString:
		nullIn.S = []string{""}
	}
	cn := &ctx{n: 1, cache: map[int]Vec{col: nullIn}}
	resNull := p.root.eval(cn)
	if cn.err != nil {
		return Vec{}, cn.err
	}
	n := d.Len()
	out := Vec{T: res.T}
	idx32, _ := d.Indices().(*array.Int32)
	hasNull := d.NullN() > 0
	if res.T == TBool && !res.Scalar && idx32 != nil {
		// the filter case
		out.B = make([]bool, n)
		nullIsNull := resNull.IsNull(0)
		nullVal := !nullIsNull && resNull.B[0]
		for i := 0; i < n; i++ {
			if hasNull && d.IsNull(i) {
				if nullIsNull {
					out.setNull(i, n)
				} else {
					out.B[i] = nullVal
				}
				continue
			}
			k := idx32.Value(i)
			if res.Null != nil && res.Null[k] {
				out.setNull(i, n)
				continue
			}
			out.B[i] = res.B[k]
		}
		return out, nil
	}
	for i := 0; i < n; i++ {
		var src *Vec
		j := 0
		if hasNull && d.IsNull(i) {
			src = &resNull
		} else {
			src = &res
			if !res.Scalar {
				if idx32 != nil {
					j = int(idx32.Value(i))
				} else {
					j = d.GetValueIndex(i)
				}
			}
		}
		if src.IsNull(j) {
			out.appendNull(i, n)
			continue
		}
		out.appendFrom(src, j, res.T)
	}
	return out, nil
}
