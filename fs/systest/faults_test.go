package systest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage"
)

// Tests 1 and 2: kill -9 the head, then the middle, then the tail of a
// chain during a stream of writes; writes resume after reconfiguration;
// the restarted process resyncs while writes continue and serves again;
// every acknowledged write is readable, replicas are identical, and no
// write was applied twice (each chunk's version = its acknowledged writes).
func TestKillStorageDuringWritesThenResync(t *testing.T) {
	c := newCluster(t, 3)
	m := newModel()
	stop := c.writers(m, 4)
	waitWrites(t, m, 20, 10*time.Second)
	for _, pos := range []string{"head", "middle", "tail"} {
		ch := c.routing().Chain(1)
		idx := map[string]int{"head": 0, "middle": 1, "tail": 2}[pos]
		victim := ch.Targets[idx]
		t.Logf("kill -9 storage-%d (the %s of %s)", victim.Node, pos, ch)
		c.killStorage(int(victim.Node))
		c.waitChain(1, 5*time.Second, "victim moved to the end", func(ch *proto.Chain) bool {
			last := ch.Targets[len(ch.Targets)-1]
			return last.ID == victim.ID && last.State == proto.Offline
		})
		waitWrites(t, m, 20, 15*time.Second) // writes resume on the shorter chain
		c.startStorage(int(victim.Node))
		waitWrites(t, m, 10, 15*time.Second) // and go on during the resync
		c.waitServing(20 * time.Second)
		waitWrites(t, m, 10, 15*time.Second)
	}
	n := stop()
	t.Logf("%d writes acknowledged", n)
	c.check(m, true)
}

// Test 3: kill every replica of the chains, one after the other, then
// bring them back in the wrong order: while only stale replicas are back
// nothing is served (no stale data); once the last-serving one returns,
// its data wins and everyone resyncs from it.
func TestAllReplicasDownWrongOrder(t *testing.T) {
	c := newCluster(t, 3)
	m := newModel()
	stop := c.writers(m, 2)
	waitWrites(t, m, 10, 10*time.Second)
	order := c.routing().Chain(1).Targets // kill tail, middle, then head
	for _, i := range []int{2, 1} {
		c.killStorage(int(order[i].Node))
		c.waitChain(1, 5*time.Second, "dead target offline", func(ch *proto.Chain) bool {
			tg, _ := ch.Target(order[i].ID)
			return tg.State == proto.Offline
		})
		waitWrites(t, m, 10, 15*time.Second) // acknowledged by fewer replicas
	}
	stop()
	last := order[0]
	c.killStorage(int(last.Node))
	c.waitChain(1, 5*time.Second, "last serving target becomes lastsrv", func(ch *proto.Chain) bool {
		tg, _ := ch.Target(last.ID)
		return tg.State == proto.LastSrv
	})
	// The stale ones come back first.
	c.startStorage(int(order[2].Node))
	c.startStorage(int(order[1].Node))
	time.Sleep(3 * failTimeout)
	for _, ch := range c.routing().Chains {
		if len(ch.Readable()) != 0 {
			t.Fatalf("stale replicas serve while the last-serving one is down: %s", ch.String())
		}
	}
	short, err := client.Dial(context.Background(), []string{c.mgmtdAddr}, client.Options{Token: c.token, RetryTimeout: 500 * time.Millisecond, RequestTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	for id := range m.chunks {
		rd := []client.ChunkRead{{Chain: m.chain[id], Chunk: id, Buf: make([]byte, 10)}}
		if err := short.ReadChunks(context.Background(), rd); err == nil {
			t.Fatalf("chunk %v read while only stale replicas are up", id)
		}
		break
	}
	c.startStorage(int(last.Node))
	c.waitServing(20 * time.Second)
	c.check(m, false)
}

// Test 4: partition the head from its successor (both still talk to
// mgmtd): writes on that chain stall and fail at the client's deadline;
// after the partition heals they go through, and the replicas never
// diverge.
func TestPartitionHeadFromSuccessor(t *testing.T) {
	c := newCluster(t, 3)
	m := newModel()
	ctx := context.Background()
	for i := 0; i < 6; i++ {
		id := client.ChunkID{Inode: 7, Index: uint64(i)}
		data := []byte(fmt.Sprintf("before partition %d", i))
		if err := c.cl.WriteChunk(ctx, 1, id, 0, data); err != nil {
			t.Fatal(err)
		}
		m.apply(1, id, 0, data)
	}
	ch := c.routing().Chain(1)
	head, succ := ch.Targets[0], ch.Targets[1]
	if err := os.WriteFile(c.faults, []byte(fmt.Sprintf("block storage-%d storage-%d\n", head.Node, succ.Node)), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the fault file is re-read every 50 ms
	short, err := client.Dial(ctx, []string{c.mgmtdAddr}, client.Options{Token: c.token, RetryTimeout: 1500 * time.Millisecond, RequestTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	maybe := client.ChunkID{Inode: 7, Index: 99}
	start := time.Now()
	err = short.WriteChunk(ctx, 1, maybe, 0, []byte("written during the partition"))
	if err == nil {
		t.Fatal("a write went through a partitioned chain")
	}
	t.Logf("write during partition failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	// Reads of committed chunks still work (any serving replica).
	rd := []client.ChunkRead{{Chain: 1, Chunk: client.ChunkID{Inode: 7, Index: 1}, Buf: make([]byte, 18)}}
	if err := c.cl.ReadChunks(ctx, rd); err != nil || string(rd[0].Buf) != "before partition 1" {
		t.Fatalf("read during partition: %v %q", err, rd[0].Buf)
	}
	if r := c.routing().Chain(1); r.Version != ch.Version {
		t.Logf("chain changed during the partition: %s", r)
	}
	os.Remove(c.faults)
	for i := 0; i < 6; i++ {
		id := client.ChunkID{Inode: 7, Index: uint64(i)}
		data := []byte(fmt.Sprintf("after partition %d", i))
		if err := c.cl.WriteChunk(ctx, 1, id, 0, data); err != nil {
			t.Fatalf("write after heal: %v", err)
		}
		m.apply(1, id, 0, data)
	}
	c.check(m, false) // includes the maybe chunk in the replica comparison
}

// Test 5: flip a bit in one replica's chunk file: reading that replica
// fails its block checksum, a client read is served by another replica,
// and the bad replica leaves its chain, is resynced and serves the right
// bytes again.
func TestBitFlipCaughtAndRepaired(t *testing.T) {
	c := newCluster(t, 3)
	m := newModel()
	ctx := context.Background()
	id := client.ChunkID{Inode: 9, Index: 0}
	data := make([]byte, 200<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := c.cl.WriteChunk(ctx, 1, id, 0, data); err != nil {
		t.Fatal(err)
	}
	m.apply(1, id, 0, data)
	ch := c.routing().Chain(1)
	bad := ch.Targets[1]
	path := filepath.Join(c.targetDir(int(bad.Node), int(bad.ID)%100), "chunks", id.String()+".1")
	flipBit(t, path, storage.HeaderSize+70000)
	// Reading that replica fails its block checksum.
	_, err := c.cl.ReadReplica(ctx, 1, bad.ID, id, 65536, 10000)
	if !errors.Is(err, proto.ErrChecksum) {
		t.Fatalf("bad replica read: want checksum error, got %v", err)
	}
	// Reads through the client are right whichever replica they pick:
	// small ones (verified by the target) and large block-aligned ones
	// (sent unverified from the page cache with their block CRCs, and
	// verified by the client, which has the target re-check and repair).
	for i := 0; i < 5; i++ {
		rd := []client.ChunkRead{{Chain: 1, Chunk: id, Off: 65536, Buf: make([]byte, 10000)}}
		if err := c.cl.ReadChunks(ctx, rd); err != nil {
			t.Fatal(err)
		}
		if string(rd[0].Buf) != string(data[65536:75536]) {
			t.Fatal("client read returned corrupt bytes")
		}
		big := []client.ChunkRead{{Chain: 1, Chunk: id, Off: 0, Buf: make([]byte, len(data))}}
		if err := c.cl.ReadChunks(ctx, big); err != nil {
			t.Fatal(err)
		}
		if big[0].N != len(data) || string(big[0].Buf) != string(data) {
			t.Fatal("large client read returned corrupt bytes")
		}
	}
	c.waitChain(1, 10*time.Second, "bad replica left and came back serving", func(now *proto.Chain) bool {
		tg, _ := now.Target(bad.ID)
		return now.Version > ch.Version+1 && tg.State == proto.Serving
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := c.cl.ReadReplica(ctx, 1, bad.ID, id, 0, int64(len(data)))
		if err == nil && string(got) == string(data) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not repaired: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		c.routing()
	}
	c.check(m, false)
}

// Test 6: many concurrent writers and readers on the same chunks (and a
// storage process killed in the middle): the history is linearizable,
// checked per chunk with porcupine against a register model.
func TestConcurrentWritersLinearizable(t *testing.T) {
	c := newCluster(t, 3)
	ctx := context.Background()
	const size = 4096
	type input struct {
		write bool
		chunk int
		value uint64
	}
	var clients []*client.Client
	for i := 0; i < 3; i++ {
		cl, err := client.Dial(ctx, []string{c.mgmtdAddr}, client.Options{Token: c.token, RetryTimeout: 30 * time.Second, RequestTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients = append(clients, cl)
	}
	start := time.Now()
	var mu sync.Mutex
	var ops []porcupine.Operation
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			cl := clients[w%len(clients)]
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for i := 0; i < 40; i++ {
				in := input{write: rng.IntN(2) == 0, chunk: rng.IntN(2), value: rng.Uint64()}
				id := client.ChunkID{Inode: 5, Index: uint64(in.chunk)}
				call := time.Since(start).Nanoseconds()
				var out uint64
				if in.write {
					buf := make([]byte, size)
					for j := 0; j < size; j += 8 {
						binary.LittleEndian.PutUint64(buf[j:], in.value)
					}
					if err := cl.WriteChunk(ctx, 1, id, 0, buf); err != nil {
						errs <- err
						return
					}
				} else {
					rd := []client.ChunkRead{{Chain: 1, Chunk: id, Buf: make([]byte, size)}}
					if err := cl.ReadChunks(ctx, rd); err != nil {
						errs <- err
						return
					}
					out = binary.LittleEndian.Uint64(rd[0].Buf)
					for j := 0; j < size; j += 8 {
						if binary.LittleEndian.Uint64(rd[0].Buf[j:]) != out {
							out = ^uint64(0) // torn read: never a legal register value
							break
						}
					}
				}
				ret := time.Since(start).Nanoseconds()
				mu.Lock()
				ops = append(ops, porcupine.Operation{ClientId: w, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}(w)
	}
	time.Sleep(300 * time.Millisecond)
	tail := c.routing().Chain(1).Targets[2]
	c.killStorage(int(tail.Node))
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	model := porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			parts := map[int][]porcupine.Operation{}
			for _, op := range h {
				k := op.Input.(input).chunk
				parts[k] = append(parts[k], op)
			}
			var out [][]porcupine.Operation
			for _, p := range parts {
				out = append(out, p)
			}
			return out
		},
		Init: func() any { return uint64(0) },
		Step: func(state, in, out any) (bool, any) {
			i := in.(input)
			if i.write {
				return true, i.value
			}
			return out.(uint64) == state.(uint64), state
		},
	}
	res := porcupine.CheckOperationsTimeout(model, ops, 30*time.Second)
	if res != porcupine.Ok {
		t.Fatalf("history of %d operations is not linearizable (%v)", len(ops), res)
	}
	t.Logf("%d operations, linearizable", len(ops))
}

// Test 7: kill -9 mgmtd during writes and restart it: it resumes its
// persisted chain table and the cluster carries on.
func TestMgmtdRestart(t *testing.T) {
	c := newCluster(t, 3)
	m := newModel()
	stop := c.writers(m, 2)
	waitWrites(t, m, 10, 10*time.Second)
	before := c.routing()
	c.mgmtd.kill()
	time.Sleep(300 * time.Millisecond)
	c.startMgmtd()
	waitWrites(t, m, 20, 20*time.Second)
	stop()
	c.waitServing(20 * time.Second)
	after := c.routing()
	if after.Version <= before.Version || len(after.Chains) != len(before.Chains) {
		t.Fatalf("mgmtd did not resume its state: before v%d %d chains, after v%d %d chains", before.Version, len(before.Chains), after.Version, len(after.Chains))
	}
	c.check(m, false)
}

// A storage service cut off from mgmtd (but not from clients) stops
// serving within half the fail timeout, before mgmtd declares it dead, so
// it can never serve data that a reconfiguration made stale; once the
// partition heals it rejoins through resync.
func TestPartitionFromMgmtdStopsServing(t *testing.T) {
	c := newCluster(t, 3)
	m := newModel()
	ctx := context.Background()
	id := client.ChunkID{Inode: 11}
	data := []byte("served until cut off from mgmtd")
	if err := c.cl.WriteChunk(ctx, 1, id, 0, data); err != nil {
		t.Fatal(err)
	}
	m.apply(1, id, 0, data)
	victim := c.routing().Chain(1).Targets[1]
	if _, err := c.cl.ReadReplica(ctx, 1, victim.ID, id, 0, 100); err != nil {
		t.Fatalf("before the partition: %v", err)
	}
	if err := os.WriteFile(c.faults, []byte(fmt.Sprintf("block storage-%d mgmtd\n", victim.Node)), 0o644); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	for {
		_, err := c.cl.ReadReplica(ctx, 1, victim.ID, id, 0, 100)
		if err != nil {
			t.Logf("replica stopped serving %v after the cut: %v", time.Since(cut).Round(time.Millisecond), err)
			break
		}
		if time.Since(cut) > failTimeout {
			t.Fatalf("replica still serving %v after losing mgmtd (fail timeout %v)", time.Since(cut), failTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Writes go on without it.
	data2 := []byte("written while storage is cut off")
	if err := c.cl.WriteChunk(ctx, 1, id, 0, data2); err != nil {
		t.Fatal(err)
	}
	m.apply(1, id, 0, data2)
	os.Remove(c.faults)
	c.waitServing(20 * time.Second)
	c.check(m, false)
}

// flipBit flips one bit of a file in place, as a failing disk would.
func flipBit(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
