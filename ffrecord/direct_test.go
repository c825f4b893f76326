package ffrecord

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"

	_ "github.com/ffkit/ffkit/fs/localfs"
)

// The direct=auto rule, as a table: buffered whenever half the dataset is
// cached or the dataset is within DirectAutoFactor of the memory the page
// cache can use; direct only beyond.
func TestDecideDirect(t *testing.T) {
	const G = 1 << 30
	for _, c := range []struct {
		dataset, cached, avail int64
		direct                 bool
	}{
		{0, 0, 0, false},
		{1 * G, 0, 16 * G, false},       // fits
		{64 * G, 0, 16 * G, false},      // exactly 4x: still buffered
		{65 * G, 0, 16 * G, true},       // beyond 4x, nothing cached
		{100 * G, 50 * G, 1 * G, false}, // half of it cached: keep the cache
		{100 * G, 10 * G, 10 * G, true}, // 100 > 4 x (10 + 10)
		{100 * G, 10 * G, 20 * G, false},
		{10 * G, 0, 0, true}, // no memory to spare at all
	} {
		got, why := decideDirect(c.dataset, c.cached, c.avail)
		if got != c.direct || why == "" {
			t.Errorf("dataset %d cached %d available %d: direct=%v (%s), want %v", c.dataset, c.cached, c.avail, got, why, c.direct)
		}
	}
}

func TestParseDirectMode(t *testing.T) {
	for in, want := range map[string]DirectMode{"": DirectOff, "off": DirectOff, "false": DirectOff, "on": DirectOn,
		"True": DirectOn, "1": DirectOn, "auto": DirectAuto, " AUTO ": DirectAuto} {
		if got, err := ParseDirectMode(in); err != nil || got != want {
			t.Errorf("ParseDirectMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseDirectMode("sometimes"); !errors.Is(err, ErrOptions) {
		t.Errorf("ParseDirectMode(sometimes): %v, want ErrOptions", err)
	}
}

// Open with DirectAuto on a small local dataset reads buffered and says
// why, having measured the dataset and the memory; asked modes say so.
func TestOpenDirectAuto(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "a.ffr")
	writeFile(t, p, randSamples(rand.New(rand.NewPCG(1, 2)), 50, 5000))
	r, err := Open(ctx, []string{p}, ReadOptions{DirectAuto: true})
	if err != nil {
		t.Fatal(err)
	}
	c := r.DirectChoice()
	r.Close()
	if c.Mode != DirectAuto || c.Direct || c.DatasetBytes == 0 || c.AvailableBytes == 0 || c.Reason == "" {
		t.Fatalf("auto on a small local file: %+v", c)
	}
	if r.Options().Direct {
		t.Fatal("auto chose buffered but the reader reads direct")
	}
	for _, direct := range []bool{false, true} {
		r, err := Open(ctx, []string{p}, ReadOptions{Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		c := r.DirectChoice()
		r.Close()
		if c.Direct != direct || (c.Mode == DirectOn) != direct {
			t.Fatalf("asked direct=%v: %+v", direct, c)
		}
	}
}
