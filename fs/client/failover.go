package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/transport"
)

// Per-client failover: what this client does when a replica that mgmtd
// calls serving cannot be reached from here, or is slow (issue 16). mgmtd
// sees every storage service from its own side only; a one-way partition
// between this client and a node, a congested link or a throttled host
// changes nothing in the routing, so the client routes around them itself.
//
//   - Backoff: a node that failed at the transport level (no connection,
//     a timeout, a reset) is skipped by reads for backoffBase, doubling
//     with every failure in a row up to backoffMax; one success clears it.
//   - Connect hedge: a read that needs a new connection gives the dial
//     dialHedge; if it has not completed by then the read goes to another
//     replica at once while the dial finishes in the background (its
//     connection lands in the pool for later reads, or its failure backs
//     the node off). Without it every read batch to an unreachable replica
//     paid the full dial timeout (3 s) before failing over.
//   - Slow replicas: each node's recent request latency (an EWMA of batch
//     reads) is kept; a chunk's preferred replica is passed over when it
//     is clearly slower than another (preferFast).
//   - Hedged reads: a batch read that has taken hedgeFactor times what the
//     fastest other replica of its chunks recently took (scaled to the
//     batch's size, at least hedgeFloor) is abandoned and its chunks are
//     read from another replica at once (hedgeAfter). Each chunk range is
//     hedged at most once per ReadChunks, so a cluster that is slow all
//     over still finishes its reads.
//   - Reports: the recent latencies (and hedges) are sent to mgmtd with
//     the next routing request (every RefreshInterval, and at Close), so
//     mgmtd can take a persistently slow node out of its chains
//     (fs/mgmtd/slow.go); only what changed since the last report is sent.
//     Writes report too: each one's round trip to its chain head, split
//     into the network's part and the head's own work (proto.HopLatency),
//     so a node slow to forward is found when nobody reads.
//   - Writes can only enter at a chain's head: a head this client cannot
//     reach is retried (with a routing refresh each time) until mgmtd
//     changes the chain or the retry window ends; the error then names the
//     chain, the target, its node and address.
//   - The retry window: Options.RetryTimeout, default FFKIT_RETRY_WINDOW
//     (60 s); when it runs out the error is fs.ErrUnavailable (exit 3).
const (
	backoffBase = 500 * time.Millisecond
	backoffMax  = 30 * time.Second
	dialHedge   = 300 * time.Millisecond
	// A latency sample older than latencyTTL is not trusted (a slow node
	// that got no reads since is given another chance).
	latencyTTL = 5 * time.Second
	// slowFactor, slowFloor: preferFast's thresholds.
	slowFactor = 4
	slowFloor  = 20 * time.Millisecond
	// hedgeFactor, hedgeFloor: hedgeAfter's.
	hedgeFactor = 4
	hedgeFloor  = 150 * time.Millisecond
	// reportTimeout bounds Close's last latency report to mgmtd.
	reportTimeout = 500 * time.Millisecond
)

// RetryWindow is the default retry window: FFKIT_RETRY_WINDOW (a Go
// duration such as "90s", or a number of seconds), else 60 s. An
// unparsable or non-positive value is ignored.
func RetryWindow() time.Duration {
	s := strings.TrimSpace(os.Getenv("FFKIT_RETRY_WINDOW"))
	if s == "" {
		return 60 * time.Second
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return d
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f > 0 {
		return time.Duration(f * float64(time.Second))
	}
	return 60 * time.Second
}

// backoff is how long a node is skipped after fails transport failures in
// a row.
func backoff(fails int32) time.Duration {
	if fails <= 0 {
		return 0
	}
	d := backoffBase
	for i := int32(1); i < fails && d < backoffMax; i++ {
		d *= 2
	}
	return min(d, backoffMax)
}

// failed records a transport-level failure of the node: reads skip it for
// the next backoff interval, and its connection is dialled afresh (with
// the connect hedge) next time.
func (n *nodeLoad) failed() {
	f := n.fails.Add(1)
	n.suspectUntil.Store(time.Now().Add(backoff(f)).UnixNano())
	n.connected.Store(false)
}

// succeeded records an answered request that took d (0: not timed).
func (n *nodeLoad) succeeded(d time.Duration) {
	if n.fails.Load() != 0 {
		n.fails.Store(0)
		n.suspectUntil.Store(0)
	}
	n.sample(d)
}

// sample feeds d (0: none) into the node's latency average.
func (n *nodeLoad) sample(d time.Duration) {
	if d <= 0 {
		return
	}
	now := time.Now().UnixNano()
	old := n.latency.Load()
	if old == 0 || now-n.latencyAt.Load() > int64(latencyTTL) {
		n.latency.Store(int64(d))
	} else {
		n.latency.Store(old + (int64(d)-old)/4) // EWMA, weight 1/4
	}
	n.latencyAt.Store(now)
}

// recentLatency is the node's latency EWMA, 0 if unknown or stale.
func (n *nodeLoad) recentLatency(now int64) time.Duration {
	if now-n.latencyAt.Load() > int64(latencyTTL) {
		return 0
	}
	return time.Duration(n.latency.Load())
}

// sampleBytes feeds a batch's size into the node's average batch size
// (what its latency average is scaled by in hedgeAfter).
func (n *nodeLoad) sampleBytes(b int64) {
	if old := n.batchBytes.Load(); old == 0 {
		n.batchBytes.Store(b)
	} else {
		n.batchBytes.Store(old + (b-old)/4)
	}
}

// hedgeSample is a latency observation of another replica: its recent
// latency and average batch size.
type hedgeSample struct {
	lat   time.Duration
	bytes int64
}

// hedgeAfter returns how long a batch read of size bytes may take before
// it is abandoned for another replica, given the other candidate
// replicas' recent samples: hedgeFactor times the fastest of them, scaled
// up by how much larger this batch is than that replica's usual one, and
// at least hedgeFloor; 0 (never) when no other replica has a recent
// sample, since then nothing says this one is slow. Pure.
func hedgeAfter(others []hedgeSample, bytes int64) time.Duration {
	best := time.Duration(0)
	for _, o := range others {
		if o.lat <= 0 {
			continue
		}
		d := o.lat
		if o.bytes > 0 && bytes > o.bytes {
			d = time.Duration(float64(d) * float64(bytes) / float64(o.bytes))
		}
		if best == 0 || d < best {
			best = d
		}
	}
	if best == 0 {
		return 0
	}
	return max(hedgeFloor, hedgeFactor*best)
}

// latencyReport collects, for mgmtd, every node's latency average sampled
// since the last report and the reads hedged away from it since then,
// and the writes' hops; nil when there is nothing new.
func (c *Client) latencyReport() *proto.RoutingReq {
	now := time.Now().UnixNano()
	var rep []proto.NodeLatency
	c.nodes.Range(func(k, v any) bool {
		n := v.(*nodeLoad)
		l := proto.NodeLatency{Node: k.(proto.NodeID), Hedged: int(n.hedged.Swap(0))}
		if at := n.latencyAt.Load(); at > n.reportedAt.Load() && now-at <= int64(latencyTTL) {
			n.reportedAt.Store(at)
			l.Latency = n.latency.Load()
		}
		if l.Latency > 0 || l.Hedged > 0 {
			rep = append(rep, l)
		}
		return true
	})
	hops := c.hops.Report()
	if len(rep) == 0 {
		if hops == nil {
			return nil
		}
		return &proto.RoutingReq{Client: c.clientID, Hops: hops}
	}
	// A node that answered nothing new still serves as the others' scale.
	c.nodes.Range(func(k, v any) bool {
		n := v.(*nodeLoad)
		id := k.(proto.NodeID)
		if slices.IndexFunc(rep, func(l proto.NodeLatency) bool { return l.Node == id }) < 0 {
			if l := n.recentLatency(now); l > 0 {
				rep = append(rep, proto.NodeLatency{Node: id, Latency: int64(l)})
			}
		}
		return true
	})
	slices.SortFunc(rep, func(a, b proto.NodeLatency) int { return int(a.Node) - int(b.Node) })
	return &proto.RoutingReq{Client: c.clientID, Latency: rep, Hops: hops}
}

// avoid reports whether reads should pass this node over when another
// replica is available: it is backing off, or a connection to it is
// still being dialled.
func (n *nodeLoad) avoid() bool { return n.suspect() || n.dialing.Load() }

// preferFast returns which of the candidates a read goes to, given the
// preferred one (pick) and each candidate's recent latency (0: unknown).
// The preferred replica keeps the read (its page cache is warm) unless it
// is more than slowFactor times slower than the fastest known one and
// slower than slowFloor, then the fastest takes it. A pure function, so
// the rule is tested by tables.
func preferFast(lat []time.Duration, pick int) int {
	best := -1
	for i, l := range lat {
		if l > 0 && (best < 0 || l < lat[best]) {
			best = i
		}
	}
	if best < 0 || lat[pick] <= slowFloor || lat[pick] <= slowFactor*lat[best] {
		return pick
	}
	return best
}

// errSlowConnect: a read's dial did not complete within dialHedge.
var errSlowConnect = transport.ErrTimeout

// connect returns a connection to addr for a request to node n. With
// hedge (reads, which have other replicas to go to), a new connection
// gets dialHedge to complete; if it has not, connect fails with a
// retryable timeout at once and the dial carries on in the background
// (owned by the client, stopped by Close): the read goes to another
// replica meanwhile, and later ones use the connection if it comes up.
// A failed dial backs the node off.
func (c *Client) connect(ctx context.Context, addr string, n *nodeLoad, hedge bool) (*transport.Conn, error) {
	if !hedge || n.connected.Load() {
		conn, err := c.pool.Get(ctx, addr)
		if err == nil {
			n.connected.Store(true)
		} else if !errors.Is(err, context.Canceled) {
			n.failed()
		}
		return conn, err
	}
	if !n.dialing.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("%w: %s: a connection is still being dialled (reading another replica)", errSlowConnect, addr)
	}
	type result struct {
		conn *transport.Conn
		err  error
	}
	done := make(chan result, 1)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		conn, err := c.pool.Get(c.bgctx, addr)
		if err == nil {
			n.connected.Store(true)
			n.succeeded(0)
		} else if !errors.Is(err, context.Canceled) {
			n.failed()
		}
		n.dialing.Store(false)
		done <- result{conn, err}
	}()
	t := time.NewTimer(dialHedge)
	defer t.Stop()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-t.C:
		return nil, fmt.Errorf("%w: %s: connect not completed within %v (reading another replica)", errSlowConnect, addr, dialHedge)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
