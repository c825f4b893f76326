package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/ffkit/ffkit/internal/errkind"
	"github.com/ffkit/ffkit/internal/units"
)

// ErrBadArg: a size, list or count on the command line that cannot be parsed.
var ErrBadArg = errkind.New(errkind.Usage, "bench: bad argument")

// Table is a human-readable table: a title, a header, rows of cells, and
// notes printed under it (how the figures were measured).
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
	Notes  []string
}

// AddRow appends a row.
func (t *Table) AddRow(cells ...string) { t.Rows = append(t.Rows, cells) }

// Write prints the table with aligned columns; cells that look numeric are
// right-aligned.
func (t *Table) Write(w io.Writer) error {
	cols := len(t.Header)
	for _, r := range t.Rows {
		cols = max(cols, len(r))
	}
	width := make([]int, cols)
	numeric := make([]bool, cols)
	for i := range numeric {
		numeric[i] = true
	}
	measure := func(r []string, header bool) {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
			if !header && c != "" && c != "-" && !looksNumeric(c) {
				numeric[i] = false
			}
		}
	}
	measure(t.Header, true)
	for _, r := range t.Rows {
		measure(r, false)
	}
	var b strings.Builder
	if t.Title != "" {
		b.WriteString(t.Title + "\n")
	}
	line := func(r []string) {
		for i := range cols {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i > 0 {
				b.WriteString("  ")
			}
			if numeric[i] {
				b.WriteString(pad + c)
			} else if i == cols-1 {
				b.WriteString(c)
			} else {
				b.WriteString(c + pad)
			}
		}
		b.WriteString("\n")
	}
	if len(t.Header) > 0 {
		line(t.Header)
		sep := make([]string, cols)
		for i := range sep {
			sep[i] = strings.Repeat("-", width[i])
		}
		line(sep)
	}
	for _, r := range t.Rows {
		line(r)
	}
	for _, n := range t.Notes {
		b.WriteString(n + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func looksNumeric(s string) bool {
	s = strings.TrimRight(s, "xX%")
	if s == "" {
		return false
	}
	for _, suffix := range []string{"KiB", "MiB", "GiB", "TiB", "K", "M", "G", "T", "us", "ms", "s"} {
		if t, ok := strings.CutSuffix(s, suffix); ok {
			s = t
			break
		}
	}
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, " ±("); i > 0 {
		s = s[:i]
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// WriteJSON writes v as one indented JSON document.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// FormatSpread formats a spread as "mean ±stddev (min–max, n=runs)" with
// the given verb for each number ("%.1f"); one run prints the mean only.
func FormatSpread(s Spread, verb string) string {
	if s.Runs <= 1 {
		return fmt.Sprintf(verb, s.Mean)
	}
	f := func(v float64) string { return fmt.Sprintf(verb, v) }
	return fmt.Sprintf("%s ±%s (%s-%s, n=%d)", f(s.Mean), f(s.Stddev), f(s.Min), f(s.Max), s.Runs)
}

// FormatRatio formats a ratio as "0.93x", or "-" when there is none.
func FormatRatio(r float64) string {
	if r <= 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", r)
}

// FormatFloat formats v with the given precision, or "-" for 0/NaN (no figure).
func FormatFloat(v float64, prec int) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// FormatSize formats a byte count with a binary suffix when exact: 4096 ->
// "4K", 1048576 -> "1M", 1000 -> "1000". ParseSize reads it back.
func FormatSize(n int64) string {
	for _, u := range []struct {
		s string
		v int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.v && n%u.v == 0 {
			return strconv.FormatInt(n/u.v, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// FormatBytes formats a byte count for humans: "1.5 GiB".
func FormatBytes(n int64) string {
	f := float64(n)
	for _, u := range []string{"B", "KiB", "MiB", "GiB", "TiB"} {
		if math.Abs(f) < 1024 || u == "TiB" {
			if u == "B" {
				return fmt.Sprintf("%d B", n)
			}
			return fmt.Sprintf("%.1f %s", f, u)
		}
		f /= 1024
	}
	return ""
}

// ParseSize parses a byte size with the spellings of every ffkit flag
// (units.ParseSize: K, M, G, T, also KiB, KB, k...; all powers of 1024).
func ParseSize(s string) (int64, error) {
	v, err := units.ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrBadArg, err)
	}
	return v, nil
}

// ParseSizes parses a comma-separated list of sizes ("4K,64K,1M").
func ParseSizes(list string) ([]int64, error) {
	var out []int64
	for _, f := range splitList(list) {
		v, err := ParseSize(f)
		if err != nil {
			return nil, err
		}
		if v <= 0 {
			return nil, fmt.Errorf("%w: size %q in %q must be positive", ErrBadArg, f, list)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: empty size list %q", ErrBadArg, list)
	}
	return out, nil
}

// ParseInts parses a comma-separated list of positive integers ("1,8,32").
func ParseInts(list string) ([]int, error) {
	var out []int
	for _, f := range splitList(list) {
		v, err := strconv.Atoi(f)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%w: %q in %q is not a positive integer", ErrBadArg, f, list)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: empty list %q", ErrBadArg, list)
	}
	return out, nil
}

// ParseCountSize parses "NxSIZE" ("8x512M"): N files of SIZE bytes each.
func ParseCountSize(s string) (int, int64, error) {
	a, b, ok := strings.Cut(strings.ToLower(strings.TrimSpace(s)), "x")
	if !ok {
		return 0, 0, fmt.Errorf("%w: %q is not COUNTxSIZE (e.g. 8x512M)", ErrBadArg, s)
	}
	n, err := strconv.Atoi(a)
	if err != nil || n <= 0 {
		return 0, 0, fmt.Errorf("%w: count %q in %q is not a positive integer", ErrBadArg, a, s)
	}
	size, err := ParseSize(b)
	if err != nil {
		return 0, 0, err
	}
	if size <= 0 {
		return 0, 0, fmt.Errorf("%w: size in %q must be positive", ErrBadArg, s)
	}
	return n, size, nil
}

func splitList(list string) []string {
	var out []string
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
