package storage

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/fstest"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
)

// A storage service whose heartbeat goroutine is held up after mgmtd
// answered (a loaded host's scheduler, for longer than the fail timeout)
// is taken out of its chain by mgmtd and misses the writes acknowledged
// without it. When it runs again it must not count that old heartbeat as
// fresh contact: a reader still routed with the old chain version would
// read stale bytes from it. (It did: it recorded the time the answer was
// processed, not the time the heartbeat was sent, and served reads of the
// old chain version for half a fail timeout more.)
func TestDelayedHeartbeatDoesNotExtendServing(t *testing.T) {
	ctx := context.Background()
	const failTimeout = 2 * time.Second
	m, err := mgmtd.Start(ctx, mgmtd.Options{Token: "tok", Store: memkv.New(memkv.Options{}), Replicas: 2, ExpectTargets: 2,
		HeartbeatInterval: 50 * time.Millisecond, FailTimeout: failTimeout, UpdateInterval: 20 * time.Millisecond, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	dir := t.TempDir()
	svcs := map[proto.NodeID]*Service{}
	for n := 1; n <= 2; n++ {
		s, err := Start(Config{Node: proto.NodeID(n), Mgmtd: []string{m.Addr()}, Token: "tok", Logf: t.Logf,
			Targets: []TargetConfig{{ID: proto.TargetID(n), Dir: filepath.Join(dir, fmt.Sprint(n))}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		svcs[proto.NodeID(n)] = s
	}
	fstest.WaitReady(t, m, time.Minute)
	dial := func(refresh time.Duration) *client.Client {
		cl, err := client.Dial(ctx, []string{m.Addr()}, client.Options{Token: "tok", RetryTimeout: time.Minute, RefreshInterval: refresh})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	writer := dial(0)
	// The reader keeps the routing it dialled with (the old chain version).
	reader := dial(time.Hour)
	ch := reader.Routing().Chain(1)
	if ch == nil || len(ch.Readable()) != 2 {
		t.Fatalf("chain 1 is not two serving replicas: %+v", ch)
	}
	oldVer := ch.Version
	victim := ch.Targets[1] // the tail
	id := proto.ChunkID{Inode: 9}
	if err := writer.WriteChunk(ctx, 1, id, 0, []byte("old!")); err != nil {
		t.Fatal(err)
	}

	// Hold the victim's next answered heartbeat, then let it record that
	// one heartbeat and hold the one after (so that it does not learn the
	// new routing while the test reads from it).
	var mu sync.Mutex
	held := 0
	stuck := make(chan struct{}, 2) // one of the victim's heartbeats is held
	release := make(chan struct{})  // lets the first held one go
	done := make(chan struct{})     // test over: let everything go
	hook := func(s *Service) {
		if s != svcs[victim.Node] {
			return
		}
		mu.Lock()
		held++
		n := held
		mu.Unlock()
		if n > 2 {
			return // the test is over
		}
		stuck <- struct{}{}
		wait := release
		if n > 1 {
			wait = done
		}
		select {
		case <-wait:
		case <-done:
		case <-s.ctx.Done():
		}
	}
	testHookHeartbeat.Store(&hook)
	t.Cleanup(func() { testHookHeartbeat.Store(nil); close(done) })
	<-stuck

	// mgmtd takes the silent victim out of the chain...
	deadline := time.Now().Add(time.Minute)
	for {
		c := m.Routing().Chain(1)
		if tg, _ := c.Target(victim.ID); tg.State != proto.Serving {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mgmtd never took target %d out of chain 1: %s", victim.ID, c)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// ...and a write is acknowledged without it.
	if err := writer.WriteChunk(ctx, 1, id, 0, []byte("new!")); err != nil {
		t.Fatal(err)
	}
	// The held heartbeat goes through; wait until the victim has recorded
	// it (its next heartbeat is held).
	close(release)
	<-stuck

	if reader.Routing().Chain(1).Version != oldVer {
		t.Fatal("the reader's routing moved on; the test needs the old chain version")
	}
	got, err := reader.ReadReplica(ctx, 1, victim.ID, id, 0, 4)
	if err == nil {
		t.Fatalf("target %d, out of its chain, served a read of the old chain version: %q (the acknowledged write is %q)", victim.ID, got, "new!")
	}
	if !errors.Is(err, proto.ErrTargetOffline) {
		t.Fatalf("read from the fenced target: %v, want ErrTargetOffline", err)
	}
}
