package localfs

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
)

// Concurrent ReadBatch calls share one ring and its budget: every call gets
// exactly the file's bytes, cancelled calls return the context's error
// without disturbing the others, and the driver goroutine stops when idle.
func TestSharedRingConcurrent(t *testing.T) {
	r, err := newRing(8)
	if err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	r.close()
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "data")
	data := make([]byte, 2<<20)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	l := &FS{Parallelism: 7} // a budget of its own, smaller than the calls' parallelism
	for _, direct := range []bool{false, true} {
		f, err := l.Open(ctx, p, fs.OpenOptions{Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		var g errgroup.Group
		g.SetLimit(8)
		for c := range 24 {
			seed := uint64(c)
			g.Go(func() error {
				rng := rand.New(rand.NewPCG(seed, 1))
				reqs := make([]fs.ReadRequest, 1+rng.IntN(100))
				for i := range reqs {
					off := rng.Int64N(int64(len(data))/Align-1) * Align
					n := Align * (1 + rng.Int64N(2))
					reqs[i] = fs.ReadRequest{File: f, Off: off, Buf: AlignedBuffer(int(n))}
				}
				cctx := ctx
				cancelled := seed%5 == 0
				if cancelled {
					c, cancel := context.WithCancel(ctx)
					cancel()
					cctx = c
				}
				err := l.ReadBatchN(cctx, reqs, 64)
				if cancelled {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("call %d cancelled: got %v", seed, err)
					}
					return nil
				}
				if err != nil {
					return err
				}
				for i, q := range reqs {
					if !bytes.Equal(q.Buf, data[q.Off:q.Off+int64(len(q.Buf))]) {
						t.Errorf("direct=%v call %d request %d differs", direct, seed, i)
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if !uringOK() {
		t.Fatal("io_uring was given up")
	}
	s, err := getShared(7)
	if err != nil {
		t.Fatal(err)
	}
	// the driver returns just after waking the last caller
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		running, queued := s.running, len(s.queue)
		s.mu.Unlock()
		if !running && queued == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shared ring still busy after all calls returned: running=%v queued=%d", running, queued)
		}
	}
}
