package clusterfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/fstest"
	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/etcdkv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/meta"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage"
)

const token = "test-token"

// testCluster is a whole cluster in this process: mgmtd, three storage
// services with two targets each (chains of three), and metadata servers,
// all on one kv store, talking over loopback TCP.
type testCluster struct {
	t        testing.TB
	store    kv.Store
	m        *mgmtd.Server
	storages []*storage.Service
	metas    []*meta.Server
	chunks   *client.Client // the metadata servers' data-plane client
}

func quiet(t testing.TB) func(string, ...any) {
	return func(f string, a ...any) {}
}

func startCluster(t testing.TB, store kv.Store, metaServers int) *testCluster {
	t.Helper()
	ctx := context.Background()
	if store == nil {
		store = memkv.New(memkv.Options{})
	}
	c := &testCluster{t: t, store: store}
	var err error
	c.m, err = mgmtd.Start(ctx, mgmtd.Options{Token: token, Store: store, Replicas: 3, ExpectTargets: 6,
		ChunkSize: 256 << 10, HeartbeatInterval: 50 * time.Millisecond, FailTimeout: 600 * time.Millisecond,
		UpdateInterval: 20 * time.Millisecond, Logf: quiet(t)})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for n := 1; n <= 3; n++ {
		var tcs []storage.TargetConfig
		for i := 1; i <= 2; i++ {
			tcs = append(tcs, storage.TargetConfig{ID: proto.TargetID(n*100 + i), Dir: filepath.Join(dir, fmt.Sprintf("s%d/t%d", n, i))})
		}
		s, err := storage.Start(storage.Config{Node: proto.NodeID(n), Targets: tcs, Mgmtd: []string{c.m.Addr()}, Token: token, Logf: quiet(t)})
		if err != nil {
			t.Fatal(err)
		}
		c.storages = append(c.storages, s)
	}
	t.Cleanup(c.close)
	deadline := time.Now().Add(20 * time.Second)
	for !allServing(c.m.Routing()) {
		if time.Now().After(deadline) {
			t.Fatalf("cluster not serving: %+v", c.m.Routing().Chains)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.chunks, err = client.Dial(ctx, []string{c.m.Addr()}, client.Options{Token: token, RetryTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < metaServers; i++ {
		c.startMeta()
	}
	return c
}

func (c *testCluster) startMeta() *meta.Server {
	c.t.Helper()
	svc, err := meta.NewService(context.Background(), meta.Options{Store: c.store, Chunks: c.chunks, Stripe: 4})
	if err != nil {
		c.t.Fatal(err)
	}
	s, err := meta.StartServer(context.Background(), svc, meta.ServerOptions{Token: token, GCInterval: 100 * time.Millisecond, Logf: quiet(c.t)})
	if err != nil {
		c.t.Fatal(err)
	}
	c.metas = append(c.metas, s)
	return s
}

func (c *testCluster) close() {
	for _, s := range c.metas {
		if s != nil {
			s.Kill()
		}
	}
	if c.chunks != nil {
		c.chunks.Close()
	}
	for _, s := range c.storages {
		if s != nil {
			s.Close()
		}
	}
	c.m.Close()
}

func allServing(r *proto.Routing) bool {
	if len(r.Chains) == 0 {
		return false
	}
	for _, ch := range r.Chains {
		for _, tg := range ch.Targets {
			if tg.State != proto.Serving {
				return false
			}
		}
	}
	return true
}

func (c *testCluster) open(t testing.TB) *FS {
	t.Helper()
	f, err := Open(context.Background(), c.m.Addr(), Options{Token: token, RetryTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestFSConformance(t *testing.T) {
	c := startCluster(t, nil, 2)
	f := c.open(t)
	ctx := context.Background()
	if err := f.MkdirAll(ctx, "/conf"); err != nil {
		t.Fatal(err)
	}
	fstest.Run(t, f, "/conf")
}

func TestResolveScheme(t *testing.T) {
	c := startCluster(t, nil, 1)
	t.Setenv("FFKIT_TOKEN", token)
	ctx := context.Background()
	f, p, err := fs.Resolve(ctx, "ffkit://"+c.m.Addr()+"/data/x.bin")
	if err != nil {
		t.Fatal(err)
	}
	if p != "/data/x.bin" || f.String() != "ffkit://"+c.m.Addr() {
		t.Fatalf("resolved to %s %q", f, p)
	}
	if err := f.MkdirAll(ctx, "/data"); err != nil {
		t.Fatal(err)
	}
	w, err := f.Create(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("ffkit"), 200_000) // ~1 MB: several 256 KiB chunks
	w.Write(data)
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	r, err := f.Open(ctx, p, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A batch of ranges across chunk boundaries, one past the end.
	bufs := [][]byte{make([]byte, 100), make([]byte, 300_000), make([]byte, 10)}
	offs := []int64{0, 200_000, int64(len(data)) - 10}
	var reqs []fs.ReadRequest
	for i := range bufs {
		reqs = append(reqs, fs.ReadRequest{File: r, Off: offs[i], Buf: bufs[i]})
	}
	if err := f.ReadBatch(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	for i := range bufs {
		if !bytes.Equal(bufs[i], data[offs[i]:offs[i]+int64(len(bufs[i]))]) {
			t.Fatalf("range %d differs", i)
		}
	}
	err = f.ReadBatch(ctx, []fs.ReadRequest{{File: r, Off: int64(len(data)) - 5, Buf: make([]byte, 10)}})
	if !errors.Is(err, fs.ErrShortRead) {
		t.Fatalf("read past end: %v", err)
	}
}

// Removing and replacing files gives their chunks back: the collector
// removes them from every chain.
func TestGCRemovesChunks(t *testing.T) {
	c := startCluster(t, nil, 1)
	f := c.open(t)
	ctx := context.Background()
	write := func(name string, n int) {
		w, err := f.Create(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(bytes.Repeat([]byte{7}, n))
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	write("/a", 1<<20)
	st, _ := f.meta.Stat(ctx, "/a")
	chunksOf := func(inode uint64) int {
		n := 0
		for _, ch := range c.chunks.Chains() {
			infos, err := c.chunks.ListChunks(ctx, ch, inode)
			if err != nil {
				t.Fatal(err)
			}
			n += len(infos)
		}
		return n
	}
	if got := chunksOf(st.ID); got != 4 {
		t.Fatalf("a 1 MiB file in 256 KiB chunks has %d chunks", got)
	}
	write("/a", 10) // replace: the old inode's chunks are collected
	if err := f.Remove(ctx, "/a"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for chunksOf(st.ID) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("chunks of a replaced file still stored: %d", chunksOf(st.ID))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// An abandoned writer leaves nothing either.
	w, _ := f.Create(ctx, "/b")
	w.Write(bytes.Repeat([]byte{1}, 600_000))
	w.Close()
	if _, err := f.Stat(ctx, "/b"); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("abandoned file visible: %v", err)
	}
}

// Kill metadata servers in the middle of creates, renames and removes:
// the client fails over, and every operation takes effect exactly once
// (a retried create does not fail with "exists", a retried rename or
// remove does not fail with "not found").
func TestKillMetaServerMidOperations(t *testing.T) {
	c := startCluster(t, nil, 3)
	f := c.open(t)
	churn := fstest.Churn{Prefix: "/w", Workers: 4,
		// Create through the metadata service's own create (no data).
		Create: func(ctx context.Context, name string) error {
			_, err := f.meta.Create(ctx, name, true)
			return err
		}}
	churn.Run(t, f, func() {
		// Kill two of the three servers while the operations run, one after
		// the other, and start a new one in between.
		time.Sleep(300 * time.Millisecond)
		c.metas[0].Kill()
		c.metas[0] = nil
		time.Sleep(300 * time.Millisecond)
		c.startMeta()
		c.metas[1].Kill()
		c.metas[1] = nil
		time.Sleep(300 * time.Millisecond)
	})
}

// The multi-server test on a real three-member etcd cluster: mgmtd and
// three metadata servers share it; two metadata servers are killed
// mid-operations, and an etcd member too.
func TestKillMetaServerOnEtcdCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member etcd cluster")
	}
	ctx := context.Background()
	ecl, err := etcdkv.StartCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer ecl.Close()
	store, err := etcdkv.Open(ctx, ecl.Endpoints(), etcdkv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c := startCluster(t, store, 3)
	f := c.open(t)
	fstest.Churn{Prefix: "/e", Workers: 3}.Run(t, f, func() {
		time.Sleep(500 * time.Millisecond)
		c.metas[0].Kill()
		c.metas[0] = nil
		time.Sleep(500 * time.Millisecond)
		ecl.StopMember(2) // and an etcd member: the majority carries on
		c.metas[1].Kill()
		c.metas[1] = nil
		time.Sleep(500 * time.Millisecond)
	})
}
