// Package units is the one place ffkit's command line reads and writes
// byte sizes and throughputs, so every flag takes the same spellings and
// every command prints the same units.
//
// A size is a number with an optional unit. All units are powers of 1024,
// whatever their spelling: K, KB, KiB (any case) mean 1024 bytes; M, G, T
// likewise; B or no unit means bytes. "4096", "4K", "256MiB", "1.5G" and
// "2GB" are sizes. Throughput is printed in MiB/s.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"

	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrSize: a string that is not a size.
var ErrSize = errkind.New(errkind.Usage, "units: bad size")

// Binary multiples.
const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
	TiB int64 = 1 << 40
)

// ParseSize reads a byte size (see the package comment). Negative sizes
// are refused; zero is a size (callers that need a positive one say so).
func ParseSize(s string) (int64, error) {
	orig := s
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return !(unicode.IsDigit(r) || r == '.') })
	num, suffix := s, ""
	if i >= 0 {
		num, suffix = s[:i], strings.ToUpper(strings.TrimSpace(s[i:]))
	}
	if num == "" {
		return 0, fmt.Errorf("%w: %q is not a number with an optional unit such as 256M", ErrSize, orig)
	}
	mult := int64(1)
	unit := strings.TrimSuffix(suffix, "B")
	unit = strings.TrimSuffix(unit, "I")
	switch {
	case suffix == "" || suffix == "B":
	case unit == "K" && suffix != "KI":
		mult = KiB
	case unit == "M" && suffix != "MI":
		mult = MiB
	case unit == "G" && suffix != "GI":
		mult = GiB
	case unit == "T" && suffix != "TI":
		mult = TiB
	default:
		return 0, fmt.Errorf("%w: %q: unknown unit %q (use B, K, M, G or T, optionally as KiB or KB)", ErrSize, orig, s[i:])
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not a number with an optional unit such as 256M", ErrSize, orig)
	}
	b := v * float64(mult)
	if b > math.MaxInt64/2 {
		return 0, fmt.Errorf("%w: %q is too large", ErrSize, orig)
	}
	return int64(b), nil
}

// FormatSize writes n bytes in the largest binary unit that keeps it short:
// "512B", "4KiB", "1.5GiB". ParseSize reads it back (up to rounding).
func FormatSize(n int64) string {
	if n < KiB && n > -KiB {
		return strconv.FormatInt(n, 10) + "B"
	}
	f := float64(n)
	for _, u := range []struct {
		name string
		m    int64
	}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}} {
		if math.Abs(f) >= float64(u.m) {
			if n%u.m == 0 {
				return strconv.FormatInt(n/u.m, 10) + u.name
			}
			return strconv.FormatFloat(f/float64(u.m), 'f', 1, 64) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// MiBPerS is the throughput of n bytes in sec seconds in MiB/s (0 when no
// time passed).
func MiBPerS(n int64, sec float64) float64 {
	if sec <= 0 {
		return 0
	}
	return float64(n) / float64(MiB) / sec
}

// FormatRate prints a throughput in bytes/s as "123.4 MiB/s", the one unit
// ffkit's commands use for throughput.
func FormatRate(bytesPerS float64) string {
	return strconv.FormatFloat(bytesPerS/float64(MiB), 'f', 1, 64) + " MiB/s"
}

// Size is a byte size as a command-line flag value (pflag.Value): it
// parses with ParseSize and prints with FormatSize.
type Size int64

// String prints the size.
func (s *Size) String() string { return FormatSize(int64(*s)) }

// Set parses a size.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// Type names the value in help texts.
func (s *Size) Type() string { return "size" }
