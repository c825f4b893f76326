package client

import (
	"context"
	"math/rand/v2"
	"testing"

	"golang.org/x/sync/errgroup"
)

// BenchmarkInprocWrite writes 4 MiB chunks through an in-process cluster
// (3 storage services, 3 replicas): for profiling the write path.
func BenchmarkInprocWrite(b *testing.B) {
	c := startInproc(b)
	benchWrite(b, c)
}

func benchWrite(b *testing.B, c *inproc) {
	ctx := context.Background()
	cl := c.dial(b, Options{})
	payload := make([]byte, 4<<20)
	b.SetBytes(4 << 20)
	b.ResetTimer()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := 0; i < b.N; i++ {
		g.Go(func() error {
			return cl.WriteChunk(gctx, ChainID(i%2+1), ChunkID{Inode: 1, Index: uint64(i)}, 0, payload)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkInprocRead reads 4 MiB chunks through an in-process cluster.
func BenchmarkInprocRead(b *testing.B) {
	c := startInproc(b)
	ctx := context.Background()
	cl := c.dial(b, Options{})
	payload := make([]byte, 4<<20)
	for i := 0; i < 32; i++ {
		if err := cl.WriteChunk(ctx, ChainID(i%2+1), ChunkID{Inode: 1, Index: uint64(i)}, 0, payload); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(4 << 20)
	b.ResetTimer()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := 0; i < b.N; i++ {
		g.Go(func() error {
			rd := []ChunkRead{{Chain: ChainID(i%2 + 1), Chunk: ChunkID{Inode: 1, Index: uint64(i % 32)}, Buf: make([]byte, 4<<20)}}
			return cl.ReadChunks(gctx, rd)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkInprocRandRead4K reads random 4 KiB blocks of 256 MiB in batches
// of 32, 4 batches in flight, through an in-process cluster: for profiling
// the per-read cost of the small-read path (bytes per op = one batch).
func BenchmarkInprocRandRead4K(b *testing.B) {
	c := startInproc(b)
	ctx := context.Background()
	cl := c.dial(b, Options{})
	const chunks, per = 64, 32
	payload := make([]byte, 4<<20)
	for i := 0; i < chunks; i++ {
		if err := cl.WriteChunk(ctx, ChainID(i%2+1), ChunkID{Inode: 1, Index: uint64(i)}, 0, payload); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(per * 4096)
	b.ResetTimer()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i := 0; i < b.N; i++ {
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(1, uint64(i)))
			buf := make([]byte, per*4096)
			rd := make([]ChunkRead, per)
			for k := range rd {
				ch := rng.IntN(chunks)
				rd[k] = ChunkRead{Chain: ChainID(ch%2 + 1), Chunk: ChunkID{Inode: 1, Index: uint64(ch)}, Off: rng.Int64N(1024) * 4096, Buf: buf[k*4096 : (k+1)*4096]}
			}
			return cl.ReadChunks(gctx, rd)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}
