package expr

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Type is the kind of value an expression produces.
type Type int

const (
	TNull      Type = iota // the NULL literal: no values at all
	TBool                  // B
	TInt                   // I
	TFloat                 // F
	TString                // S
	TDate                  // I: days since 1970-01-01
	TTimestamp             // I: microseconds since 1970-01-01 00:00:00 UTC
)

func (t Type) String() string {
	return [...]string{"NULL", "BOOLEAN", "INTEGER", "DOUBLE", "VARCHAR", "DATE", "TIMESTAMP"}[t]
}

func (t Type) numeric() bool { return t == TInt || t == TFloat }

// Value is one constant.
type Value struct {
	T    Type
	Null bool
	B    bool
	I    int64
	F    float64
	S    string
}

// SQL renders v as a SQL literal.
func (v Value) SQL() string {
	if v.Null || v.T == TNull {
		return "NULL"
	}
	switch v.T {
	case TBool:
		if v.B {
			return "TRUE"
		}
		return "FALSE"
	case TInt:
		return strconv.FormatInt(v.I, 10)
	case TFloat:
		return strconv.FormatFloat(v.F, 'g', -1, 64)
	case TString:
		return "'" + strings.ReplaceAll(v.S, "'", "''") + "'"
	case TDate:
		return "DATE '" + FormatDate(v.I) + "'"
	case TTimestamp:
		return "TIMESTAMP '" + FormatTimestamp(v.I) + "'"
	}
	return "?"
}

// ParseDate parses yyyy-mm-dd into days since the epoch.
func ParseDate(s string) (int64, error) {
	t, err := time.Parse("2006-01-02", strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("bad date %q (want yyyy-mm-dd)", s)
	}
	return t.Unix() / 86400, nil
}

// ParseTimestamp parses "yyyy-mm-dd[ hh:mm:ss[.ffffff]]" (or with a T) as
// UTC into microseconds since the epoch.
func ParseTimestamp(s string) (int64, error) {
	s = strings.TrimSpace(s)
	for _, layout := range []string{"2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999",
		"2006-01-02 15:04:05.999999999Z07:00", "2006-01-02T15:04:05.999999999Z07:00", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UnixMicro(), nil
		}
	}
	return 0, fmt.Errorf("bad timestamp %q (want yyyy-mm-dd hh:mm:ss[.ffffff])", s)
}

// FormatDate renders days since the epoch as yyyy-mm-dd.
func FormatDate(d int64) string { return time.Unix(d*86400, 0).UTC().Format("2006-01-02") }

// FormatTimestamp renders microseconds since the epoch.
func FormatTimestamp(us int64) string {
	return time.UnixMicro(us).UTC().Format("2006-01-02 15:04:05.999999")
}
