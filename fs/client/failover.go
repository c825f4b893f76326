package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

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
