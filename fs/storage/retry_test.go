package storage

import (
	"context"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/proto"
)

// A client's write reaches the head A, which forwards it (request tag T)
// to the next target B and dies; mgmtd makes B the head; the client
// retries T at B while B is still forwarding A's update down the chain.
// The retry must be acknowledged, not applied a second time. It was: B's
// dedup table learned a forwarded request only when the update ended, so
// the retry (waiting on the chunk lock behind it) built a new version of
// the same write. Here B is the head of a chain of two and gets A's
// update straight from the test; its forward to the tail is held until
// the retry has passed the dedup table.
func TestRetryAtNewHeadDuringForwardedUpdate(t *testing.T) {
	ctx := context.Background()
	cl, ch, targets, svcs := twoServices(t, nil)
	bID, cID := ch.Targets[0].ID, ch.Targets[1].ID
	b, svc := targets[bID], svcs[bID]
	id := proto.ChunkID{Inode: 7}
	if err := cl.WriteChunk(ctx, 1, id, 0, []byte("aaaaaaaa")); err != nil {
		t.Fatal(err)
	}

	held, release := holdForward(t, b, id, 2)

	data := []byte("WW")
	crc := proto.PayloadChecksum(proto.PayloadCRCs(data))
	tag := proto.Tag{Client: 42, Seq: 1}
	wr := proto.WriteReq{Tag: tag, Chain: 1, ChainVer: ch.Version, Chunk: id, Off: 2, CRC: crc}
	type result struct {
		resp *proto.WriteResp
		err  error
	}
	fwd := make(chan result, 1)
	go func() { // A's update, forwarded to B
		resp, err := svc.handleUpdate(ctx, &proto.UpdateReq{WriteReq: wr, Target: bID, UpdateVer: 2}, data)
		fwd <- result{resp, err}
	}()
	<-held
	retry := make(chan result, 1)
	go func() { // the client's retry at B, now the head
		resp, err := svc.handleWrite(ctx, &wr, data)
		retry <- result{resp, err}
	}()
	// The retry is past the dedup table (it registered T there) before
	// the forwarded update ends.
	deadline := time.Now().Add(time.Minute)
	for {
		svc.dedup.mu.Lock()
		_, in := svc.dedup.m[tag]
		svc.dedup.mu.Unlock()
		if in {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the retry never reached the dedup table")
		}
		time.Sleep(time.Millisecond)
	}
	release()
	f, r := <-fwd, <-retry
	if f.err != nil || r.err != nil {
		t.Fatalf("forwarded update: %v; retry: %v", f.err, r.err)
	}
	if r.resp.CommitVer != 2 {
		t.Errorf("the retry was answered with v%d: the write was applied twice (want v2)", r.resp.CommitVer)
	}
	for _, tid := range []proto.TargetID{bID, cID} {
		got, m := content(t, targets[tid], id)
		if string(got) != "aaWWaaaa" || m.CommitVer != 2 {
			t.Errorf("target %d: %q at v%d, want %q at v2", tid, got, m.CommitVer, "aaWWaaaa")
		}
	}
}
