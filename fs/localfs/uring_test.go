package localfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	l := &FS{Parallelism: 64, NoNowait: true} // the file is warm: the probe would serve it all
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

// Concurrent batches sharing a budget read the right bytes through the ring
// and through preads, never hold more than the budget, and give every token
// back, also when a batch fails or its context ends.
func TestReadBatchBudget(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "data")
	data := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// The file is warm: without NoNowait the page-cache probe would serve
	// every read, bypassing the ring, the preads and the budget.
	for _, l := range []*FS{{Parallelism: 64, NoNowait: true}, {Parallelism: 64, NoURing: true, NoNowait: true}} {
		f, err := l.Open(ctx, p, fs.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		budget := fs.NewBudget(5)
		errs := make(chan error, 8)
		for w := range 8 {
			go func() {
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				for range 20 {
					reqs := make([]fs.ReadRequest, 1+rng.IntN(50))
					for i := range reqs {
						off := rng.Int64N(int64(len(data)) - 4096)
						reqs[i] = fs.ReadRequest{File: f, Off: off, Buf: make([]byte, rng.IntN(4096))}
					}
					if err := l.ReadBatchBudget(ctx, reqs, 64, budget); err != nil {
						errs <- err
						return
					}
					for i, q := range reqs {
						if !bytes.Equal(q.Buf, data[q.Off:q.Off+int64(len(q.Buf))]) {
							errs <- fmt.Errorf("noURing=%v request %d differs", l.NoURing, i)
							return
						}
					}
				}
				errs <- nil
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		// a failing batch gives its tokens back too
		bad := []fs.ReadRequest{{File: f, Off: int64(len(data)) - 5, Buf: make([]byte, 10)}}
		if err := l.ReadBatchBudget(ctx, bad, 4, budget); !errors.Is(err, fs.ErrShortRead) {
			t.Fatalf("read past the end: %v", err)
		}
		if got := budget.TryTake(100); got != 5 {
			t.Fatalf("noURing=%v: %d of 5 tokens free after all batches ended", l.NoURing, got)
		}
		// with the budget exhausted, a batch waits and its context ends it
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err = l.ReadBatchBudget(cctx, []fs.ReadRequest{{File: f, Off: 0, Buf: make([]byte, 10)}}, 4, budget)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("noURing=%v: batch with no budget left: %v", l.NoURing, err)
		}
		budget.Give(5)
		f.Close()
	}
}
