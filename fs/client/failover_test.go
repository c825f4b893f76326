package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/internal/errkind"
)

func TestPreferFast(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		lat  []time.Duration
		pick int
		want int
	}{
		{[]time.Duration{0, 0, 0}, 1, 1},                // nothing known: affinity
		{[]time.Duration{5 * ms, 6 * ms, 7 * ms}, 2, 2}, // alike: affinity
		{[]time.Duration{5 * ms, 500 * ms, 7 * ms}, 1, 0},
		{[]time.Duration{9 * ms, 500 * ms, 7 * ms}, 1, 2},
		{[]time.Duration{1 * ms, 15 * ms, 2 * ms}, 1, 1},     // slower but under the floor
		{[]time.Duration{10 * ms, 39 * ms, 0}, 1, 1},         // under slowFactor
		{[]time.Duration{10 * ms, 41 * ms, 0}, 1, 0},         // over it
		{[]time.Duration{0, 800 * ms, 0}, 1, 1},              // the only one known
		{[]time.Duration{0, 0, 30 * ms}, 0, 0},               // preferred unknown: keeps it
		{[]time.Duration{100 * ms, 100 * ms}, 0, 0},          // equal
		{[]time.Duration{2000 * ms, 30 * ms, 20 * ms}, 0, 2}, // the fastest, not the next
	} {
		if got := preferFast(tc.lat, tc.pick); got != tc.want {
			t.Errorf("preferFast(%v, %d) = %d, want %d", tc.lat, tc.pick, got, tc.want)
		}
	}
}

func TestBackoffGrows(t *testing.T) {
	prev := time.Duration(0)
	for f := int32(0); f < 20; f++ {
		d := backoff(f)
		if d < prev || d > backoffMax {
			t.Fatalf("backoff(%d) = %v after %v", f, d, prev)
		}
		prev = d
	}
	if backoff(1) != backoffBase || backoff(2) != 2*backoffBase || backoff(40) != backoffMax {
		t.Fatalf("backoff: %v %v %v", backoff(1), backoff(2), backoff(40))
	}
	var n nodeLoad
	n.failed()
	n.failed()
	if !n.avoid() || n.fails.Load() != 2 {
		t.Fatal("a failed node is not avoided")
	}
	n.succeeded(time.Millisecond)
	if n.avoid() || n.fails.Load() != 0 || n.recentLatency(time.Now().UnixNano()) != time.Millisecond {
		t.Fatal("a success does not clear the backoff")
	}
}

func TestRetryWindowEnv(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 60 * time.Second, "90s": 90 * time.Second, "2.5": 2500 * time.Millisecond,
		"junk": 60 * time.Second, "-3s": 60 * time.Second, "0": 60 * time.Second} {
		t.Setenv("FFKIT_RETRY_WINDOW", v)
		if got := RetryWindow(); got != want {
			t.Errorf("FFKIT_RETRY_WINDOW=%q: %v, want %v", v, got, want)
		}
	}
	t.Setenv("FFKIT_RETRY_WINDOW", "7s")
	var o Options
	o.defaults()
	if o.RetryTimeout != 7*time.Second {
		t.Fatalf("default RetryTimeout %v", o.RetryTimeout)
	}
}

// A restarted metadata server registers on a new port without a routing
// change: the client takes the new list at the same routing version.
func TestSetRoutingTakesNewMetaList(t *testing.T) {
	c := &Client{}
	c.setRouting(&proto.Routing{Version: 3, Meta: []string{"a:1", "b:2"}})
	c.setRouting(&proto.Routing{Version: 3, Meta: []string{"a:1", "c:3"}})
	if got := c.Routing().Meta; len(got) != 2 || got[1] != "c:3" {
		t.Fatalf("meta list %v", got)
	}
	c.setRouting(&proto.Routing{Version: 2, Meta: []string{"old:1"}})
	if got := c.Routing(); got.Version != 3 || got.Meta[0] != "a:1" {
		t.Fatalf("an older routing was taken: %+v", got)
	}
}

// silentListener accepts connections and never answers: a dial to it
// completes at the TCP level and then waits for the handshake until the
// dial timeout, as a host that drops this client's packets would (the SYN
// case is tested across network namespaces in fs/systest).
func silentListener(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// TestUnreachableReplica: a replica this client cannot reach (while mgmtd
// reports it serving) is skipped by reads, which all succeed; a write to
// a chain it heads fails after the retry window with fs.ErrUnavailable
// naming the chain, the head target and its address.
func TestUnreachableReplica(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl := c.dial(t, Options{RetryTimeout: 20 * time.Second, RequestTimeout: 5 * time.Second, RefreshInterval: time.Hour})
	var ids []ChunkID
	var chains []ChainID
	var want [][]byte
	for i := 0; i < 30; i++ {
		ch := cl.Chains()[i%len(cl.Chains())]
		id := ChunkID{Inode: 99, Index: uint64(i)}
		data := bytes.Repeat([]byte{byte(i + 1)}, 70000+i)
		if err := cl.WriteChunk(ctx, ch, id, 0, data); err != nil {
			t.Fatal(err)
		}
		ids, chains, want = append(ids, id), append(chains, ch), append(want, data)
	}
	// This client's view: node 2 lives at an address that never answers.
	// The routing is otherwise mgmtd's own (same chain versions), with a
	// newer version so that no refresh replaces it.
	r := *cl.Routing()
	r.Version += 1000
	r.Nodes = append([]proto.Node(nil), r.Nodes...)
	bad := silentListener(t)
	for i := range r.Nodes {
		if r.Nodes[i].ID == 2 {
			r.Nodes[i].Addr = bad
		}
	}
	// A fresh client (no connection made yet), reading over the
	// connections only (no short-circuit reads on this one host).
	cl = c.dial(t, Options{RetryTimeout: 20 * time.Second, RequestTimeout: 5 * time.Second, RefreshInterval: time.Hour, NoLocalReads: true})
	cl.setRouting(&r)
	for i, id := range ids {
		rd := []ChunkRead{{Chain: chains[i], Chunk: id, Buf: make([]byte, len(want[i]))}}
		if err := cl.ReadChunks(ctx, rd); err != nil {
			t.Fatalf("read %d with node 2 unreachable: %v", i, err)
		}
		if !bytes.Equal(rd[0].Buf, want[i]) {
			t.Fatalf("read %d: other bytes", i)
		}
	}
	if !cl.node(2).avoid() && cl.node(2).fails.Load() == 0 {
		t.Fatal("the unreachable node is not backed off")
	}
	// A write to the chain node 2 heads.
	var headed *proto.Chain
	for i := range r.Chains {
		if h, ok := r.Chains[i].Head(); ok && h.Node == 2 {
			headed = &r.Chains[i]
		}
	}
	if headed == nil {
		t.Skip("node 2 heads no chain")
	}
	short := c.dial(t, Options{RetryTimeout: 2 * time.Second, RequestTimeout: time.Second, RefreshInterval: time.Hour})
	short.setRouting(&r)
	err := short.WriteChunk(ctx, headed.ID, ChunkID{Inode: 100}, 0, []byte("x"))
	if err == nil || !errors.Is(err, fs.ErrUnavailable) || errkind.Of(err) != errkind.Unavailable {
		t.Fatalf("write through an unreachable head: %v", err)
	}
	h, _ := headed.Head()
	for _, s := range []string{fmt.Sprintf("chain %d's head, target %d", headed.ID, h.ID), bad, "unreachable from this client"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

// slowProxy forwards connections to addr; once slow is set, it holds
// every piece of the server's answers for delay: a replica behind a slow
// link.
func slowProxy(t *testing.T, addr string, delay time.Duration, slow *atomic.Bool) string {
	return slowProxyCounting(t, addr, delay, slow, nil)
}

// slowProxyCounting is slowProxy that also counts, in delivered, the
// pieces of answers passed on after being held.
func slowProxyCounting(t *testing.T, addr string, delay time.Duration, slow *atomic.Bool, delivered *atomic.Int64) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn // guarded by mu
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(up, c); up.Close() }()
			go func() {
				defer wg.Done()
				buf := make([]byte, 256<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 {
						held := slow.Load()
						if held {
							time.Sleep(delay)
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
						if held && delivered != nil {
							delivered.Add(1)
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestSlowReplicaPassedOver: with one replica behind a link that holds
// every answer for a second, reads go to the others: the slow one gets a
// few requests (until the others have latency samples, and one each time
// its own sample goes stale), not every read of the chunks whose affinity
// picks it.
func TestSlowReplicaPassedOver(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl := c.dial(t, Options{RetryTimeout: 30 * time.Second, RefreshInterval: time.Hour})
	const n = 90
	for i := 0; i < n; i++ {
		if err := cl.WriteChunk(ctx, cl.Chains()[i%2], ChunkID{Inode: 5, Index: uint64(i)}, 0, bytes.Repeat([]byte{byte(i)}, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	r := *cl.Routing()
	r.Version += 1000
	r.Nodes = append([]proto.Node(nil), r.Nodes...)
	var slow atomic.Bool
	for i := range r.Nodes {
		if r.Nodes[i].ID == 2 {
			r.Nodes[i].Addr = slowProxy(t, r.Nodes[i].Addr, time.Second, &slow)
		}
	}
	cl = c.dial(t, Options{RetryTimeout: 30 * time.Second, RefreshInterval: time.Hour, NoLocalReads: true})
	cl.setRouting(&r)
	// Connected to every node first (the connect hedge is another test's),
	// then node 2's link turns slow.
	for _, nd := range r.Nodes {
		if _, err := cl.connect(ctx, nd.Addr, cl.node(nd.ID), false); err != nil {
			t.Fatal(err)
		}
	}
	slow.Store(true)
	prefer2 := 0
	for i := 0; i < n; i++ {
		id := ChunkID{Inode: 5, Index: uint64(i)}
		ch := r.Chain(cl.Chains()[i%2])
		if ch.Targets[chunkHash(id)%uint64(len(ch.Targets))].Node == 2 {
			prefer2++
		}
		rd := []ChunkRead{{Chain: ch.ID, Chunk: id, Buf: make([]byte, 4096)}}
		if err := cl.ReadChunks(ctx, rd); err != nil {
			t.Fatal(err)
		}
		if rd[0].N != 4096 || rd[0].Buf[0] != byte(i) {
			t.Fatalf("chunk %d: other bytes", i)
		}
	}
	got := cl.node(2).reads.Load()
	t.Logf("%d of %d chunks prefer the slow replica; it got %d requests", prefer2, n, got)
	if prefer2 < 10 {
		t.Skipf("only %d chunks prefer node 2", prefer2)
	}
	// Without preferFast it gets one per chunk preferring it.
	if 3*got > int64(prefer2) {
		t.Fatalf("the slow replica got %d requests (of %d chunks preferring it)", got, prefer2)
	}
}

func TestHedgeAfter(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		others []hedgeSample
		bytes  int64
		want   time.Duration
	}{
		{nil, 1 << 20, 0},                                      // no other replica known: never
		{[]hedgeSample{{0, 0}}, 1 << 20, 0},                    // its latency unknown: never
		{[]hedgeSample{{10 * ms, 1 << 20}}, 1 << 20, 150 * ms}, // the floor
		{[]hedgeSample{{100 * ms, 1 << 20}}, 1 << 20, 400 * ms},
		{[]hedgeSample{{100 * ms, 1 << 20}, {50 * ms, 1 << 20}}, 1 << 20, 200 * ms}, // the fastest
		{[]hedgeSample{{100 * ms, 1 << 20}}, 4 << 20, 1600 * ms},                    // a larger batch
		{[]hedgeSample{{100 * ms, 1 << 20}}, 4 << 10, 400 * ms},                     // a smaller one: not scaled down
		{[]hedgeSample{{100 * ms, 0}}, 4 << 20, 400 * ms},                           // size unknown
	} {
		if got := hedgeAfter(tc.others, tc.bytes); got != tc.want {
			t.Errorf("hedgeAfter(%v, %d) = %v, want %v", tc.others, tc.bytes, got, tc.want)
		}
	}
}

// TestHedgedRead: a fresh client (no latency known yet) reads chunks on
// every chain in one call while one replica's link holds every answer for
// long: the batches to the other replicas answer, and the one to the slow
// replica is abandoned once it has taken hedgeFactor times theirs; its
// chunks are read from another replica, and the call returns with the
// right bytes before the slow replica's answer arrives. Before, the call waited for the slow
// answer (preferFast needs a sample of the slow node first).
func TestHedgedRead(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl := c.dial(t, Options{RetryTimeout: 30 * time.Second, RefreshInterval: time.Hour})
	const n = 24
	var want [][]byte
	for i := 0; i < n; i++ {
		data := bytes.Repeat([]byte{byte(i + 1)}, 128<<10)
		if err := cl.WriteChunk(ctx, cl.Chains()[i%2], ChunkID{Inode: 6, Index: uint64(i)}, 0, data); err != nil {
			t.Fatal(err)
		}
		want = append(want, data)
	}
	r := *cl.Routing()
	r.Version += 1000
	r.Nodes = append([]proto.Node(nil), r.Nodes...)
	var slow atomic.Bool
	var delivered atomic.Int64
	for i := range r.Nodes {
		if r.Nodes[i].ID == 2 {
			r.Nodes[i].Addr = slowProxyCounting(t, r.Nodes[i].Addr, 6*time.Second, &slow, &delivered)
		}
	}
	cl = c.dial(t, Options{RetryTimeout: 30 * time.Second, RequestTimeout: 20 * time.Second, RefreshInterval: time.Hour, NoLocalReads: true})
	cl.setRouting(&r)
	for _, nd := range r.Nodes {
		if _, err := cl.connect(ctx, nd.Addr, cl.node(nd.ID), false); err != nil {
			t.Fatal(err)
		}
	}
	slow.Store(true)
	rd := make([]ChunkRead, n)
	prefer2 := 0
	for i := range rd {
		id := ChunkID{Inode: 6, Index: uint64(i)}
		ch := r.Chain(cl.Chains()[i%2])
		if ch.Targets[chunkHash(id)%uint64(len(ch.Targets))].Node == 2 {
			prefer2++
		}
		rd[i] = ChunkRead{Chain: ch.ID, Chunk: id, Buf: make([]byte, 128<<10)}
	}
	if prefer2 == 0 {
		t.Skip("no chunk prefers node 2")
	}
	if err := cl.ReadChunks(ctx, rd); err != nil {
		t.Fatal(err)
	}
	if d := delivered.Load(); d != 0 {
		t.Fatalf("the read waited for the slow replica's answer (%d pieces delivered after being held)", d)
	}
	for i := range rd {
		if !bytes.Equal(rd[i].Buf, want[i]) {
			t.Fatalf("chunk %d: other bytes", i)
		}
	}
	// What the abandoned read took counts as node 2's latency (a lower
	// bound): later reads prefer the others, and mgmtd hears of it.
	if l := cl.node(2).recentLatency(time.Now().UnixNano()); l < hedgeFloor {
		t.Fatalf("node 2's latency after the hedge: %v", l)
	}
	slow.Store(false)
}
