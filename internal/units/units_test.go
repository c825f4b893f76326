package units

import (
	"errors"
	"testing"

	"github.com/ffkit/ffkit/internal/errkind"
)

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"0": 0, "4096": 4096, "12B": 12, "4K": 4 << 10, "4k": 4 << 10, "4KB": 4 << 10, "4KiB": 4 << 10, "4kib": 4 << 10,
		"256M": 256 << 20, "256MB": 256 << 20, "256MiB": 256 << 20, "1.5G": 3 << 29, "2GB": 2 << 30, "1 GiB": 1 << 30,
		"1T": 1 << 40, " 64K ": 64 << 10,
	}
	for s, want := range good {
		got, err := ParseSize(s)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "banana", "-1", "1X", "1Ki", "K", "1.2.3M", "1e3", "99999999999T"} {
		_, err := ParseSize(s)
		if !errors.Is(err, ErrSize) || errkind.Of(err) != errkind.Usage {
			t.Errorf("ParseSize(%q): %v, want a usage error", s, err)
		}
	}
}

func TestFormatSizeRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 1023, 1024, 4096, 256 << 20, 1 << 30, 3 << 29, 5 << 40} {
		s := FormatSize(n)
		back, err := ParseSize(s)
		if err != nil || back != n {
			t.Errorf("FormatSize(%d) = %q reads back as %d, %v", n, s, back, err)
		}
	}
	if s := FormatSize(256 << 20); s != "256MiB" {
		t.Errorf("FormatSize(256MiB) = %q", s)
	}
}

func TestSizeFlag(t *testing.T) {
	var s Size
	if err := s.Set("64M"); err != nil || int64(s) != 64<<20 || s.String() != "64MiB" || s.Type() != "size" {
		t.Fatalf("%v %d %s", err, s, s.String())
	}
	if err := s.Set("x"); err == nil {
		t.Fatal("bad size accepted")
	}
}
