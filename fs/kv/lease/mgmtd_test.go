package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/etcdkv"
	"github.com/ffkit/ffkit/fs/kv/lease"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/transport"
)

const tok = "tok"

func persisted(t *testing.T, s kv.Store) *proto.Routing {
	t.Helper()
	var r proto.Routing
	err := s.View(context.Background(), func(tx kv.ReadTxn) error {
		v, ok, err := tx.Get(context.Background(), []byte("mgmtd/routing"))
		if err != nil || !ok {
			return err
		}
		return json.Unmarshal(v, &r)
	})
	if err != nil {
		t.Fatal(err)
	}
	return &r
}

func heartbeat(t *testing.T, addr string, node proto.NodeID, ver uint64) error {
	t.Helper()
	c, err := transport.Dial(context.Background(), addr, transport.Options{Token: tok})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Call(context.Background(), proto.MHeartbeat, proto.HeartbeatReq{Node: node, Addr: "127.0.0.1:1", Version: ver}, nil, nil)
	return err
}

func hasNode(r *proto.Routing, id proto.NodeID) bool { return r.NodeAddr(id) != "" }

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mgmtd on a real three-member etcd cluster: the primary holds the lease,
// a standby campaigns; when the primary stops renewing (a stalled
// process, a partition from the store) the standby takes over, resumes the
// persisted state, and no write of the old primary lands afterwards, even
// though the old primary is still running and still deciding.
func TestMgmtdStandbyTakesOver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member etcd cluster")
	}
	ctx := context.Background()
	cl, err := etcdkv.StartCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	open := func() kv.Store {
		s, err := etcdkv.Open(ctx, cl.Endpoints(), etcdkv.Options{Prefix: "standby-test/"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	storeA, storeB := open(), open()
	key := []byte("mgmtd/lease")
	la, _ := lease.New(storeA, lease.Options{Key: key, ID: "A", TTL: time.Second, RenewEvery: 200 * time.Millisecond})
	lb, _ := lease.New(storeB, lease.Options{Key: key, ID: "B", TTL: time.Second, RenewEvery: 200 * time.Millisecond})
	mopts := func(s kv.Store, l *lease.Lease) mgmtd.Options {
		return mgmtd.Options{Token: tok, Store: s, Fence: l.Fence, HeartbeatInterval: 50 * time.Millisecond,
			FailTimeout: 10 * time.Second, UpdateInterval: 20 * time.Millisecond, Logf: func(string, ...any) {}}
	}

	// A wins and serves; it will never renew (it stalls after this).
	if held, err := la.TryAcquire(ctx); !held || err != nil {
		t.Fatalf("A: %v %v", held, err)
	}
	ma, err := mgmtd.Start(ctx, mopts(storeA, la))
	if err != nil {
		t.Fatal(err)
	}
	defer ma.Close()
	if err := heartbeat(t, ma.Addr(), 1, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node 1 persisted by the primary", 5*time.Second, func() bool { return hasNode(persisted(t, storeA), 1) })

	// B campaigns under Serve and starts its mgmtd once it wins.
	bctx, bstop := context.WithCancel(ctx)
	defer bstop()
	bAddr := make(chan string, 1)
	bDone := make(chan error, 1)
	start := time.Now()
	go func() {
		bDone <- lease.Serve(bctx, lb, func(rctx context.Context) error {
			mb, err := mgmtd.Start(rctx, mopts(storeB, lb))
			if err != nil {
				return err
			}
			bAddr <- mb.Addr()
			<-rctx.Done()
			return mb.Close()
		})
	}()
	var addrB string
	select {
	case addrB = <-bAddr:
	case <-time.After(15 * time.Second):
		t.Fatal("the standby did not take over")
	}
	t.Logf("standby took over %v after A's last renewal", time.Since(start).Round(time.Millisecond))
	if lb.Epoch() <= 1 {
		t.Fatalf("standby epoch %d", lb.Epoch())
	}

	// The standby resumed the persisted state and serves it.
	c, err := transport.Dial(ctx, addrB, transport.Options{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var rb proto.Routing
	if _, err := c.Call(ctx, proto.MGetRouting, struct{}{}, nil, &rb); err != nil {
		t.Fatal(err)
	}
	if !hasNode(&rb, 1) {
		t.Fatalf("standby's routing lacks node 1: %+v", rb)
	}
	before := persisted(t, storeB)

	// The old primary is still alive and acts on a new heartbeat: its
	// write must not land.
	if err := heartbeat(t, ma.Addr(), 9, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // many decision ticks of A
	after := persisted(t, storeB)
	if hasNode(after, 9) {
		t.Fatal("a write of the old primary landed after the takeover")
	}
	if after.Version < before.Version {
		t.Fatalf("persisted routing went back from v%d to v%d", before.Version, after.Version)
	}
	// A's own fenced writes fail with ErrNotHolder.
	err = storeA.Update(ctx, func(tx kv.Txn) error {
		if err := la.Fence(ctx, tx); err != nil {
			return err
		}
		tx.Set([]byte("x"), []byte("from A"))
		return nil
	})
	if !errors.Is(err, lease.ErrNotHolder) {
		t.Fatalf("old primary's fenced write: %v", err)
	}
	// The new primary's writes do land.
	if err := heartbeat(t, addrB, 2, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node 2 persisted by the new primary", 5*time.Second, func() bool { return hasNode(persisted(t, storeB), 2) })

	// A clean stop of B resigns: a new candidate takes over at once.
	bstop()
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	lc, _ := lease.New(storeA, lease.Options{Key: key, ID: "C", TTL: time.Second})
	if held, err := lc.TryAcquire(ctx); !held || err != nil {
		t.Fatalf("lease not free after the primary's clean stop: %v %v", held, err)
	}
}
