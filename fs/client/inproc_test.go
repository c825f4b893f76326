package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage"
)

type inproc struct {
	m        *mgmtd.Server
	storages []*storage.Service
	dir      string
	mopts    mgmtd.Options
}

func startStorage(t testing.TB, dir string, node int, maddr string) *storage.Service {
	return startStorageWith(t, dir, node, maddr, func(*storage.Config) {})
}

func startStorageVFS(t testing.TB, dir string, node int, maddr string, vfs storage.VFS) *storage.Service {
	return startStorageWith(t, dir, node, maddr, func(c *storage.Config) { c.VFS = vfs })
}

// startStorageWith starts storage service node, its config adjusted by
// tweak.
func startStorageWith(t testing.TB, dir string, node int, maddr string, tweak func(*storage.Config)) *storage.Service {
	var tcs []storage.TargetConfig
	for i := 1; i <= 2; i++ {
		tcs = append(tcs, storage.TargetConfig{ID: proto.TargetID(node*100 + i), Dir: filepath.Join(dir, fmt.Sprintf("s%d/t%d", node, i))})
	}
	cfg := storage.Config{Node: proto.NodeID(node), Targets: tcs, Mgmtd: []string{maddr}, Token: "tok",
		Logf: func(f string, a ...any) { t.Logf(f, a...) }}
	tweak(&cfg)
	s, err := storage.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func startInproc(t testing.TB) *inproc {
	t.Helper()
	return startInprocWith(t, func(int, *storage.Config) {})
}

// startInprocWith is startInproc with each storage service's config
// adjusted by tweak.
func startInprocWith(t testing.TB, tweak func(node int, c *storage.Config)) *inproc {
	t.Helper()
	c := &inproc{dir: t.TempDir()}
	// A 2 s fail timeout: with less, a loaded CI machine (load 50 on 2
	// cores) made every storage service fence itself at once now and then,
	// reordering chains under the tests' feet.
	c.mopts = mgmtd.Options{Token: "tok", Store: memkv.New(memkv.Options{}), Replicas: 3, ExpectTargets: 6,
		HeartbeatInterval: 100 * time.Millisecond, FailTimeout: 2 * time.Second, UpdateInterval: 20 * time.Millisecond,
		Logf: func(f string, a ...any) { t.Logf(f, a...) }}
	var err error
	c.m, err = mgmtd.Start(context.Background(), c.mopts)
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 3; n++ {
		c.storages = append(c.storages, startStorageWith(t, c.dir, n, c.m.Addr(), func(cfg *storage.Config) { tweak(n, cfg) }))
	}
	t.Cleanup(func() {
		for _, s := range c.storages {
			if s != nil {
				s.Close()
			}
		}
		c.m.Close()
	})
	waitServing(t, c.m, 10*time.Second)
	return c
}

// dial connects a client to the cluster (opts.Token is set), closed when
// the test ends.
func (c *inproc) dial(t testing.TB, opts Options) *Client {
	t.Helper()
	opts.Token = "tok"
	cl, err := Dial(context.Background(), []string{c.m.Addr()}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
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

func waitServing(t testing.TB, m *mgmtd.Server, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !allServing(m.Routing()) {
		if time.Now().After(deadline) {
			t.Fatalf("cluster not serving: %+v", m.Routing().Chains)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestInprocWriteReadFailover(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl := c.dial(t, Options{RetryTimeout: 20 * time.Second, RequestTimeout: 2 * time.Second})
	if len(cl.Chains()) != 2 {
		t.Fatalf("chains %v", cl.Chains())
	}
	rng := rand.New(rand.NewPCG(1, 1))
	model := map[ChunkID][]byte{}
	write := func(chain ChainID, id ChunkID, off int, n int) {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		if err := cl.WriteChunk(ctx, chain, id, int64(off), data); err != nil {
			t.Fatal(err)
		}
		m := model[id]
		if len(m) < off+n {
			m = append(m, make([]byte, off+n-len(m))...)
		}
		copy(m[off:], data)
		model[id] = m
	}
	check := func() {
		t.Helper()
		var reads []ChunkRead
		for id, m := range model {
			chain := ChainID(id.Inode%2 + 1)
			reads = append(reads, ChunkRead{Chain: chain, Chunk: id, Off: 0, Buf: make([]byte, len(m)+10)})
			if len(m) > 5000 {
				reads = append(reads, ChunkRead{Chain: chain, Chunk: id, Off: 1000, Buf: make([]byte, 3000)})
			}
		}
		if err := cl.ReadChunks(ctx, reads); err != nil {
			t.Fatal(err)
		}
		for _, rd := range reads {
			m := model[rd.Chunk]
			want := append(append([]byte(nil), m...), make([]byte, 10)...)[rd.Off : rd.Off+int64(len(rd.Buf))]
			if !bytes.Equal(rd.Buf, want) {
				t.Fatalf("chunk %v off %d: data differs", rd.Chunk, rd.Off)
			}
		}
	}
	for i := 0; i < 20; i++ {
		id := ChunkID{Inode: uint64(i % 4), Index: uint64(i % 3)}
		write(ChainID(id.Inode%2+1), id, rng.IntN(200<<10), rng.IntN(300<<10)+1)
	}
	check()
	// Kill node 1 (a head of one chain): writes and reads go on.
	c.storages[0].Close()
	c.storages[0] = nil
	for i := 0; i < 10; i++ {
		id := ChunkID{Inode: uint64(i % 4), Index: uint64(i % 3)}
		write(ChainID(id.Inode%2+1), id, rng.IntN(200<<10), rng.IntN(100<<10)+1)
	}
	check()
	// Bring it back: it resyncs and serves again.
	c.storages[0] = startStorage(t, c.dir, 1, c.m.Addr())
	for i := 0; i < 10; i++ {
		id := ChunkID{Inode: uint64(i % 4), Index: uint64(i % 3)}
		write(ChainID(id.Inode%2+1), id, rng.IntN(200<<10), rng.IntN(100<<10)+1)
	}
	waitServing(t, c.m, 10*time.Second)
	check()
	t.Logf("routing: %+v", c.m.Routing().Chains)
}

// TestInprocFullDisk: a full disk on one replica fails writes on its
// chains with fs.ErrNoSpace at once (no retry loop), corrupts nothing, and
// writes work again once space is back.
func TestInprocFullDisk(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	full := &storage.FaultVFS{VFS: storage.OS{}}
	c.storages[2].Close()
	c.storages[2] = startStorageVFS(t, c.dir, 3, c.m.Addr(), full)
	deadline := time.Now().Add(10 * time.Second)
	for !c.m.Ready() || c.m.Routing().Chain(1).Version < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("restarted node not back: %v", c.m.Routing().Chains)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cl := c.dial(t, Options{RetryTimeout: 10 * time.Second})
	id := ChunkID{Inode: 1}
	if err := cl.WriteChunk(ctx, 1, id, 0, []byte("before")); err != nil {
		t.Fatal(err)
	}
	full.NoSpace.Store(true)
	start := time.Now()
	err := cl.WriteChunk(ctx, 1, id, 0, []byte("during"))
	if !errors.Is(err, fs.ErrNoSpace) {
		t.Fatalf("want fs.ErrNoSpace, got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("full disk error took %v (retried?)", time.Since(start))
	}
	t.Logf("full disk: %v", err)
	full.NoSpace.Store(false)
	// The failed write left the chain consistent: the head re-drives or
	// the next write replaces its pending version.
	if err := cl.WriteChunk(ctx, 1, id, 0, []byte("after!")); err != nil {
		t.Fatal(err)
	}
	rd := []ChunkRead{{Chain: 1, Chunk: id, Buf: make([]byte, 6)}}
	if err := cl.ReadChunks(ctx, rd); err != nil || string(rd[0].Buf) != "after!" {
		t.Fatalf("read: %v %q", err, rd[0].Buf)
	}
	ch := cl.Routing().Chain(1)
	var ref []proto.ChunkMeta
	for i, tg := range ch.Readable() {
		m, err := cl.ReplicaChunks(ctx, 1, tg.ID, 1)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && fmt.Sprint(m) != fmt.Sprint(ref) {
			t.Fatalf("replicas differ: %v vs %v", ref, m)
		}
		ref = m
	}
}

// TestInprocTruncateRemoveList covers the rest of the chunk API and a
// chunk removed while one replica was down: the returning replica drops it
// in its resync.
func TestInprocTruncateRemoveList(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl := c.dial(t, Options{RetryTimeout: 20 * time.Second})
	for i := uint64(0); i < 4; i++ {
		if err := cl.WriteChunk(ctx, 1, ChunkID{Inode: 9, Index: i}, 0, bytes.Repeat([]byte{byte('a' + i)}, 10000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.TruncateChunk(ctx, 1, ChunkID{Inode: 9, Index: 1}, 100); err != nil {
		t.Fatal(err)
	}
	if err := cl.TruncateChunk(ctx, 1, ChunkID{Inode: 9, Index: 2}, 20000); err != nil {
		t.Fatal(err)
	}
	infos, err := cl.ListChunks(ctx, 1, 9)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(infos) != "[{0 10000} {1 100} {2 20000} {3 10000}]" {
		t.Fatalf("list: %v", infos)
	}
	rd := []ChunkRead{{Chain: 1, Chunk: ChunkID{Inode: 9, Index: 2}, Off: 9998, Buf: make([]byte, 4)}}
	if err := cl.ReadChunks(ctx, rd); err != nil || string(rd[0].Buf) != "cc\x00\x00" || rd[0].N != 4 {
		t.Fatalf("read across the extended end: %v %q n=%d", err, rd[0].Buf, rd[0].N)
	}
	// One replica goes down; chunks 2 and 3 are removed meanwhile.
	down := cl.Routing().Chain(1).Targets[2]
	c.storages[down.Node-1].Close()
	if err := cl.RemoveChunks(ctx, 1, 9, 2); err != nil {
		t.Fatal(err)
	}
	if infos, err = cl.ListChunks(ctx, 1, 9); err != nil || fmt.Sprint(infos) != "[{0 10000} {1 100}]" {
		t.Fatalf("after remove: %v %v", infos, err)
	}
	rd = []ChunkRead{{Chain: 1, Chunk: ChunkID{Inode: 9, Index: 3}, Buf: make([]byte, 10)}}
	if err := cl.ReadChunks(ctx, rd); err != nil || rd[0].N != 0 || string(rd[0].Buf) != string(make([]byte, 10)) {
		t.Fatalf("removed chunk read: %v n=%d", err, rd[0].N)
	}
	v0 := c.m.Routing().Chain(1).Version
	c.storages[down.Node-1] = startStorage(t, c.dir, int(down.Node), c.m.Addr())
	deadline := time.Now().Add(10 * time.Second)
	for !c.m.Ready() || c.m.Routing().Chain(1).Version < v0+2 {
		if time.Now().After(deadline) {
			t.Fatalf("replica not back: %v", c.m.Routing().Chains)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cl.Refresh(ctx)
	for _, tg := range cl.Routing().Chain(1).Readable() {
		m, err := cl.ReplicaChunks(ctx, 1, tg.ID, 9)
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != 2 {
			t.Fatalf("target %d lists %v after resync", tg.ID, m)
		}
	}
}
