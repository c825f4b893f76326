package storage

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/fs/proto"
)

// TestDurabilityModel crashes the store (dropping everything not synced)
// at random points of the update protocol. What recovery will make
// committed (the pending version if one survived, which the head re-drives
// or resync replaces, else the committed one) is always the acknowledged
// content, or, for an update interrupted before it was acknowledged, that
// update's content.
func TestDurabilityModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := 0; round < 300; round++ {
		vfs := NewCrashFS()
		tg, err := OpenTarget(vfs, 1, "/t")
		if err != nil {
			t.Fatal(err)
		}
		id := proto.ChunkID{Inode: 1, Index: uint64(round)}
		var acked []byte
		steps := rng.IntN(6) + 1
		for s := 0; s < steps; s++ {
			off := rng.IntN(20000)
			data := make([]byte, rng.IntN(20000)+1)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			next := append([]byte(nil), acked...)
			if len(next) < off+len(data) {
				next = append(next, make([]byte, off+len(data)-len(next))...)
			}
			copy(next[off:], data)
			c := tg.get(id)
			ver := c.commitVer() + 1
			_, durable, err := tg.prepareAsync(id, c, update{op: proto.OpWrite, off: int64(off), data: data, ver: ver})
			if err != nil {
				t.Fatal(err)
			}
			last := s == steps-1
			crashAt := -1 // 0: before the fsyncs, 1: before the commit
			if last {
				crashAt = rng.IntN(3) - 1
			}
			if crashAt != 0 {
				if err := durable(); err != nil {
					t.Fatal(err)
				}
			}
			if crashAt == -1 {
				if _, err := tg.commit(id, c); err != nil {
					t.Fatal(err)
				}
				acked = next
			}
			if !last {
				continue
			}
			vfs.Crash()
			tg2, err := OpenTarget(vfs, 1, "/t")
			if err != nil {
				t.Fatal(err)
			}
			final, _, err := tg2.readCommitted(id, 0, proto.MaxChunkSize, true)
			if err != nil {
				t.Fatalf("round %d: read after crash: %v", round, err)
			}
			tg2.mu.Lock()
			p := tg2.chunks[id]
			var pend *version
			if p != nil {
				pend = p.pending
			}
			tg2.mu.Unlock()
			if pend != nil {
				if final, err = tg2.readVersion(id, pend, true); err != nil {
					t.Fatalf("round %d: pending version unreadable: %v", round, err)
				}
			}
			if !bytes.Equal(final, acked) && !(crashAt >= 0 && bytes.Equal(final, next)) {
				t.Fatalf("round %d (crash point %d): recovery would commit %d bytes, not the acknowledged %d", round, crashAt, len(final), len(acked))
			}
		}
	}
}

// TestFullDisk: a write that does not fit fails with ErrNoSpace, leaves no
// pending version or file behind, and the committed data stays intact.
func TestFullDisk(t *testing.T) {
	vfs := NewCrashFS()
	tg, err := OpenTarget(vfs, 1, "/t")
	if err != nil {
		t.Fatal(err)
	}
	id := proto.ChunkID{Inode: 2}
	apply(t, tg, id, update{op: proto.OpWrite, data: bytes.Repeat([]byte("a"), 10000)})
	vfs.SetCapacity(vfs.Used() + 5000)
	c := tg.get(id)
	_, err = tg.prepare(id, c, update{op: proto.OpWrite, off: 5000, data: bytes.Repeat([]byte("b"), 20000), ver: 2})
	if !errors.Is(err, proto.ErrNoSpace) {
		t.Fatalf("want ErrNoSpace, got %v", err)
	}
	if !strings.Contains(err.Error(), "target 1") {
		t.Fatalf("error does not name the target: %v", err)
	}
	if m := tg.Meta(id); m.UpdateVer != 1 || m.CommitVer != 1 {
		t.Fatalf("state after failed write: %+v", m)
	}
	names, _ := vfs.ReadDir("/t/chunks")
	if len(names) != 1 {
		t.Fatalf("files left behind: %v", names)
	}
	got, _, err := tg.readCommitted(id, 0, 20000, false)
	if err != nil || !bytes.Equal(got, bytes.Repeat([]byte("a"), 10000)) {
		t.Fatalf("committed data damaged: %v", err)
	}
	vfs.SetCapacity(0)
	apply(t, tg, id, update{op: proto.OpWrite, off: 5000, data: bytes.Repeat([]byte("b"), 20000)})
}
