package clusterfs

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
)

// The extent set of one chunk against a byte model with a presence map.
func TestDirtyChunkModel(t *testing.T) {
	const n = 4096
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		var d dirtyChunk
		model := make([]byte, n)
		present := make([]bool, n)
		var bytesHeld int64
		for op := 0; op < 30; op++ {
			off := rng.Int64N(n)
			l := 1 + rng.Int64N(min(300, n-off))
			if rng.IntN(4) == 0 {
				bytesHeld += d.cut(off, off+l)
				for i := off; i < off+l; i++ {
					present[i] = false
				}
			} else {
				b := make([]byte, l)
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				bytesHeld += d.put(off, b)
				copy(model[off:], b)
				for i := off; i < off+l; i++ {
					present[i] = true
				}
			}
			// Invariants: sorted, not overlapping, not adjacent; bytes add up.
			var sum int64
			for i, e := range d.exts {
				sum += int64(len(e.data))
				if len(e.data) == 0 || (i > 0 && d.exts[i-1].end() >= e.off) {
					t.Fatalf("round %d op %d: extents %d and %d overlap, touch or are empty", round, op, i-1, i)
				}
			}
			var want int64
			for _, p := range present {
				if p {
					want++
				}
			}
			if sum != want || bytesHeld != want {
				t.Fatalf("round %d op %d: extents hold %d bytes, counted %d, want %d", round, op, sum, bytesHeld, want)
			}
			got := bytes.Repeat([]byte{0xEE}, n)
			d.overlay(got, 0)
			for i := range got {
				if present[i] && got[i] != model[i] || !present[i] && got[i] != 0xEE {
					t.Fatalf("round %d op %d: byte %d wrong", round, op, i)
				}
			}
		}
	}
}

// Small and large writes, reads, flushes and truncates through one handle
// against an in-memory model of the file; other readers see the model
// after every Flush and at the end.
func TestWriteBehindModel(t *testing.T) {
	c := startCluster(t, nil, 1)
	f := c.open(t)
	ctx := context.Background()
	const span = 2 << 20 // 8 chunks of 256 KiB
	w, err := f.OpenWrite(ctx, "/wb", fs.OCreate)
	if err != nil {
		t.Fatal(err)
	}
	var model []byte
	rng := rand.New(rand.NewPCG(5, 6))
	readOther := func(what string) {
		t.Helper()
		r, err := f.Open(ctx, "/wb", fs.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		got := make([]byte, r.Size())
		if len(got) > 0 {
			if _, err := r.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("%s: another reader sees %d bytes, want %d (equal %v)", what, len(got), len(model), bytes.Equal(got, model))
		}
	}
	for op := 0; op < 400; op++ {
		switch k := rng.IntN(100); {
		case k < 80: // a write, mostly small
			l := 1 + rng.Int64N(8<<10)
			if rng.IntN(10) == 0 {
				l = wbDirect + rng.Int64N(300<<10)
			}
			off := rng.Int64N(span)
			b := make([]byte, l)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			if _, err := w.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
			if end := off + l; end > int64(len(model)) {
				model = append(model, make([]byte, end-int64(len(model)))...)
			}
			copy(model[off:], b)
		case k < 90: // a read through the handle
			if len(model) == 0 {
				continue
			}
			off := rng.Int64N(int64(len(model)))
			got := make([]byte, min(int64(len(model))-off, 1+rng.Int64N(600<<10)))
			if n, err := w.ReadAt(got, off); n != len(got) || !bytes.Equal(got, model[off:off+int64(n)]) {
				t.Fatalf("op %d: ReadAt(%d, %d) = %d, %v; equal %v", op, off, len(got), n, err, bytes.Equal(got, model[off:off+int64(n)]))
			}
		case k < 95:
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			readOther("after Flush")
		default:
			size := rng.Int64N(span)
			if err := w.Truncate(size); err != nil {
				t.Fatal(err)
			}
			if size <= int64(len(model)) {
				model = model[:size]
			} else {
				model = append(model, make([]byte, size-int64(len(model)))...)
			}
		}
		if w.Size() != int64(len(model)) {
			t.Fatalf("op %d: size %d, want %d", op, w.Size(), len(model))
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	readOther("after Close")
}

// Two handles writing interleaved small pieces into the same chunks at
// the same time, each flushing often (the gaps of one are the other's
// bytes): write-back must never fill one handle's gaps with stale bytes
// over the other's writes.
func TestWriteBehindTwoHandlesOneChunk(t *testing.T) {
	c := startCluster(t, nil, 1)
	f := c.open(t)
	ctx := context.Background()
	const piece, pieces = 1000, 400 // 400 KB: two chunks
	for round := range 3 {
		name := fmt.Sprintf("/two%d", round)
		a, err := f.OpenWrite(ctx, name, fs.OCreate)
		if err != nil {
			t.Fatal(err)
		}
		b, err := f.OpenWrite(ctx, name, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, piece*pieces)
		for i := range pieces {
			copy(want[i*piece:], bytes.Repeat([]byte{byte(i%250 + round + 1)}, piece))
		}
		g, _ := errgroup.WithContext(ctx)
		for k, h := range []fs.WriteFile{a, b} {
			g.Go(func() error {
				for i := k; i < pieces; i += 2 {
					if _, err := h.WriteAt(want[i*piece:(i+1)*piece], int64(i*piece)); err != nil {
						return err
					}
					if i%20 < 2 {
						if err := h.Flush(); err != nil {
							return err
						}
					}
				}
				return h.Close()
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		r, err := f.Open(ctx, name, fs.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, r.Size())
		_, err = r.ReadAt(got, 0)
		r.Close()
		if err != nil || !bytes.Equal(got, want) {
			for i := range min(len(got), len(want)) {
				if got[i] != want[i] {
					t.Fatalf("round %d: size %d (want %d), %v: first wrong byte at %d (piece %d)", round, len(got), len(want), err, i, i/piece)
				}
			}
			t.Fatalf("round %d: size %d, want %d: %v", round, len(got), len(want), err)
		}
	}
}
