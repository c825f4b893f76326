package storage

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/fstest"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
)

// twoReplicas starts mgmtd and two storage services (one target each, one
// chain of two) in process.
func twoReplicas(t *testing.T) (*client.Client, *proto.Chain, map[proto.TargetID]*tstate) {
	t.Helper()
	cl, ch, targets, _ := twoServices(t, nil)
	return cl, ch, targets
}

// twoServices is twoReplicas with the services, by target; tune, if not
// nil, changes each service's Config.
func twoServices(t *testing.T, tune func(*Config)) (*client.Client, *proto.Chain, map[proto.TargetID]*tstate, map[proto.TargetID]*Service) {
	t.Helper()
	ctx := context.Background()
	m, err := mgmtd.Start(ctx, mgmtd.Options{Token: "tok", Store: memkv.New(memkv.Options{}), Replicas: 2, ExpectTargets: 2,
		HeartbeatInterval: 50 * time.Millisecond, FailTimeout: time.Second, UpdateInterval: 20 * time.Millisecond, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	dir := t.TempDir()
	targets := map[proto.TargetID]*tstate{}
	svcs := map[proto.TargetID]*Service{}
	for n := 1; n <= 2; n++ {
		cfg := Config{Node: proto.NodeID(n), Mgmtd: []string{m.Addr()}, Token: "tok", Logf: t.Logf,
			PendingTimeout: time.Hour, // only the write path resolves pending versions here
			Targets:        []TargetConfig{{ID: proto.TargetID(n), Dir: filepath.Join(dir, fmt.Sprint(n))}}}
		if tune != nil {
			tune(&cfg)
		}
		s, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		targets[proto.TargetID(n)] = s.targets[proto.TargetID(n)]
		svcs[proto.TargetID(n)] = s
	}
	fstest.WaitReady(t, m, 10*time.Second)
	cl, err := client.Dial(ctx, []string{m.Addr()}, client.Options{Token: "tok", RetryTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ch := cl.Routing().Chain(1)
	return cl, ch, targets, svcs
}

func content(t *testing.T, ts *tstate, id proto.ChunkID) ([]byte, proto.ChunkMeta) {
	t.Helper()
	b, _, err := ts.readCommitted(id, 0, proto.MaxChunkSize, true)
	if err != nil {
		t.Fatal(err)
	}
	return b, ts.Meta(id)
}

// A write left pending at the head (its writer gone) but committed at the
// tail is finished, not overwritten, when the next write arrives: no
// version number is used twice, replicas stay identical.
func TestHeadFinishesLeftoverPending(t *testing.T) {
	ctx := context.Background()
	cl, ch, targets := twoReplicas(t)
	head, tail := targets[ch.Targets[0].ID], targets[ch.Targets[1].ID]
	id := proto.ChunkID{Inode: 1}
	if err := cl.WriteChunk(ctx, 1, id, 0, []byte("aaaaaaaa")); err != nil {
		t.Fatal(err)
	}
	// The half-done write: pending v2 at the head, committed v2 at the tail.
	left := update{op: proto.OpWrite, off: 2, data: []byte("LL"), ver: 2, chainVer: ch.Version}
	c := head.get(id)
	if _, err := head.prepare(id, c, left); err != nil {
		t.Fatal(err)
	}
	ct := tail.get(id)
	if _, err := tail.prepare(id, ct, left); err != nil {
		t.Fatal(err)
	}
	if _, err := tail.commit(id, ct); err != nil {
		t.Fatal(err)
	}
	if err := cl.WriteChunk(ctx, 1, id, 6, []byte("WW")); err != nil {
		t.Fatal(err)
	}
	hb, hm := content(t, head, id)
	tb, tm := content(t, tail, id)
	if string(hb) != "aaLLaaWW" || !bytes.Equal(hb, tb) || hm != tm || hm.CommitVer != 3 || hm.UpdateVer != 3 {
		t.Fatalf("head %q %+v, tail %q %+v", hb, hm, tb, tm)
	}
}

// A successor ahead of its predecessor (it committed a version that was
// never acknowledged, the predecessor lost it) takes the predecessor's
// data on the next write instead of blocking the chain.
func TestSuccessorAheadTakesPredecessorData(t *testing.T) {
	ctx := context.Background()
	cl, ch, targets := twoReplicas(t)
	head, tail := targets[ch.Targets[0].ID], targets[ch.Targets[1].ID]
	id := proto.ChunkID{Inode: 2}
	if err := cl.WriteChunk(ctx, 1, id, 0, []byte("aaaaaaaa")); err != nil {
		t.Fatal(err)
	}
	ct := tail.get(id)
	for v := uint64(2); v <= 3; v++ {
		if _, err := tail.prepare(id, ct, update{op: proto.OpWrite, off: 0, data: []byte("ZZZ"), ver: v, chainVer: ch.Version}); err != nil {
			t.Fatal(err)
		}
		if _, err := tail.commit(id, ct); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.WriteChunk(ctx, 1, id, 6, []byte("WW")); err != nil {
		t.Fatal(err)
	}
	hb, hm := content(t, head, id)
	tb, tm := content(t, tail, id)
	if string(hb) != "aaaaaaWW" || !bytes.Equal(hb, tb) || hm != tm {
		t.Fatalf("head %q %+v, tail %q %+v", hb, hm, tb, tm)
	}
	// And crash recovery of the tail finds the same (the higher file is gone).
	re, err := OpenTarget(OS{}, tail.ID, tail.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := re.Meta(id); m != tm {
		t.Fatalf("after reopen: %+v, want %+v", m, tm)
	}
}
