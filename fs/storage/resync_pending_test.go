package storage

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/fstest"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
)

// Power loss of every replica right after an acknowledged write: its
// commit rename is lost everywhere, so the returning last serving target
// holds it only as a pending version (its committed file is the older
// version). Resyncing the other replica must not copy that older committed
// version over it (the successor would then serve a rolled-back chunk):
// the head finishes its pending version first. Re-driving by the
// background loop is disabled (PendingTimeout), so only resync can do it.
func TestResyncFinishesPendingOfLastServing(t *testing.T) {
	ctx := context.Background()
	m, err := mgmtd.Start(ctx, mgmtd.Options{Token: "tok", Store: memkv.New(memkv.Options{}), Replicas: 2, ExpectTargets: 2,
		HeartbeatInterval: 50 * time.Millisecond, FailTimeout: 500 * time.Millisecond, UpdateInterval: 20 * time.Millisecond, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	disks := map[int]*CrashFS{1: NewCrashFS(), 2: NewCrashFS()}
	services := map[int]*Service{}
	start := func(n int) {
		s, err := Start(Config{Node: proto.NodeID(n), Mgmtd: []string{m.Addr()}, Token: "tok", VFS: disks[n], Logf: t.Logf,
			PendingTimeout: time.Hour,
			Targets:        []TargetConfig{{ID: proto.TargetID(n), Dir: fmt.Sprintf("/n%d", n)}}})
		if err != nil {
			t.Fatal(err)
		}
		services[n] = s
	}
	defer func() {
		for _, s := range services {
			s.Close()
		}
	}()
	start(1)
	start(2)
	fstest.WaitReady(t, m, 15*time.Second)
	cl, err := client.Dial(ctx, []string{m.Addr()}, client.Options{Token: "tok", RetryTimeout: 10 * time.Second,
		RequestTimeout: time.Second, RefreshInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	id := proto.ChunkID{Inode: 1}
	if err := cl.WriteChunk(ctx, 1, id, 0, []byte("aaaaaaaa")); err != nil {
		t.Fatal(err)
	}
	if err := cl.WriteChunk(ctx, 1, id, 2, []byte("BB")); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 2; n++ {
		services[n].Close()
		delete(services, n)
		disks[n].Crash()
	}
	for n := 1; n <= 2; n++ {
		re, err := OpenTarget(disks[n], proto.TargetID(n), fmt.Sprintf("/n%d", n))
		if err != nil {
			t.Fatal(err)
		}
		if mt := re.Meta(id); mt.CommitVer != 1 || mt.UpdateVer != 2 {
			t.Fatalf("target %d after the power loss: %+v, want v1 committed and v2 pending", n, mt)
		}
	}
	time.Sleep(600 * time.Millisecond) // mgmtd notices
	start(1)
	start(2)
	fstest.WaitReady(t, m, 15*time.Second)
	for n := 1; n <= 2; n++ {
		ts := services[n].targets[proto.TargetID(n)]
		b, mt := content(t, ts, id)
		if string(b) != "aaBBaaaa" || mt.CommitVer != 2 || mt.UpdateVer != 2 {
			t.Errorf("target %d serves %q %+v, want the acknowledged %q at v2", n, b, mt, "aaBBaaaa")
		}
	}
	var out [2][]byte
	for i := range out {
		out[i] = make([]byte, 8)
		if err := cl.ReadChunks(ctx, []client.ChunkRead{{Chain: 1, Chunk: id, Buf: out[i]}}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out[i], []byte("aaBBaaaa")) {
			t.Fatalf("read %q", out[i])
		}
	}
}
