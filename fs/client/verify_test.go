package client

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage"
)

// A large aligned read is sent by the target unverified (from its page
// cache, with the block CRCs) and verified by the  A bit flipped
// on one replica's disk, read that way first, is caught by the client:
// every read still returns the right bytes, and the target, asked to
// re-read verified, finds the corruption and leaves its chain for repair.
func TestClientVerifiesLargeReads(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl := c.dial(t, Options{RetryTimeout: 20 * time.Second})
	chain := cl.Chains()[0]
	id := ChunkID{Inode: 42, Index: 0}
	data := make([]byte, 1<<20+5000) // the last block is short
	for i := range data {
		data[i] = byte(i*13 + i>>9)
	}
	if err := cl.WriteChunk(ctx, chain, id, 0, data); err != nil {
		t.Fatal(err)
	}
	ch := cl.Routing().Chain(chain)
	// Flip a bit in every replica but the tail: whichever replica a read
	// picks first, at most one holds good bytes.
	var flipped []proto.TargetID
	for _, tg := range ch.Targets[:len(ch.Targets)-1] {
		p := filepath.Join(c.dir, fmt.Sprintf("s%d/t%d", tg.Node, int(tg.ID)%100), "chunks", id.String()+".1")
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		off := int64(storage.HeaderSize + 300000)
		f.ReadAt(b, off)
		b[0] ^= 0x10
		f.WriteAt(b, off)
		f.Close()
		flipped = append(flipped, tg.ID)
	}
	for i := 0; i < 4; i++ {
		rd := []ChunkRead{{Chain: chain, Chunk: id, Buf: make([]byte, len(data)+100)}}
		if err := cl.ReadChunks(ctx, rd); err != nil {
			t.Fatal(err)
		}
		if rd[0].N != len(data) || !bytes.Equal(rd[0].Buf[:len(data)], data) {
			t.Fatalf("read %d returned wrong bytes", i)
		}
	}
	// The corrupt replicas found out (from the client's re-read) and
	// left the chain, or were never read; read each one directly: a
	// replica read is verified by the target, so it never returns the
	// flipped bytes.
	for _, tid := range flipped {
		b, err := cl.ReadReplica(ctx, chain, tid, id, 0, int64(len(data)))
		if err == nil && !bytes.Equal(b, data) {
			t.Fatalf("target %d served corrupt bytes", tid)
		}
	}
}
