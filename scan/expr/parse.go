package expr

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrSyntax: the expression text cannot be parsed.
var ErrSyntax = errkind.New(errkind.Usage, "expr: syntax error")

// ErrType: the expression does not type-check against the input schema
// (an unknown column, a comparison between a string and a number, ...).
var ErrType = errkind.New(errkind.Usage, "expr: type error")

// Node is a parsed expression.
type Node interface{ String() string }

// Col references an input column.
type Col struct{ Name string }

// Lit is a constant.
type Lit struct{ V Value }

// Unary is -x or NOT x.
type Unary struct {
	Op string
	X  Node
}

// Binary is an arithmetic, comparison or logical operator.
type Binary struct {
	Op   string // + - * / % || = != < <= > >= AND OR
	L, R Node
}

// In is x [NOT] IN (list).
type In struct {
	X    Node
	List []Node
	Not  bool
}

// Between is x [NOT] BETWEEN lo AND hi.
type Between struct {
	X, Lo, Hi Node
	Not       bool
}

// IsNull is x IS [NOT] NULL.
type IsNull struct {
	X   Node
	Not bool
}

// Like is x [NOT] LIKE|ILIKE pattern.
type Like struct {
	X, Pattern Node
	Not, Fold  bool
}

// Call is a function call; Star marks count(*).
type Call struct {
	Name string
	Args []Node
	Star bool
}

func (c *Col) String() string { return quoteIdent(c.Name) }
func (l *Lit) String() string { return l.V.SQL() }
func (u *Unary) String() string {
	if u.Op == "NOT" {
		return "(NOT " + u.X.String() + ")"
	}
	return "(" + u.Op + u.X.String() + ")"
}
func (b *Binary) String() string { return "(" + b.L.String() + " " + b.Op + " " + b.R.String() + ")" }
func (n *In) String() string {
	var s []string
	for _, e := range n.List {
		s = append(s, e.String())
	}
	not := ""
	if n.Not {
		not = "NOT "
	}
	return "(" + n.X.String() + " " + not + "IN (" + strings.Join(s, ", ") + "))"
}
func (n *Between) String() string {
	not := ""
	if n.Not {
		not = "NOT "
	}
	return "(" + n.X.String() + " " + not + "BETWEEN " + n.Lo.String() + " AND " + n.Hi.String() + ")"
}
func (n *IsNull) String() string {
	if n.Not {
		return "(" + n.X.String() + " IS NOT NULL)"
	}
	return "(" + n.X.String() + " IS NULL)"
}
func (n *Like) String() string {
	op := "LIKE"
	if n.Fold {
		op = "ILIKE"
	}
	if n.Not {
		op = "NOT " + op
	}
	return "(" + n.X.String() + " " + op + " " + n.Pattern.String() + ")"
}
func (c *Call) String() string {
	if c.Star {
		return strings.ToLower(c.Name) + "(*)"
	}
	var s []string
	for _, a := range c.Args {
		s = append(s, a.String())
	}
	return strings.ToLower(c.Name) + "(" + strings.Join(s, ", ") + ")"
}

func quoteIdent(s string) string {
	ok := s != ""
	for i, r := range s {
		if !(r == '_' || unicode.IsLetter(r) || (i > 0 && unicode.IsDigit(r))) {
			ok = false
		}
	}
	if ok && !keywords[strings.ToUpper(s)] {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

var keywords = map[string]bool{"AND": true, "OR": true, "NOT": true, "IN": true, "BETWEEN": true,
	"IS": true, "NULL": true, "LIKE": true, "ILIKE": true, "TRUE": true, "FALSE": true, "AS": true,
	"DATE": true, "TIMESTAMP": true}

// token kinds
const (
	tEOF = iota
	tIdent
	tQuoted // "identifier"
	tNum
	tStr
	tOp
)

type token struct {
	kind int
	text string
	pos  int
}

func lex(src string) ([]token, error) {
	var toks []token
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			j := i
			for j < len(src) && (src[j] == '_' || src[j] >= 'a' && src[j] <= 'z' || src[j] >= 'A' && src[j] <= 'Z' ||
				src[j] >= '0' && src[j] <= '9' || src[j] >= 0x80) {
				j++
			}
			toks = append(toks, token{tIdent, src[i:j], i})
			i = j
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(src) && src[i+1] >= '0' && src[i+1] <= '9':
			j := i
			for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '.') {
				j++
			}
			if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
				k := j + 1
				if k < len(src) && (src[k] == '+' || src[k] == '-') {
					k++
				}
				if k < len(src) && src[k] >= '0' && src[k] <= '9' {
					j = k
					for j < len(src) && src[j] >= '0' && src[j] <= '9' {
						j++
					}
				}
			}
			toks = append(toks, token{tNum, src[i:j], i})
			i = j
		case c == '\'' || c == '"':
			q := c
			var b strings.Builder
			j := i + 1
			for {
				if j >= len(src) {
					return nil, fmt.Errorf("%w: unterminated %c at offset %d in %q", ErrSyntax, q, i, src)
				}
				if src[j] == q {
					if j+1 < len(src) && src[j+1] == q {
						b.WriteByte(q)
						j += 2
						continue
					}
					break
				}
				b.WriteByte(src[j])
				j++
			}
			k := tStr
			if q == '"' {
				k = tQuoted
			}
			toks = append(toks, token{k, b.String(), i})
			i = j + 1
		default:
			two := ""
			if i+1 < len(src) {
				two = src[i : i+2]
			}
			switch two {
			case "<=", ">=", "<>", "!=", "==", "||":
				toks = append(toks, token{tOp, two, i})
				i += 2
				continue
			}
			if strings.IndexByte("+-*/%=<>(),", c) >= 0 {
				toks = append(toks, token{tOp, string(c), i})
				i++
				continue
			}
			return nil, fmt.Errorf("%w: unexpected %q at offset %d in %q", ErrSyntax, c, i, src)
		}
	}
	toks = append(toks, token{tEOF, "", len(src)})
	return toks, nil
}

type parser struct {
	src  string
	toks []token
	p    int
}

func (p *parser) peek() token { return p.toks[p.p] }
func (p *parser) next() token {
	t := p.toks[p.p]
	if t.kind != tEOF {
		p.p++
	}
	return t
}

func (p *parser) isKw(kw string) bool {
	t := p.peek()
	return t.kind == tIdent && strings.EqualFold(t.text, kw)
}

func (p *parser) acceptKw(kw string) bool {
	if p.isKw(kw) {
		p.p++
		return true
	}
	return false
}

func (p *parser) isOp(op string) bool {
	t := p.peek()
	return t.kind == tOp && t.text == op
}

func (p *parser) acceptOp(op string) bool {
	if p.isOp(op) {
		p.p++
		return true
	}
	return false
}

func (p *parser) errf(format string, args ...any) error {
	t := p.peek()
	at := "end of input"
	if t.kind != tEOF {
		at = fmt.Sprintf("%q at offset %d", t.text, t.pos)
	}
	return fmt.Errorf("%w: %s (at %s) in %q", ErrSyntax, fmt.Sprintf(format, args...), at, p.src)
}

// Parse parses one expression.
func Parse(src string) (Node, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{src: src, toks: toks}
	n, err := p.expr()
	if err != nil {
		return nil, err
	}
	if p.peek().kind != tEOF {
		return nil, p.errf("unexpected input after the expression")
	}
	return n, nil
}

// Item is one element of a select list: an expression and its output name.
type Item struct {
	Expr Node
	Name string // the AS alias, else the column name, else the expression text
}

// ParseList parses a comma-separated list of expressions with optional
// "AS name" aliases (the --columns and --agg syntax). A bare * stands for
// every input column (an Item whose Expr is Col{Name: "*"}).
func ParseList(src string) ([]Item, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{src: src, toks: toks}
	var items []Item
	for {
		start := p.peek().pos
		if p.isOp("*") {
			// "*": every input column, expanded by the caller
			p.next()
			items = append(items, Item{Expr: &Col{Name: "*"}, Name: "*"})
			if p.acceptOp(",") {
				continue
			}
			if p.peek().kind != tEOF {
				return nil, p.errf("expected ',' or end of list")
			}
			return items, nil
		}
		n, err := p.expr()
		if err != nil {
			return nil, err
		}
		end := p.peek().pos
		it := Item{Expr: n}
		if p.acceptKw("AS") {
			t := p.next()
			if t.kind != tIdent && t.kind != tQuoted {
				p.p--
				return nil, p.errf("expected a name after AS")
			}
			it.Name = t.text
		} else if c, ok := n.(*Col); ok {
			it.Name = c.Name
		} else if c, ok := n.(*Call); ok {
			it.Name = c.String()
		} else {
			it.Name = strings.TrimSpace(src[start:end])
		}
		items = append(items, it)
		if p.acceptOp(",") {
			continue
		}
		if p.peek().kind != tEOF {
			return nil, p.errf("expected ',' or end of list")
		}
		return items, nil
	}
}

func (p *parser) expr() (Node, error) { return p.or() }

func (p *parser) or() (Node, error) {
	l, err := p.and()
	if err != nil {
		return nil, err
	}
	for p.acceptKw("OR") {
		r, err := p.and()
		if err != nil {
			return nil, err
		}
		l = &Binary{Op: "OR", L: l, R: r}
	}
	return l, nil
}

func (p *parser) and() (Node, error) {
	l, err := p.not()
	if err != nil {
		return nil, err
	}
	for p.acceptKw("AND") {
		r, err := p.not()
		if err != nil {
			return nil, err
		}
		l = &Binary{Op: "AND", L: l, R: r}
	}
	return l, nil
}

func (p *parser) not() (Node, error) {
	if p.acceptKw("NOT") {
		x, err := p.not()
		if err != nil {
			return nil, err
		}
		return &Unary{Op: "NOT", X: x}, nil
	}
	return p.predicate()
}

func (p *parser) predicate() (Node, error) {
	l, err := p.concat()
	if err != nil {
		return nil, err
	}
	for {
		t := p.peek()
		if t.kind == tOp {
			switch t.text {
			case "=", "==", "!=", "<>", "<", "<=", ">", ">=":
				p.next()
				r, err := p.concat()
				if err != nil {
					return nil, err
				}
				op := t.text
				if op == "==" {
					op = "="
				} else if op == "<>" {
					op = "!="
				}
				l = &Binary{Op: op, L: l, R: r}
				continue
			}
			return l, nil
		}
		if p.acceptKw("IS") {
			not := p.acceptKw("NOT")
			if !p.acceptKw("NULL") {
				return nil, p.errf("expected NULL after IS")
			}
			l = &IsNull{X: l, Not: not}
			continue
		}
		not := false
		save := p.p
		if p.acceptKw("NOT") {
			not = true
		}
		switch {
		case p.acceptKw("IN"):
			if !p.acceptOp("(") {
				return nil, p.errf("expected '(' after IN")
			}
			var list []Node
			for {
				e, err := p.concat()
				if err != nil {
					return nil, err
				}
				list = append(list, e)
				if p.acceptOp(",") {
					continue
				}
				if !p.acceptOp(")") {
					return nil, p.errf("expected ',' or ')' in IN list")
				}
				break
			}
			l = &In{X: l, List: list, Not: not}
		case p.acceptKw("BETWEEN"):
			lo, err := p.concat()
			if err != nil {
				return nil, err
			}
			if !p.acceptKw("AND") {
				return nil, p.errf("expected AND in BETWEEN")
			}
			hi, err := p.concat()
			if err != nil {
				return nil, err
			}
			l = &Between{X: l, Lo: lo, Hi: hi, Not: not}
		case p.isKw("LIKE") || p.isKw("ILIKE"):
			fold := strings.EqualFold(p.next().text, "ILIKE")
			pat, err := p.concat()
			if err != nil {
				return nil, err
			}
			l = &Like{X: l, Pattern: pat, Not: not, Fold: fold}
		default:
			p.p = save
			return l, nil
		}
	}
}

func (p *parser) concat() (Node, error) {
	l, err := p.additive()
	if err != nil {
		return nil, err
	}
	for p.acceptOp("||") {
		r, err := p.additive()
		if err != nil {
			return nil, err
		}
		l = &Binary{Op: "||", L: l, R: r}
	}
	return l, nil
}

func (p *parser) additive() (Node, error) {
	l, err := p.multiplicative()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().text
		r, err := p.multiplicative()
		if err != nil {
			return nil, err
		}
		l = &Binary{Op: op, L: l, R: r}
	}
	return l, nil
}

func (p *parser) multiplicative() (Node, error) {
	l, err := p.unary()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("%") {
		op := p.next().text
		r, err := p.unary()
		if err != nil {
			return nil, err
		}
		l = &Binary{Op: op, L: l, R: r}
	}
	return l, nil
}

func (p *parser) unary() (Node, error) {
	if p.acceptOp("-") {
		x, err := p.unary()
		if err != nil {
			return nil, err
		}
		if l, ok := x.(*Lit); ok && (l.V.T == TInt || l.V.T == TFloat) {
			v := l.V
			v.I, v.F = -v.I, -v.F
			return &Lit{V: v}, nil
		}
		return &Unary{Op: "-", X: x}, nil
	}
	if p.acceptOp("+") {
		return p.unary()
	}
	return p.primary()
}

func (p *parser) primary() (Node, error) {
	t := p.peek()
	switch t.kind {
	case tNum:
		p.next()
		if !strings.ContainsAny(t.text, ".eE") {
			if i, err := strconv.ParseInt(t.text, 10, 64); err == nil {
				return &Lit{V: Value{T: TInt, I: i}}, nil
			}
		}
		f, err := strconv.ParseFloat(t.text, 64)
		if err != nil {
			p.p--
			return nil, p.errf("bad number")
		}
		return &Lit{V: Value{T: TFloat, F: f}}, nil
	case tStr:
		p.next()
		return &Lit{V: Value{T: TString, S: t.text}}, nil
	case tQuoted:
		p.next()
		return &Col{Name: t.text}, nil
	case tOp:
		if t.text == "(" {
			p.next()
			e, err := p.expr()
			if err != nil {
				return nil, err
			}
			if !p.acceptOp(")") {
				return nil, p.errf("expected ')'")
			}
			return e, nil
		}
		return nil, p.errf("expected an expression")
	case tIdent:
		p.next()
		up := strings.ToUpper(t.text)
		switch up {
		case "TRUE", "FALSE":
			return &Lit{V: Value{T: TBool, B: up == "TRUE"}}, nil
		case "NULL":
			return &Lit{V: Value{T: TNull, Null: true}}, nil
		case "DATE", "TIMESTAMP":
			if s := p.peek(); s.kind == tStr {
				p.next()
				if up == "DATE" {
					d, err := ParseDate(s.text)
					if err != nil {
						p.p--
						return nil, p.errf("%v", err)
					}
					return &Lit{V: Value{T: TDate, I: d}}, nil
				}
				ts, err := ParseTimestamp(s.text)
				if err != nil {
					p.p--
					return nil, p.errf("%v", err)
				}
				return &Lit{V: Value{T: TTimestamp, I: ts}}, nil
			}
		case "AND", "OR", "NOT", "IN", "BETWEEN", "IS", "LIKE", "ILIKE", "AS":
			p.p--
			return nil, p.errf("expected an expression")
		}
		if p.acceptOp("(") {
			c := &Call{Name: strings.ToLower(t.text)}
			if p.acceptOp("*") {
				c.Star = true
				if !p.acceptOp(")") {
					return nil, p.errf("expected ')' after *")
				}
				return c, nil
			}
			if p.acceptOp(")") {
				return c, nil
			}
			for {
				a, err := p.expr()
				if err != nil {
					return nil, err
				}
				c.Args = append(c.Args, a)
				if p.acceptOp(",") {
					continue
				}
				if !p.acceptOp(")") {
					return nil, p.errf("expected ',' or ')' in call to %s", c.Name)
				}
				return c, nil
			}
		}
		return &Col{Name: t.text}, nil
	}
	return nil, p.errf("expected an expression")
}

// Columns returns the names of the columns n references, in first-use order.
func Columns(n Node) []string {
	var out []string
	seen := map[string]bool{}
	var walk func(Node)
	walk = func(n Node) {
		switch x := n.(type) {
		case *Col:
			if !seen[x.Name] {
				seen[x.Name] = true
				out = append(out, x.Name)
			}
		case *Unary:
			walk(x.X)
		case *Binary:
			walk(x.L)
			walk(x.R)
		case *In:
			walk(x.X)
			for _, e := range x.List {
				walk(e)
			}
		case *Between:
			walk(x.X)
			walk(x.Lo)
			walk(x.Hi)
		case *IsNull:
			walk(x.X)
		case *Like:
			walk(x.X)
			walk(x.Pattern)
		case *Call:
			for _, a := range x.Args {
				walk(a)
			}
		}
	}
	walk(n)
	return out
}
