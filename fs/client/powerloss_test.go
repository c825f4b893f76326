package client

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/fstest"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage"
)

// TestPowerLoss runs a cluster whose storage services keep their targets
// on CrashFS file systems, and cuts the power of one, two or all of them
// at random moments during a stream of writes: everything not fsynced is
// lost. After each round the cluster must serve again with every
// acknowledged write readable and identical replicas: acknowledged data
// survives on the fsynced pending versions even when the commit rename is
// lost everywhere (the head re-drives them).
func TestPowerLoss(t *testing.T) {
	ctx := context.Background()
	logf := func(string, ...any) {}
	m, err := mgmtd.Start(ctx, mgmtd.Options{Token: "tok", Store: memkv.New(memkv.Options{}), Replicas: 3, ExpectTargets: 6,
		HeartbeatInterval: 50 * time.Millisecond, FailTimeout: 500 * time.Millisecond, UpdateInterval: 20 * time.Millisecond, Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	disks := map[int]*storage.CrashFS{}
	services := map[int]*storage.Service{}
	start := func(n int) {
		if disks[n] == nil {
			disks[n] = storage.NewCrashFS()
		}
		s, err := storage.Start(storage.Config{Node: proto.NodeID(n), Mgmtd: []string{m.Addr()}, Token: "tok", VFS: disks[n],
			Targets:        []storage.TargetConfig{{ID: proto.TargetID(n*100 + 1), Dir: fmt.Sprintf("/n%d/t1", n)}, {ID: proto.TargetID(n*100 + 2), Dir: fmt.Sprintf("/n%d/t2", n)}},
			PendingTimeout: 200 * time.Millisecond, Logf: logf})
		if err != nil {
			t.Fatal(err)
		}
		services[n] = s
	}
	powerOff := func(n int) {
		services[n].Close()
		delete(services, n)
		disks[n].Crash()
	}
	defer func() {
		for _, s := range services {
			s.Close()
		}
	}()
	for n := 1; n <= 3; n++ {
		start(n)
	}
	fstest.WaitReady(t, m, 15*time.Second)
	cl, err := Dial(ctx, []string{m.Addr()}, Options{Token: "tok", RetryTimeout: 20 * time.Second, RequestTimeout: time.Second, RefreshInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	model := map[ChunkID][]byte{}
	chainOf := func(id ChunkID) ChainID { return ChainID(id.Index%2 + 1) }
	for round := 0; round < 6; round++ {
		// Writes, acknowledged ones go to the model.
		for i := 0; i < 15; i++ {
			id := ChunkID{Inode: 1, Index: uint64(rng.IntN(6))}
			off := rng.IntN(8 << 10)
			data := make([]byte, rng.IntN(8<<10)+1)
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			if err := cl.WriteChunk(ctx, chainOf(id), id, int64(off), data); err != nil {
				t.Fatalf("round %d: write: %v", round, err)
			}
			b := model[id]
			if len(b) < off+len(data) {
				b = append(b, make([]byte, off+len(data)-len(b))...)
			}
			copy(b[off:], data)
			model[id] = b
		}
		// Power loss of 1, 2 or all 3 services, then power back.
		k := rng.IntN(3) + 1
		victims := rng.Perm(3)[:k]
		for _, v := range victims {
			powerOff(v + 1)
		}
		t.Logf("round %d: power loss on %d service(s)", round, k)
		time.Sleep(600 * time.Millisecond) // mgmtd notices
		for _, v := range victims {
			start(v + 1)
		}
		fstest.WaitReady(t, m, 15*time.Second)
		var reads []ChunkRead
		for id, b := range model {
			reads = append(reads, ChunkRead{Chain: chainOf(id), Chunk: id, Buf: make([]byte, len(b))})
		}
		if err := cl.ReadChunks(ctx, reads); err != nil {
			t.Fatalf("round %d: read: %v", round, err)
		}
		for _, rd := range reads {
			if !bytes.Equal(rd.Buf, model[rd.Chunk]) {
				t.Fatalf("round %d: chunk %v lost acknowledged data", round, rd.Chunk)
			}
		}
		// Replicas identical once pending versions are resolved.
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := sameReplicas(ctx, cl, 1)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %v", round, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// sameReplicas checks that every serving replica of every chain lists the
// same chunks of inode (versions, lengths, checksums), none pending.
func sameReplicas(ctx context.Context, cl *Client, inode uint64) error {
	cl.Refresh(ctx)
	for _, ch := range cl.Routing().Chains {
		var ref string
		for i, tg := range ch.Readable() {
			m, err := cl.ReplicaChunks(ctx, ch.ID, tg.ID, inode)
			if err != nil {
				return err
			}
			if i == 0 {
				ref = fmt.Sprint(m)
			} else if fmt.Sprint(m) != ref {
				return fmt.Errorf("chain %d: replicas differ: %s vs %v", ch.ID, ref, m)
			}
		}
	}
	return nil
}
