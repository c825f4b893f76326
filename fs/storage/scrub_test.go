package storage

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ffkit/ffkit/fs/proto"
)

// A bit flip in a chunk that nothing reads is found by the scrub, and the
// rotten replica is repaired (it leaves its chain and is resynced) without
// any read touching it. Without the scrub it stayed rotten (the simulator
// found the same in the protocol core: seed 158931).
func TestScrubRepairsUnreadCorruption(t *testing.T) {
	ctx := context.Background()
	cl, ch, targets, svcs := twoServices(t, func(c *Config) { c.ScrubInterval = 50 * time.Millisecond })
	tailID := ch.Targets[1].ID
	tail, svc := targets[tailID], svcs[tailID]
	id := proto.ChunkID{Inode: 11}
	want := bytes.Repeat([]byte("scrub me "), 1000)
	if err := cl.WriteChunk(ctx, 1, id, 0, want); err != nil {
		t.Fatal(err)
	}
	p := tail.path(id, tail.Meta(id).CommitVer, false)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, HeaderSize+100); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, HeaderSize+100); err != nil {
		t.Fatal(err)
	}
	f.Close()

	wait := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("the scrub finds the bit flip", func() bool {
		var m dto.Metric
		return svc.metrics.corrupt.Write(&m) == nil && m.GetCounter().GetValue() >= 1
	})
	wait("the tail holds the written bytes again, serving", func() bool {
		got, _, err := tail.readCommitted(id, 0, proto.MaxChunkSize, false)
		if err != nil || !bytes.Equal(got, want) {
			return false
		}
		r := cl.Routing()
		if r == nil {
			return false
		}
		tg, _ := r.Chain(1).Target(tailID)
		return tg.State == proto.Serving && tail.ph() == phaseUpToDate
	})
}
