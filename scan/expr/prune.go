package expr

import "cmp"

// Stats summarises one column over a set of rows (a row group or a page):
// the smallest and largest non-null value and the number of nulls.
type Stats struct {
	Min, Max     Value
	HasMinMax    bool
	NullCount    int64
	HasNullCount bool
	Rows         int64
}

// MayMatch reports whether predicate n can be TRUE for some row whose
// columns are described by stats. It answers false only when that is
// certain, so a row group for which it is false can be skipped unread.
// stats returns false for a column it knows nothing about.
func MayMatch(n Node, stats func(col string) (Stats, bool)) bool {
	return mayTrue(n, stats)
}

func mayTrue(n Node, stats func(string) (Stats, bool)) bool {
	switch x := n.(type) {
	case *Lit:
		return x.V.T == TBool && !x.V.Null && x.V.B
	case *Binary:
		switch x.Op {
		case "AND":
			return mayTrue(x.L, stats) && mayTrue(x.R, stats)
		case "OR":
			return mayTrue(x.L, stats) || mayTrue(x.R, stats)
		case "=", "!=", "<", "<=", ">", ">=":
			col, lit, op, ok := colLit(x)
			if !ok {
				return true
			}
			return cmpMay(col, op, lit, stats)
		}
	case *Unary:
		if x.Op == "NOT" {
			switch y := x.X.(type) {
			case *Binary:
				neg := map[string]string{"=": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
				if op, ok := neg[y.Op]; ok {
					return mayTrue(&Binary{Op: op, L: y.L, R: y.R}, stats)
				}
				if y.Op == "AND" { // NOT (a AND b) = NOT a OR NOT b
					return mayTrue(&Unary{Op: "NOT", X: y.L}, stats) || mayTrue(&Unary{Op: "NOT", X: y.R}, stats)
				}
				if y.Op == "OR" {
					return mayTrue(&Unary{Op: "NOT", X: y.L}, stats) && mayTrue(&Unary{Op: "NOT", X: y.R}, stats)
				}
			case *IsNull:
				return mayTrue(&IsNull{X: y.X, Not: !y.Not}, stats)
			case *Between:
				return mayTrue(&Between{X: y.X, Lo: y.Lo, Hi: y.Hi, Not: !y.Not}, stats)
			case *In:
				return mayTrue(&In{X: y.X, List: y.List, Not: !y.Not}, stats)
			}
		}
	case *Between:
		if x.Not {
			return mayTrue(&Binary{Op: "OR", L: &Binary{Op: "<", L: x.X, R: x.Lo}, R: &Binary{Op: ">", L: x.X, R: x.Hi}}, stats)
		}
		return mayTrue(&Binary{Op: "AND", L: &Binary{Op: ">=", L: x.X, R: x.Lo}, R: &Binary{Op: "<=", L: x.X, R: x.Hi}}, stats)
	case *In:
		c, ok := x.X.(*Col)
		if !ok || x.Not {
			if ok && x.Not {
				// NOT IN is never TRUE for a NULL x; it can only be ruled out
				// when every value is one constant of the list.
				for _, e := range x.List {
					if l, ok := e.(*Lit); ok && !l.V.Null {
						if !cmpMay(c.Name, "!=", l.V, stats) {
							return false
						}
					}
				}
			}
			return true
		}
		for _, e := range x.List {
			l, ok := e.(*Lit)
			if !ok {
				return true
			}
			if !l.V.Null && cmpMay(c.Name, "=", l.V, stats) {
				return true
			}
		}
		return false
	case *IsNull:
		c, ok := x.X.(*Col)
		if !ok {
			return true
		}
		s, ok := stats(c.Name)
		if !ok || !s.HasNullCount {
			return true
		}
		if x.Not {
			return s.NullCount < s.Rows
		}
		return s.NullCount > 0
	}
	return true
}

func colLit(b *Binary) (col string, lit Value, op string, ok bool) {
	if c, isCol := b.L.(*Col); isCol {
		if l, isLit := b.R.(*Lit); isLit {
			return c.Name, l.V, b.Op, true
		}
	}
	if c, isCol := b.R.(*Col); isCol {
		if l, isLit := b.L.(*Lit); isLit {
			return c.Name, l.V, flipOp[b.Op], true
		}
	}
	return "", Value{}, "", false
}

func cmpMay(col, op string, lit Value, stats func(string) (Stats, bool)) bool {
	s, ok := stats(col)
	if !ok {
		return true
	}
	if lit.Null || lit.T == TNull {
		return false // a comparison with NULL is never TRUE
	}
	if s.HasNullCount && s.Rows > 0 && s.NullCount >= s.Rows {
		return false // every value is NULL
	}
	if !s.HasMinMax {
		return true
	}
	lo, ok1 := compareValues(s.Min, lit)
	hi, ok2 := compareValues(s.Max, lit)
	if !ok1 || !ok2 {
		return true
	}
	switch op {
	case "=":
		return lo <= 0 && hi >= 0
	case "!=":
		return !(lo == 0 && hi == 0)
	case "<":
		return lo < 0
	case "<=":
		return lo <= 0
	case ">":
		return hi > 0
	case ">=":
		return hi >= 0
	}
	return true
}

// compareValues orders a column statistic against a literal; ok is false
// when they are not comparable (then nothing is pruned).
func compareValues(a, b Value) (int, bool) {
	if b.T == TString && (a.T == TDate || a.T == TTimestamp) {
		var v int64
		var err error
		if a.T == TDate {
			v, err = ParseDate(b.S)
		} else {
			v, err = ParseTimestamp(b.S)
		}
		if err != nil {
			return 0, false
		}
		b = Value{T: a.T, I: v}
	}
	switch {
	case a.T == TFloat || b.T == TFloat:
		if !(a.T.numeric() && b.T.numeric()) {
			return 0, false
		}
		af, bf := a.F, b.F
		if a.T == TInt {
			af = float64(a.I)
		}
		if b.T == TInt {
			bf = float64(b.I)
		}
		if af != af || bf != bf { // NaN
			return 0, false
		}
		return cmp.Compare(af, bf), true
	case a.T == TString && b.T == TString:
		return cmp.Compare(a.S, b.S), true
	case a.T == b.T && (a.T == TInt || a.T == TDate || a.T == TTimestamp):
		return cmp.Compare(a.I, b.I), true
	case a.T == TDate && b.T == TTimestamp:
		return cmp.Compare(a.I*86400e6, b.I), true
	case a.T == TTimestamp && b.T == TDate:
		return cmp.Compare(a.I, b.I*86400e6), true
	}
	return 0, false
}
