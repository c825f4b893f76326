package storage

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/proto"
)

// While an update of a chunk travels down the chain, a second write of
// the same chunk waits for it at the head, but not past its caller: when
// the caller gives up (here its context is over before it arrives), it is
// answered ErrBusy (retryable) at once, applies nothing, and its retry
// runs later as a new version. On the old code the chunk lock was held
// across the round trip, and the second write stayed blocked on it until
// the first update ended, whatever its caller did.
func TestQueuedWriteLeavesWhenCallerGivesUp(t *testing.T) {
	ctx := context.Background()
	cl, ch, targets, svcs := twoServices(t, nil)
	headID, tailID := ch.Targets[0].ID, ch.Targets[1].ID
	head, svc := targets[headID], svcs[headID]
	id := proto.ChunkID{Inode: 9}
	if err := cl.WriteChunk(ctx, 1, id, 0, []byte("aaaaaaaa")); err != nil {
		t.Fatal(err)
	}

	held, unhold := holdForward(t, head, id, 2)

	write := func(ctx context.Context, seq uint64, off int64, data string) (*proto.WriteResp, error) {
		d := []byte(data)
		wr := proto.WriteReq{Tag: proto.Tag{Client: 77, Seq: seq}, Chain: 1, ChainVer: ch.Version, Chunk: id, Off: off,
			CRC: proto.PayloadChecksum(proto.PayloadCRCs(d))}
		return svc.handleWrite(ctx, &wr, d)
	}
	type result struct {
		resp *proto.WriteResp
		err  error
	}
	first := make(chan result, 1)
	go func() {
		resp, err := write(ctx, 1, 0, "XX")
		first <- result{resp, err}
	}()
	<-held // v2 is in flight to the tail

	gone, cancel := context.WithCancel(ctx)
	cancel()
	second := make(chan result, 1)
	go func() {
		resp, err := write(gone, 2, 4, "YY")
		second <- result{resp, err}
	}()
	select {
	case r := <-second:
		if !errors.Is(r.err, proto.ErrBusy) {
			t.Fatalf("second write, its caller gone: %v, %+v (want ErrBusy)", r.err, r.resp)
		}
	case <-time.After(30 * time.Second):
		unhold()
		<-second
		t.Fatal("the second write waited for the first update to end although its caller had given up")
	}
	unhold()
	if r := <-first; r.err != nil || r.resp.CommitVer != 2 {
		t.Fatalf("first write: %v, %+v (want v2)", r.err, r.resp)
	}
	r, err := write(ctx, 2, 4, "YY") // the retry
	if err != nil || r.CommitVer != 3 {
		t.Fatalf("retry of the second write: %v, %+v (want v3)", err, r)
	}
	for _, tid := range []proto.TargetID{headID, tailID} {
		got, m := content(t, targets[tid], id)
		if string(got) != "XXaaYYaa" || m.CommitVer != 3 {
			t.Errorf("target %d: %q at v%d, want %q at v3", tid, got, m.CommitVer, "XXaaYYaa")
		}
	}
}

// holdForward holds the first forward of version ver of chunk id by ts
// until release is called (by the test's end at the latest); held is
// closed once it is held.
func holdForward(t *testing.T, ts *tstate, id proto.ChunkID, ver uint64) (held <-chan struct{}, release func()) {
	h := make(chan struct{})
	r := make(chan struct{})
	var once sync.Once
	hook := func(got *tstate, cid proto.ChunkID, v uint64) {
		if got != ts || cid != id || v != ver {
			return
		}
		once.Do(func() {
			close(h)
			<-r
		})
	}
	testHookForward.Store(&hook)
	var releaseOnce sync.Once
	release = func() { releaseOnce.Do(func() { close(r) }) }
	t.Cleanup(func() {
		release()
		testHookForward.Store(nil)
	})
	return h, release
}
