package localfs

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ffkit/ffkit/fs"
)

// ReadBatch through io_uring returns the same bytes as the file holds, for
// buffered and O_DIRECT files, short-read edge cases included.
func TestReadBatchURing(t *testing.T) {
	r, err := newRing(8)
	if err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	r.close()
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "data")
	data := make([]byte, 3<<20+777)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	l := New()
	for _, direct := range []bool{false, true} {
		f, err := l.Open(ctx, p, fs.OpenOptions{Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		reqs := make([]fs.ReadRequest, 500)
		for i := range reqs {
			off := rng.Int64N(int64(len(data)) - 10)
			n := 1 + rng.Int64N(min(int64(len(data))-off, 100000))
			if direct {
				off &^= Align - 1
				n = (n + Align - 1) &^ (Align - 1)
				n = min(n, (int64(len(data))-off)&^(Align-1))
				if n == 0 {
					off, n = 0, Align
				}
			}
			buf := make([]byte, n)
			if direct {
				buf = AlignedBuffer(int(n))
			}
			reqs[i] = fs.ReadRequest{File: f, Off: off, Buf: buf}
		}
		if _, ok := uringEligible(reqs); !ok {
			t.Fatal("requests not eligible for io_uring")
		}
		if err := l.ReadBatchN(ctx, reqs, 16); err != nil {
			t.Fatal(err)
		}
		if !uringOK() {
			t.Fatal("io_uring was given up")
		}
		for i, q := range reqs {
			if !bytes.Equal(q.Buf, data[q.Off:q.Off+int64(len(q.Buf))]) {
				t.Fatalf("direct=%v request %d [%d, +%d) differs", direct, i, q.Off, len(q.Buf))
			}
		}
		// past the end: a short read, reported as ErrShortRead
		bad := []fs.ReadRequest{{File: f, Off: int64(len(data)) - 5, Buf: make([]byte, 10)}}
		if direct {
			bad = []fs.ReadRequest{{File: f, Off: int64(len(data)) &^ (Align - 1), Buf: AlignedBuffer(2 * Align)}}
		}
		if err := l.ReadBatchN(ctx, bad, 4); !errors.Is(err, fs.ErrShortRead) {
			t.Fatalf("direct=%v read past the end: %v", direct, err)
		}
		f.Close()
	}
}
