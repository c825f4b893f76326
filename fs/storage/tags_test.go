package storage

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
)

// A version's request tags are in its chunk file's header: they come back
// with the file, and a header without them (written before they were
// stored) still reads.
func TestHeaderTags(t *testing.T) {
	v := &version{ver: 9, chainVer: 3, length: 5000, crcs: []uint32{1, 2}}
	for _, tags := range [][]proto.Tag{nil, {{Client: 7, Seq: 1}}, nextTags(make([]proto.Tag, maxChunkTags), proto.Tag{Client: 1, Seq: 2})} {
		v.tags = tags
		got, err := decodeHeader(encodeHeader(v))
		if err != nil {
			t.Fatal(err)
		}
		if len(got.tags) != len(tags) || fmt.Sprint(got.tags) != fmt.Sprint(tags) {
			t.Errorf("tags %v came back as %v", tags, got.tags)
		}
	}
	h := encodeHeader(&version{ver: 1, length: 1, crcs: []uint32{5}, tags: []proto.Tag{{Client: 3, Seq: 4}}})
	h[len(h)-1] ^= 1
	if _, err := decodeHeader(h); err == nil {
		t.Error("a flipped bit in a tag passed the header checksum")
	}
}

// A client retries a write (same request tag) at a head that restarted,
// or that was resynced, since the write was applied: the retry is
// answered with the chunk's state, not applied again. The tags are kept
// with the chunk's versions on disk, and a resync transfer carries them;
// before, they lived only in memory (a restart forgot them, a transfer
// dropped them) and the retry made a new version of the same write.
func TestRetryAfterRestartAndResync(t *testing.T) {
	ctx := context.Background()
	m, err := mgmtd.Start(ctx, mgmtd.Options{Token: "tok", Store: memkv.New(memkv.Options{}), Replicas: 2, ExpectTargets: 2,
		HeartbeatInterval: 50 * time.Millisecond, FailTimeout: time.Second, UpdateInterval: 20 * time.Millisecond, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	dir := t.TempDir()
	svcs := map[proto.TargetID]*Service{}
	start := func(id proto.TargetID) {
		s, err := Start(Config{Node: proto.NodeID(id), Mgmtd: []string{m.Addr()}, Token: "tok", Logf: t.Logf,
			Targets: []TargetConfig{{ID: id, Dir: filepath.Join(dir, fmt.Sprint(id))}}})
		if err != nil {
			t.Fatal(err)
		}
		svcs[id] = s
	}
	stop := func(id proto.TargetID) {
		svcs[id].Close()
		delete(svcs, id)
	}
	defer func() {
		for id := range svcs {
			stop(id)
		}
	}()
	// waitChain waits until mgmtd's chain satisfies ok (and the head's
	// service holds that routing, so it takes requests routed by it).
	waitChain := func(what string, ok func(ch *proto.Chain) bool) *proto.Chain {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			ch := m.Routing().Chain(1)
			if ch != nil && ok(ch) {
				if h, hok := ch.Head(); hok && svcs[h.ID] != nil {
					if r := svcs[h.ID].routing.Load(); r != nil && r.Chain(1) != nil && r.Chain(1).Version == ch.Version {
						return ch
					}
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: chain %v", what, ch)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	allServing := func(ch *proto.Chain) bool {
		for _, tg := range ch.Targets {
			if tg.State != proto.Serving {
				return false
			}
		}
		return true
	}
	start(1)
	start(2)
	id := proto.ChunkID{Inode: 9}
	write := func(ch *proto.Chain, tag proto.Tag, off int64, data string) *proto.WriteResp {
		t.Helper()
		h, _ := ch.Head()
		wr := proto.WriteReq{Tag: tag, Chain: 1, ChainVer: ch.Version, Chunk: id, Off: off, CRC: proto.PayloadChecksum(proto.PayloadCRCs([]byte(data)))}
		resp, err := svcs[h.ID].handleWrite(ctx, &wr, []byte(data))
		if err != nil {
			t.Fatalf("write %v at head %d: %v", tag, h.ID, err)
		}
		return resp
	}
	ch := waitChain("both serving", allServing)
	write(ch, proto.Tag{Client: 5, Seq: 1}, 0, "aaaaaaaa")
	t1 := proto.Tag{Client: 5, Seq: 2}
	if r := write(ch, t1, 2, "BB"); r.CommitVer != 2 {
		t.Fatalf("second write at v%d", r.CommitVer)
	}

	// Restart: both services lose everything in memory.
	cv := ch.Version
	stop(1)
	stop(2)
	start(1)
	start(2)
	ch = waitChain("both serving again after the restart", func(ch *proto.Chain) bool { return ch.Version > cv && allServing(ch) })
	if r := write(ch, t1, 2, "BB"); r.CommitVer != 2 {
		t.Errorf("the retry after a restart was answered at v%d: applied again (want v2)", r.CommitVer)
	}

	// Resync: the tail is down while a write is applied, comes back (a
	// restart, resynced with a whole copy of the chunk), and then is the
	// only replica left when that write is retried.
	tail := ch.Targets[1].ID
	head := ch.Targets[0].ID
	stop(tail)
	ch = waitChain("the tail out", func(ch *proto.Chain) bool {
		tg, _ := ch.Target(tail)
		return tg.State != proto.Serving && tg.State != proto.Syncing
	})
	t2 := proto.Tag{Client: 5, Seq: 3}
	r := write(ch, t2, 4, "CC")
	want := r.CommitVer
	start(tail)
	ch = waitChain("the tail resynced", allServing)
	stop(head)
	waitChain("the old tail alone", func(ch *proto.Chain) bool {
		h, ok := ch.Head()
		return ok && h.ID == tail && len(ch.Readable()) == 1
	})
	ch = m.Routing().Chain(1)
	if r := write(ch, t2, 4, "CC"); r.CommitVer != want {
		t.Errorf("the retry at a resynced head was answered at v%d: applied again (want v%d)", r.CommitVer, want)
	}
	b, _ := content(t, svcs[tail].targets[tail], id)
	if string(b) != "aaBBCCaa" {
		t.Errorf("content %q, want %q", b, "aaBBCCaa")
	}
}
