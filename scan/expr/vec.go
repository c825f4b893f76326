package expr

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/apache/arrow-go/v18/arrow/decimal256"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Vec is a column of values of one Type. A Scalar Vec holds one value that
// stands for every row. Null is nil when no value is null.
type Vec struct {
	T      Type
	Scalar bool
	B      []bool
	I      []int64
	F      []float64
	S      []string
	Null   []bool
}

// Len is the number of values held (1 for a scalar).
func (v *Vec) Len() int {
	switch v.T {
	case TBool:
		return len(v.B)
	case TInt, TDate, TTimestamp:
		return len(v.I)
	case TFloat:
		return len(v.F)
	case TString:
		return len(v.S)
	}
	return len(v.Null)
}

// IsNull reports whether row i is null.
func (v *Vec) IsNull(i int) bool {
	if v.T == TNull {
		return true
	}
	if v.Null == nil {
		return false
	}
	if v.Scalar {
		return v.Null[0]
	}
	return v.Null[i]
}

// True reports whether row i is TRUE (not FALSE, not NULL): the filter rule.
func (v *Vec) True(i int) bool {
	if v.T != TBool {
		return false
	}
	if v.Scalar {
		i = 0
	}
	return v.B[i] && (v.Null == nil || !v.Null[i])
}

// ValueAt returns row i as a Value.
func (v *Vec) ValueAt(i int) Value {
	if v.Scalar {
		i = 0
	}
	if v.IsNull(i) {
		return Value{T: v.T, Null: true}
	}
	out := Value{T: v.T}
	switch v.T {
	case TBool:
		out.B = v.B[i]
	case TInt, TDate, TTimestamp:
		out.I = v.I[i]
	case TFloat:
		out.F = v.F[i]
	case TString:
		out.S = v.S[i]
	}
	return out
}

// TypeOf maps an Arrow type to the expression kind its values take.
func TypeOf(dt arrow.DataType) (Type, bool) {
	switch dt.ID() {
	case arrow.INT8, arrow.INT16, arrow.INT32, arrow.INT64, arrow.UINT8, arrow.UINT16, arrow.UINT32, arrow.UINT64:
		return TInt, true
	case arrow.FLOAT16, arrow.FLOAT32, arrow.FLOAT64, arrow.DECIMAL128, arrow.DECIMAL256:
		return TFloat, true
	case arrow.STRING, arrow.LARGE_STRING, arrow.BINARY, arrow.LARGE_BINARY, arrow.STRING_VIEW, arrow.BINARY_VIEW, arrow.FIXED_SIZE_BINARY:
		return TString, true
	case arrow.BOOL:
		return TBool, true
	case arrow.DATE32, arrow.DATE64:
		return TDate, true
	case arrow.TIMESTAMP:
		return TTimestamp, true
	case arrow.NULL:
		return TNull, true
	case arrow.DICTIONARY:
		return TypeOf(dt.(*arrow.DictionaryType).ValueType)
	}
	return 0, false
}

func nullsOf(a arrow.Array) []bool {
	if a.NullN() == 0 {
		return nil
	}
	n := a.Len()
	out := make([]bool, n)
	for i := 0; i < n; i++ {
		out[i] = a.IsNull(i)
	}
	return out
}

func bytesToString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func ints[T int8 | int16 | int32 | uint8 | uint16 | uint32 | uint64](src []T) []int64 {
	out := make([]int64, len(src))
	for i, x := range src {
		out[i] = int64(x)
	}
	return out
}

// FromArrow converts an Arrow array into a Vec. Strings alias the array's
// buffers; fixed-width int64/float64 values alias it too.
func FromArrow(a arrow.Array) (Vec, error) {
	v := Vec{Null: nullsOf(a)}
	switch x := a.(type) {
	case *array.Int64:
		v.T, v.I = TInt, x.Int64Values()
	case *array.Int32:
		v.T, v.I = TInt, ints(x.Int32Values())
	case *array.Int16:
		v.T, v.I = TInt, ints(x.Int16Values())
	case *array.Int8:
		v.T, v.I = TInt, ints(x.Int8Values())
	case *array.Uint64:
		v.T, v.I = TInt, ints(x.Uint64Values())
	case *array.Uint32:
		v.T, v.I = TInt, ints(x.Uint32Values())
	case *array.Uint16:
		v.T, v.I = TInt, ints(x.Uint16Values())
	case *array.Uint8:
		v.T, v.I = TInt, ints(x.Uint8Values())
	case *array.Float64:
		v.T, v.F = TFloat, x.Float64Values()
	case *array.Float32:
		v.T = TFloat
		v.F = make([]float64, x.Len())
		for i, f := range x.Float32Values() {
			v.F[i] = float64(f)
		}
	case *array.Float16:
		v.T = TFloat
		v.F = make([]float64, x.Len())
		for i := range v.F {
			v.F[i] = float64(x.Value(i).Float32())
		}
	case *array.Decimal128:
		v.T = TFloat
		scale := x.DataType().(*arrow.Decimal128Type).Scale
		v.F = make([]float64, x.Len())
		for i := range v.F {
			v.F[i] = x.Value(i).ToFloat64(scale)
		}
	case *array.Decimal256:
		v.T = TFloat
		scale := x.DataType().(*arrow.Decimal256Type).Scale
		v.F = make([]float64, x.Len())
		for i := range v.F {
			v.F[i] = x.Value(i).ToFloat64(scale)
		}
	case *array.String:
		v.T = TString
		v.S = make([]string, x.Len())
		for i := range v.S {
			v.S[i] = x.Value(i)
		}
	case *array.LargeString:
		v.T = TString
		v.S = make([]string, x.Len())
		for i := range v.S {
			v.S[i] = x.Value(i)
		}
	case *array.StringView:
		v.T = TString
		v.S = make([]string, x.Len())
		for i := range v.S {
			v.S[i] = x.Value(i)
		}
	case *array.Binary:
		v.T = TString
		v.S = make([]string, x.Len())
		for i := range v.S {
			v.S[i] = bytesToString(x.Value(i))
		}
	case *array.LargeBinary:
		v.T = TString
		v.S = make([]string, x.Len())
		for i := range v.S {
			v.S[i] = bytesToString(x.Value(i))
		}
	case *array.BinaryView:
		v.T = TString
		v.S = make([]string, x.Len())
		for i := range v.S {
			v.S[i] = bytesToString(x.Value(i))
		}
	case *array.FixedSizeBinary:
		v.T = TString
		v.S = make([]string, x.Len())
		for i := range v.S {
			v.S[i] = bytesToString(x.Value(i))
		}
	case *array.Boolean:
		v.T = TBool
		v.B = make([]bool, x.Len())
		for i := range v.B {
			v.B[i] = x.Value(i)
		}
	case *array.Date32:
		v.T = TDate
		v.I = make([]int64, x.Len())
		for i, d := range x.Date32Values() {
			v.I[i] = int64(d)
		}
	case *array.Date64:
		v.T = TDate
		v.I = make([]int64, x.Len())
		for i, d := range x.Date64Values() {
			v.I[i] = floorDiv(int64(d), 86400000)
		}
	case *array.Timestamp:
		v.T = TTimestamp
		unit := x.DataType().(*arrow.TimestampType).Unit
		v.I = make([]int64, x.Len())
		for i, t := range x.TimestampValues() {
			v.I[i] = ToMicros(int64(t), unit)
		}
	case *array.Null:
		v.T = TNull
		v.Null = make([]bool, x.Len())
		for i := range v.Null {
			v.Null[i] = true
		}
	case *array.Dictionary:
		dv, err := FromArrow(x.Dictionary())
		if err != nil {
			return Vec{}, err
		}
		out := Vec{T: dv.T, Null: v.Null}
		n := x.Len()
		switch dv.T {
		case TString:
			out.S = make([]string, n)
		case TInt, TDate, TTimestamp:
			out.I = make([]int64, n)
		case TFloat:
			out.F = make([]float64, n)
		case TBool:
			out.B = make([]bool, n)
		}
		for i := 0; i < n; i++ {
			if x.IsNull(i) {
				continue
			}
			k := x.GetValueIndex(i)
			if dv.IsNull(k) {
				if out.Null == nil {
					out.Null = make([]bool, n)
				}
				out.Null[i] = true
				continue
			}
			switch dv.T {
			case TString:
				out.S[i] = dv.S[k]
			case TInt, TDate, TTimestamp:
				out.I[i] = dv.I[k]
			case TFloat:
				out.F[i] = dv.F[k]
			case TBool:
				out.B[i] = dv.B[k]
			}
		}
		return out, nil
	default:
		return Vec{}, fmt.Errorf("%w: columns of type %s are not supported in expressions", ErrType, a.DataType())
	}
	return v, nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// ToMicros converts a timestamp in unit to microseconds (flooring).
func ToMicros(t int64, unit arrow.TimeUnit) int64 {
	switch unit {
	case arrow.Second:
		return t * 1e6
	case arrow.Millisecond:
		return t * 1e3
	case arrow.Nanosecond:
		return floorDiv(t, 1e3)
	}
	return t
}

func fromMicros(us int64, unit arrow.TimeUnit) int64 {
	switch unit {
	case arrow.Second:
		return floorDiv(us, 1e6)
	case arrow.Millisecond:
		return floorDiv(us, 1e3)
	case arrow.Nanosecond:
		return us * 1e3
	}
	return us
}

// NaturalType is the Arrow type a computed value of kind t is written as.
func NaturalType(t Type) arrow.DataType {
	switch t {
	case TBool:
		return arrow.FixedWidthTypes.Boolean
	case TInt:
		return arrow.PrimitiveTypes.Int64
	case TFloat:
		return arrow.PrimitiveTypes.Float64
	case TString:
		return arrow.BinaryTypes.String
	case TDate:
		return arrow.FixedWidthTypes.Date32
	case TTimestamp:
		return &arrow.TimestampType{Unit: arrow.Microsecond}
	}
	return arrow.Null
}

// Array builds an Arrow array of n rows from v, as type dt (nil: the
// natural type of v.T). Scalars are repeated. The caller releases it.
func (v *Vec) Array(mem memory.Allocator, n int, dt arrow.DataType) (arrow.Array, error) {
	if dt == nil {
		dt = NaturalType(v.T)
	}
	if dt.ID() == arrow.NULL {
		return array.NewNull(n), nil
	}
	b := array.NewBuilder(mem, dt)
	defer b.Release()
	b.Reserve(n)
	idx := func(i int) int {
		if v.Scalar {
			return 0
		}
		return i
	}
	for i := 0; i < n; i++ {
		j := idx(i)
		if v.IsNull(j) || v.T == TNull {
			b.AppendNull()
			continue
		}
		switch bb := b.(type) {
		case *array.Int64Builder:
			bb.Append(v.intAt(j))
		case *array.Int32Builder:
			bb.Append(int32(v.intAt(j)))
		case *array.Int16Builder:
			bb.Append(int16(v.intAt(j)))
		case *array.Int8Builder:
			bb.Append(int8(v.intAt(j)))
		case *array.Uint64Builder:
			bb.Append(uint64(v.intAt(j)))
		case *array.Uint32Builder:
			bb.Append(uint32(v.intAt(j)))
		case *array.Uint16Builder:
			bb.Append(uint16(v.intAt(j)))
		case *array.Uint8Builder:
			bb.Append(uint8(v.intAt(j)))
		case *array.Float64Builder:
			bb.Append(v.floatAt(j))
		case *array.Float32Builder:
			bb.Append(float32(v.floatAt(j)))
		case *array.Decimal128Builder:
			t := dt.(*arrow.Decimal128Type)
			d, err := decimal128.FromFloat64(v.floatAt(j), t.Precision, t.Scale)
			if err != nil {
				return nil, fmt.Errorf("expr: %v does not fit %s: %w", v.floatAt(j), dt, err)
			}
			bb.Append(d)
		case *array.Decimal256Builder:
			t := dt.(*arrow.Decimal256Type)
			d, err := decimal256.FromFloat64(v.floatAt(j), t.Precision, t.Scale)
			if err != nil {
				return nil, fmt.Errorf("expr: %v does not fit %s: %w", v.floatAt(j), dt, err)
			}
			bb.Append(d)
		case *array.StringBuilder:
			bb.Append(v.stringAt(j))
		case *array.LargeStringBuilder:
			bb.Append(v.stringAt(j))
		case *array.BinaryBuilder:
			bb.AppendString(v.stringAt(j))
		case *array.BooleanBuilder:
			bb.Append(v.B[j])
		case *array.Date32Builder:
			bb.Append(arrow.Date32(v.I[j]))
		case *array.Date64Builder:
			bb.Append(arrow.Date64(v.I[j] * 86400000))
		case *array.TimestampBuilder:
			bb.Append(arrow.Timestamp(fromMicros(v.I[j], dt.(*arrow.TimestampType).Unit)))
		default:
			return nil, fmt.Errorf("%w: cannot build %s values", ErrType, dt)
		}
	}
	return b.NewArray(), nil
}

func (v *Vec) intAt(i int) int64 {
	if v.T == TFloat {
		return int64(math.Round(v.F[i]))
	}
	if v.T == TBool {
		if v.B[i] {
			return 1
		}
		return 0
	}
	return v.I[i]
}

func (v *Vec) floatAt(i int) float64 {
	if v.T == TFloat {
		return v.F[i]
	}
	return float64(v.intAt(i))
}

func (v *Vec) stringAt(i int) string {
	if v.T == TString {
		return v.S[i]
	}
	val := v.ValueAt(i)
	return valueText(val)
}

func valueText(val Value) string {
	switch val.T {
	case TString:
		return val.S
	case TDate:
		return FormatDate(val.I)
	case TTimestamp:
		return FormatTimestamp(val.I)
	case TBool:
		if val.B {
			return "true"
		}
		return "false"
	}
	return val.SQL()
}
