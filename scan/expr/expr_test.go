package expr

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// batch: a (int64) = 1, NULL, 3, 0; b (bool) = true, false, NULL, NULL;
// s (string) = 'apple', 'Banana', NULL, 'a_c'; f (float64) = 1.5, 2, NULL, -1
func batch(t *testing.T) arrow.RecordBatch {
	mem := memory.DefaultAllocator
	ab := array.NewInt64Builder(mem)
	ab.AppendValues([]int64{1, 0, 3, 0}, []bool{true, false, true, true})
	bb := array.NewBooleanBuilder(mem)
	bb.AppendValues([]bool{true, false, false, false}, []bool{true, true, false, false})
	sb := array.NewStringBuilder(mem)
	sb.AppendValues([]string{"apple", "Banana", "", "a_c"}, []bool{true, true, false, true})
	fb := array.NewFloat64Builder(mem)
	fb.AppendValues([]float64{1.5, 2, 0, -1}, []bool{true, true, false, true})
	sc := arrow.NewSchema([]arrow.Field{{Name: "a", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
		{Name: "b", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
		{Name: "s", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "f", Type: arrow.PrimitiveTypes.Float64, Nullable: true}}, nil)
	return array.NewRecordBatch(sc, []arrow.Array{ab.NewArray(), bb.NewArray(), sb.NewArray(), fb.NewArray()}, 4)
}

func render(v Vec, n int) string {
	var out []string
	for i := 0; i < n; i++ {
		j := i
		if v.Scalar {
			j = 0
		}
		val := v.ValueAt(j)
		if val.Null {
			out = append(out, "NULL")
		} else {
			out = append(out, FormatValue(val))
		}
	}
	return strings.Join(out, ",")
}

func TestSQLSemantics(t *testing.T) {
	rec := batch(t)
	cases := []struct{ expr, want string }{
		{"a > 0", "true,NULL,true,false"},
		{"a + 1", "2,NULL,4,1"},
		{"a / 2", "0.5,NULL,1.5,0"},
		{"a / 0", "NULL,NULL,NULL,NULL"},
		{"a % 2", "1,NULL,1,0"},
		{"-a * 2 + f", "-0.5,NULL,NULL,-1"},
		{"b AND a > 0", "true,false,NULL,false"},
		{"b OR a > 0", "true,NULL,true,NULL"},
		{"NOT b", "false,true,NULL,NULL"},
		{"a IN (1, 2)", "true,NULL,false,false"},
		{"a IN (1, NULL)", "true,NULL,NULL,NULL"},
		{"a NOT IN (1, NULL)", "false,NULL,NULL,NULL"},
		{"a NOT IN (5, 6)", "true,NULL,true,true"},
		{"a BETWEEN 1 AND 3", "true,NULL,true,false"},
		{"a NOT BETWEEN 1 AND 2", "false,NULL,true,true"},
		{"a IS NULL", "false,true,false,false"},
		{"s IS NOT NULL", "true,true,false,true"},
		{"s LIKE 'a%'", "true,false,NULL,true"},
		{"s LIKE 'a\\_c'", "false,false,NULL,true"},
		{"s LIKE '_pp%'", "true,false,NULL,false"},
		{"s ILIKE 'b%'", "false,true,NULL,false"},
		{"s NOT LIKE '%a%'", "false,false,NULL,false"},
		{"s || '!'", "apple!,Banana!,NULL,a_c!"},
		{"upper(s) = 'APPLE'", "true,false,NULL,false"},
		{"length(s)", "5,6,NULL,3"},
		{"coalesce(a, 42)", "1,42,3,0"},
		{"abs(f)", "1.5,2,NULL,1"},
		{"f >= a", "true,NULL,NULL,false"},
		{"NULL = NULL", "NULL,NULL,NULL,NULL"},
		{"a = NULL OR TRUE", "true,true,true,true"},
		{"A > 2", "false,NULL,true,false"}, // identifiers are case-insensitive
		{`"a" <> 1`, "false,NULL,true,true"},
	}
	for _, c := range cases {
		n, err := Parse(c.expr)
		if err != nil {
			t.Fatalf("%s: %v", c.expr, err)
		}
		p, err := Compile(n, rec.Schema())
		if err != nil {
			t.Fatalf("%s: %v", c.expr, err)
		}
		v, err := p.Eval(rec)
		if err != nil {
			t.Fatalf("%s: %v", c.expr, err)
		}
		if got := render(v, 4); got != c.want {
			t.Errorf("%s = %s, want %s", c.expr, got, c.want)
		}
	}
}

func TestErrors(t *testing.T) {
	rec := batch(t)
	for _, c := range []struct {
		expr string
		want error
	}{
		{"a >", ErrSyntax}, {"a = 'x", ErrSyntax}, {"(a", ErrSyntax}, {"a IN 1", ErrSyntax},
		{"nope > 1", ErrType}, {"s > 1", ErrType}, {"a AND b", ErrType}, {"s LIKE a", ErrType},
		{"frob(a)", ErrType}, {"a IN (s)", ErrType}, {"a # 1", ErrSyntax},
	} {
		n, err := Parse(c.expr)
		if err == nil {
			_, err = Compile(n, rec.Schema())
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.expr, err, c.want)
		}
	}
}

func TestMayMatch(t *testing.T) {
	stats := func(col string) (Stats, bool) {
		switch col {
		case "x":
			return Stats{Min: Value{T: TInt, I: 10}, Max: Value{T: TInt, I: 20}, HasMinMax: true, HasNullCount: true, NullCount: 0, Rows: 100}, true
		case "d":
			d1, _ := ParseDate("2024-01-01")
			d2, _ := ParseDate("2024-01-31")
			return Stats{Min: Value{T: TDate, I: d1}, Max: Value{T: TDate, I: d2}, HasMinMax: true, HasNullCount: true, NullCount: 5, Rows: 100}, true
		}
		return Stats{}, false
	}
	for expr, want := range map[string]bool{
		"x > 20": false, "x >= 20": true, "x < 10": false, "x = 15": true, "x = 25": false,
		"x BETWEEN 21 AND 30": false, "x IN (1, 2, 30)": false, "x IN (1, 12)": true,
		"NOT x > 5": false, "x > 100 OR y = 1": true, "x > 100 AND y = 1": false,
		"d >= '2024-02-01'": false, "d >= DATE '2024-01-15'": true, "d IS NULL": true, "x IS NULL": false,
		"x = NULL": false, "x * 2 > 1000": true, "x != 15": true,
	} {
		n, err := Parse(expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := MayMatch(n, stats); got != want {
			t.Errorf("MayMatch(%s) = %v, want %v", expr, got, want)
		}
	}
}

func TestParseList(t *testing.T) {
	items, err := ParseList(`a, b * 2 AS "double b", count(*), sum(x + 1)`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, it := range items {
		names = append(names, it.Name)
	}
	if got := fmt.Sprint(names); got != "[a double b count(*) sum((x + 1))]" {
		t.Fatalf("names: %s", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"a > 1 AND b IN (1, 2)", "x BETWEEN 'a' AND 'b'", "NOT (s LIKE '%x_')", "-(-1.5e3)"} {
		f.Add(s)
	}
	rec := batch(&testing.T{})
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if p, err := Compile(n, rec.Schema()); err == nil {
			p.Eval(rec)
		}
	})
}
