package client

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/internal/errkind"
)

func (o *Options) defaults() {
	if o.Name == "" {
		o.Name = "client"
	}
	if o.RetryTimeout <= 0 {
		o.RetryTimeout = RetryWindow()
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 10 * time.Second
	}
	if o.MaxInFlightPerNode <= 0 {
		o.MaxInFlightPerNode = 8
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = 4 << 20
	}
	if o.MaxBatchIOs <= 0 {
		o.MaxBatchIOs = 128
	}
	if o.MergeGap <= 0 {
		o.MergeGap = 64 << 10
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = time.Second
	}
}

// Client is a connection to an ffkit cluster (see the package comment).
type Client struct {
	opts     Options
	mgmtd    []string
	pool     *transport.Pool
	routing  atomic.Pointer[proto.Routing]
	clientID uint64
	seq      atomic.Uint64

	nodes sync.Map // proto.NodeID -> *nodeLoad, read on every span of every read
	// hops: writes' round trips to chain heads since the last report to
	// mgmtd (failover.go).
	hops proto.HopMeter

	refreshMu sync.Mutex // one routing fetch at a time
	// mgmtdNext is the index in mgmtd of the address that answered last:
	// routing requests start there, so a frozen primary (whose port still
	// accepts connections) costs one timeout, not one per request.
	mgmtdNext atomic.Int32
	// bgctx is cancelled by Close; the background refresh and dials
	// (connect) run under it and are counted in wg.
	bgctx  context.Context
	cancel context.CancelFunc
	// kick asks the background refresh to run now (a read was hedged:
	// mgmtd should hear of it before this process may exit).
	kick chan struct{}
	wg   sync.WaitGroup
}

type nodeLoad struct {
	sem      chan struct{} // bounds requests in flight to the node
	inflight atomic.Int64  // bytes being read from the node (load balance)
	// suspectUntil (unix nanos): the node just failed at the transport
	// level (dead, unreachable from here); reads avoid it until then, so
	// that every batch does not pay a timeout before mgmtd reacts (or
	// forever, when only this client cannot reach it). fails counts such
	// failures in a row: the interval grows with it (failover.go).
	suspectUntil atomic.Int64
	fails        atomic.Int32
	// connected: a connection to the node was made and has not failed
	// since; otherwise reads dial with the connect hedge. dialing: such
	// a dial is in progress.
	connected atomic.Bool
	dialing   atomic.Bool
	// latency (ns): EWMA of batch read round trips, sampled at latencyAt
	// (unix nanos); reads prefer replicas that are not clearly slower.
	latency   atomic.Int64
	latencyAt atomic.Int64
	// reportedAt: the latencyAt last reported to mgmtd; hedged: reads
	// abandoned here for another replica since the last report;
	// batchBytes: EWMA of the batch reads' sizes (failover.go).
	reportedAt atomic.Int64
	hedged     atomic.Int32
	batchBytes atomic.Int64
	reads      atomic.Int64 // batched read requests sent to the node
	// noLocal: this node's chunk files are not readable here (permission
	// denied, or maxLocalFails local reads in a row failed): no more
	// local reads from it.
	noLocal    atomic.Bool
	localFails atomic.Int32 // local reads failed in a row
	// here: the node answered a local read, so it runs on this host;
	// reads that can be local prefer such nodes.
	here atomic.Bool
}

// Local reads: at most localParallel at once per batch; maxLocalFails
// failures in a row turn them off for a node.
const (
	localParallel = 4
	maxLocalFails = 8
)

func (n *nodeLoad) suspect() bool { return time.Now().UnixNano() < n.suspectUntil.Load() }

// Dial connects to the cluster's mgmtd (any of addrs) and loads the
// routing.
func Dial(ctx context.Context, addrs []string, opts Options) (*Client, error) {
	opts.defaults()
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no mgmtd address", ErrBadRequest)
	}
	if opts.Token == "" {
		return nil, fmt.Errorf("%w: no cluster token (use --token-file or FFKIT_TOKEN)", ErrBadRequest)
	}
	c := &Client{opts: opts, mgmtd: addrs,
		pool:     transport.NewPool(transport.Options{Token: opts.Token, Name: opts.Name, Faults: transport.FaultsFromEnv(), Trust: opts.Trust, TLSLoopback: opts.TLSLoopback}),
		clientID: rand.Uint64() | 1, kick: make(chan struct{}, 1)}
	c.bgctx, c.cancel = context.WithCancel(context.Background())
	if err := c.refresh(ctx); err != nil {
		c.cancel()
		c.pool.Close()
		return nil, err
	}
	bctx := c.bgctx
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(opts.RefreshInterval)
		defer t.Stop()
		for {
			select {
			case <-bctx.Done():
				return
			case <-t.C:
				c.refresh(bctx)
			case <-c.kick:
				c.refresh(bctx)
			}
		}
	}()
	return c, nil
}

// Close stops the background refresh, sends mgmtd the read latencies not
// reported yet (best effort, reportTimeout) and closes the connections.
func (c *Client) Close() error {
	c.cancel()
	c.wg.Wait()
	if rep := c.latencyReport(); rep != nil {
		ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
		var r proto.Routing
		c.askMgmtd(ctx, proto.MGetRouting, rep, func() any { r = proto.Routing{}; return &r })
		cancel()
	}
	c.pool.Close()
	return nil
}

// Routing returns the current routing snapshot (do not modify).
func (c *Client) Routing() *Routing { return c.routing.Load() }

// Chains returns the chain table's chain ids in table order.
func (c *Client) Chains() []ChainID {
	r := c.routing.Load()
	ids := make([]ChainID, len(r.Chains))
	for i, ch := range r.Chains {
		ids[i] = ch.ID
	}
	return ids
}

// ChunkSize is the cluster's default chunk size.
func (c *Client) ChunkSize() int64 {
	if cs := c.routing.Load().ChunkSize; cs > 0 {
		return cs
	}
	return proto.DefaultChunkSize
}

// Refresh fetches the routing from mgmtd now.
func (c *Client) Refresh(ctx context.Context) error { return c.refresh(ctx) }

func (c *Client) refresh(ctx context.Context) error {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	var r proto.Routing
	var req any = struct{}{}
	if rep := c.latencyReport(); rep != nil {
		req = rep
	}
	if err := c.askMgmtd(ctx, proto.MGetRouting, req, func() any { r = proto.Routing{}; return &r }); err != nil {
		return err
	}
	c.setRouting(&r)
	return nil
}

// mgmtdHedge: a mgmtd address that has not answered within this is joined
// by the next one. A frozen primary's port still accepts connections, so
// without it every routing fetch would wait out the request timeout there
// before asking the standby.
const mgmtdHedge = 300 * time.Millisecond

// askMgmtd calls method (with request req) on mgmtd and decodes the first
// answer into the value out returns (out is called once per attempt, from
// the caller's goroutine only). It asks the address that answered last
// first; every mgmtdHedge without an answer (or at once after an error)
// it asks the next one too; the first answer wins and the others are
// cancelled and waited for.
func (c *Client) askMgmtd(ctx context.Context, method uint16, req any, out func() any) error {
	type result struct {
		addr string
		resp []byte
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := int(c.mgmtdNext.Load())
	// One attempt gets at most half the cluster's fail timeout: a mgmtd
	// that does not answer in that time is down for the storage services
	// too (they stop serving after it), so the standby is the one to ask.
	timeout := min(c.opts.RequestTimeout, 3*time.Second)
	if r := c.routing.Load(); r != nil && r.FailTimeout > 0 {
		timeout = min(timeout, max(time.Duration(r.FailTimeout)/2, 500*time.Millisecond))
	}
	results := make(chan result, len(c.mgmtd))
	started, pending := 0, 0
	start := func() {
		i := (first + started) % len(c.mgmtd)
		addr := c.mgmtd[i]
		started++
		pending++
		go func() {
			actx, acancel := context.WithTimeout(ctx, timeout)
			defer acancel()
			var raw json.RawMessage
			conn, err := c.pool.Get(actx, addr)
			if err == nil {
				_, err = conn.Call(actx, method, req, nil, &raw)
				if errors.Is(err, context.DeadlineExceeded) {
					c.pool.Drop(addr)
				}
			}
			results <- result{addr, raw, err}
		}()
	}
	var errs []error
	won := false
	start()
	hedge := time.NewTimer(mgmtdHedge)
	defer hedge.Stop()
	for pending > 0 {
		select {
		case <-hedge.C:
			if started < len(c.mgmtd) && !won {
				start()
				hedge.Reset(mgmtdHedge)
			}
			continue
		case res := <-results:
			pending--
			if won {
				continue
			}
			err := res.err
			if err == nil {
				if err = json.Unmarshal(res.resp, out()); err == nil {
					won = true
					c.mgmtdNext.Store(int32(slices.Index(c.mgmtd, res.addr)))
					cancel()
					continue
				}
			}
			errs = append(errs, fmt.Errorf("%s: %w", res.addr, err))
			if started < len(c.mgmtd) {
				start()
				hedge.Reset(mgmtdHedge)
			}
		}
	}
	if won {
		return nil
	}
	return fmt.Errorf("%w: mgmtd unreachable: %w", fs.ErrUnavailable, errors.Join(errs...))
}

// Status asks mgmtd (any of its addresses) for the routing and the latest
// space report of every storage target (capacity, free, bytes used by
// chunks), as the storage services sent them in their heartbeats.
func (c *Client) Status(ctx context.Context) (*proto.StatusResp, error) {
	var st proto.StatusResp
	if err := c.askMgmtd(ctx, proto.MStatus, struct{}{}, func() any { st = proto.StatusResp{}; return &st }); err != nil {
		return nil, err
	}
	if st.Routing != nil {
		c.setRouting(st.Routing)
	}
	return &st, nil
}

func (c *Client) setRouting(r *proto.Routing) {
	for {
		old := c.routing.Load()
		// The metadata servers' list is not versioned (a restarted
		// server registers on a new port without a routing change):
		// take it from an answer of the same version too.
		if old != nil && (r.Version < old.Version || r.Version == old.Version && slices.Equal(r.Meta, old.Meta)) {
			return
		}
		if c.routing.CompareAndSwap(old, r) {
			return
		}
	}
}

func (c *Client) node(id proto.NodeID) *nodeLoad {
	if n, ok := c.nodes.Load(id); ok {
		return n.(*nodeLoad)
	}
	n, _ := c.nodes.LoadOrStore(id, &nodeLoad{sem: make(chan struct{}, c.opts.MaxInFlightPerNode)})
	return n.(*nodeLoad)
}

// retryable tells whether another attempt (after a refresh, elsewhere)
// may succeed.
func retryable(err error) bool {
	if errors.Is(err, proto.ErrNoSpace) || errors.Is(err, proto.ErrBadRequest) || errors.Is(err, proto.ErrChecksum) {
		return false
	}
	return proto.Retryable(err) || errors.Is(err, transport.ErrClosed) || errors.Is(err, transport.ErrPartitioned) ||
		errors.Is(err, transport.ErrRefused) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fs.ErrUnavailable) ||
		errors.Is(err, proto.ErrNoChain) || errkind.Of(err) == errkind.Unavailable
}

// retry runs attempt until it succeeds, fails permanently, or the retry
// budget runs out.
func (c *Client) retry(ctx context.Context, what string, attempt func(ctx context.Context, r *proto.Routing) error) error {
	deadline := time.Now().Add(c.opts.RetryTimeout)
	backoff := 10 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
		err := attempt(actx, c.routing.Load())
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		if !retryable(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s: gave up after %v: %w", fs.ErrUnavailable, what, c.opts.RetryTimeout, err)
		}
		wait := backoff
		if errors.Is(err, proto.ErrNotCommitted) {
			wait = min(wait, 5*time.Millisecond)
		} else {
			backoff = min(backoff*2, 500*time.Millisecond)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		if !errors.Is(err, proto.ErrNotCommitted) {
			c.refresh(ctx)
		}
	}
}

// call sends one request to a storage node.
func (c *Client) call(ctx context.Context, r *proto.Routing, node proto.NodeID, method uint16, req any, data [][]byte, resp any) ([]byte, error) {
	out, _, err := c.callRelease(ctx, r, node, method, req, data, resp)
	return out, err
}

// callInto sends one request to a storage node, its reply's data going
// to sink (nil: a reply without data). For reads, which have other
// replicas to go to: a new connection gets the connect hedge.
func (c *Client) callInto(ctx context.Context, r *proto.Routing, node proto.NodeID, method uint16, req any, resp any, sink transport.Sink) error {
	addr := r.NodeAddr(node)
	if addr == "" {
		return fmt.Errorf("%w: node %d has no address", proto.ErrTargetOffline, node)
	}
	nl := c.node(node)
	conn, err := c.connect(ctx, addr, nl, true)
	if err != nil {
		return err
	}
	start := time.Now()
	err = conn.CallInto(ctx, method, req, nil, resp, sink)
	c.observe(nl, addr, start, err)
	return err
}

func (c *Client) callRelease(ctx context.Context, r *proto.Routing, node proto.NodeID, method uint16, req any, data [][]byte, resp any) ([]byte, func(), error) {
	addr := r.NodeAddr(node)
	if addr == "" {
		return nil, nil, fmt.Errorf("%w: node %d has no address", proto.ErrTargetOffline, node)
	}
	nl := c.node(node)
	conn, err := c.connect(ctx, addr, nl, false)
	if err != nil {
		return nil, nil, err
	}
	out, release, err := conn.CallRelease(ctx, method, req, data, resp)
	c.observe(nl, addr, time.Time{}, err)
	return out, release, err
}

// observe records how a request to node nl (at addr) ended: an answer
// (an error reply included) clears its backoff and, if start is set,
// feeds its latency; a transport failure backs it off, and a timeout
// also drops the connection (maybe partitioned or stuck: dial afresh).
func (c *Client) observe(nl *nodeLoad, addr string, start time.Time, err error) {
	var re *transport.RemoteError
	switch {
	case err == nil || errors.As(err, &re):
		var d time.Duration
		if !start.IsZero() {
			d = time.Since(start)
		}
		nl.succeeded(d)
	case errors.Is(err, context.Canceled):
	default:
		nl.failed()
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, transport.ErrTimeout) {
			c.pool.Drop(addr)
		}
	}
}

func (c *Client) chain(r *proto.Routing, id ChainID) (*proto.Chain, error) {
	ch := r.Chain(id)
	if ch == nil {
		return nil, fmt.Errorf("%w: chain %d not in routing v%d", proto.ErrNoChain, id, r.Version)
	}
	return ch, nil
}

// chainTarget looks up chain and one of its targets in r (the replica
// tools address a target directly).
func (c *Client) chainTarget(r *proto.Routing, chain ChainID, target proto.TargetID) (*proto.Chain, proto.ChainTarget, error) {
	ch, err := c.chain(r, chain)
	if err != nil {
		return nil, proto.ChainTarget{}, err
	}
	t, ok := ch.Target(target)
	if !ok {
		return nil, proto.ChainTarget{}, fmt.Errorf("%w: target %d is not in chain %d", ErrBadRequest, target, chain)
	}
	return ch, t, nil
}

func (c *Client) update(ctx context.Context, what string, req proto.WriteReq, data []byte) error {
	req.Tag = proto.Tag{Client: c.clientID, Seq: c.seq.Add(1)}
	return c.retry(ctx, what, func(ctx context.Context, r *proto.Routing) error {
		ch, err := c.chain(r, req.Chain)
		if err != nil {
			return err
		}
		head, ok := ch.Head()
		if !ok {
			return fmt.Errorf("%w: chain %d has no serving head (%s)", proto.ErrTargetOffline, ch.ID, ch.String())
		}
		req.ChainVer = ch.Version
		var resp proto.WriteResp
		sent := time.Now()
		_, err = c.call(ctx, r, head.Node, proto.MWrite, req, [][]byte{data}, &resp)
		if err == nil {
			c.hops.Sample(0, head.Node, time.Since(sent), &resp) // for mgmtd (failover.go)
		}
		return headErr(r, ch, head, err)
	})
}

// headErr names the chain head a write could not reach: writes enter at
// the head only, so a head this client cannot reach (while mgmtd, which
// reaches it, keeps it there) stops writes to its chain from here until
// the routing changes or the retry window ends.
func headErr(r *proto.Routing, ch *proto.Chain, head proto.ChainTarget, err error) error {
	var re *transport.RemoteError
	if err == nil || errors.As(err, &re) || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("chain %d's head, target %d on node %d (%s), is unreachable from this client (writes enter at the head; waiting for it or for a routing change): %w",
		ch.ID, head.ID, head.Node, r.NodeAddr(head.Node), err)
}

// WriteChunk writes data at off in one chunk; see the package comment.
func (c *Client) WriteChunk(ctx context.Context, chain ChainID, chunk ChunkID, off int64, data []byte) error {
	if off < 0 || off > MaxChunkSize || int64(len(data)) > MaxChunkSize-off {
		return fmt.Errorf("%w: write [%d, +%d) of chunk %v is outside %d bytes", ErrBadRequest, off, len(data), chunk, MaxChunkSize)
	}
	req := proto.WriteReq{Chain: chain, Chunk: chunk, Op: proto.OpWrite, Off: off, CRC: proto.PayloadChecksum(proto.PayloadCRCs(data))}
	return c.update(ctx, fmt.Sprintf("write chunk %v on chain %d", chunk, chain), req, data)
}

// TruncateChunk sets a chunk's length.
func (c *Client) TruncateChunk(ctx context.Context, chain ChainID, chunk ChunkID, length int64) error {
	if length < 0 || length > MaxChunkSize {
		return fmt.Errorf("%w: truncate chunk %v to %d", ErrBadRequest, chunk, length)
	}
	req := proto.WriteReq{Chain: chain, Chunk: chunk, Op: proto.OpTruncate, Off: length}
	return c.update(ctx, fmt.Sprintf("truncate chunk %v on chain %d", chunk, chain), req, nil)
}

// RemoveChunks removes the chunks of inode with Index >= fromIndex on chain.
func (c *Client) RemoveChunks(ctx context.Context, chain ChainID, inode, fromIndex uint64) error {
	req := proto.RemoveReq{Tag: proto.Tag{Client: c.clientID, Seq: c.seq.Add(1)}, Chain: chain, Inode: inode, FromIndex: fromIndex}
	return c.retry(ctx, fmt.Sprintf("remove chunks of inode %d on chain %d", inode, chain), func(ctx context.Context, r *proto.Routing) error {
		ch, err := c.chain(r, chain)
		if err != nil {
			return err
		}
		head, ok := ch.Head()
		if !ok {
			return fmt.Errorf("%w: chain %d has no serving head", proto.ErrTargetOffline, ch.ID)
		}
		req.ChainVer = ch.Version
		_, err = c.call(ctx, r, head.Node, proto.MRemove, req, nil, nil)
		return headErr(r, ch, head, err)
	})
}

// ListChunks lists the chunks of inode stored on chain, by index.
func (c *Client) ListChunks(ctx context.Context, chain ChainID, inode uint64) ([]ChunkInfo, error) {
	var out []ChunkInfo
	err := c.retry(ctx, fmt.Sprintf("list chunks of inode %d on chain %d", inode, chain), func(ctx context.Context, r *proto.Routing) error {
		ch, err := c.chain(r, chain)
		if err != nil {
			return err
		}
		rd := ch.Readable()
		if len(rd) == 0 {
			return fmt.Errorf("%w: chain %d has no serving target", proto.ErrTargetOffline, ch.ID)
		}
		// A random serving replica, one this client can reach if any.
		var okBuf [8]proto.ChainTarget
		ok := okBuf[:0]
		for _, t := range rd {
			if !c.node(t.Node).avoid() {
				ok = append(ok, t)
			}
		}
		if len(ok) == 0 {
			ok = rd
		}
		t := ok[rand.IntN(len(ok))]
		var resp proto.ListChunksResp
		if err := c.callInto(ctx, r, t.Node, proto.MListChunks, proto.ListChunksReq{Chain: chain, ChainVer: ch.Version, Target: t.ID, Inode: inode}, &resp, nil); err != nil {
			return err
		}
		out = out[:0]
		for _, m := range resp.Chunks {
			out = append(out, ChunkInfo{Index: m.Chunk.Index, Length: m.Length})
		}
		return nil
	})
	return out, err
}

// span is a merged range of one chunk covering several reads.
type span struct {
	chain    ChainID
	chunk    ChunkID
	off, end int64
	members  []int
	failed   map[proto.TargetID]bool // replicas that failed this span (nil: none)
	badSum   map[proto.TargetID]bool // replicas that failed it by checksum
	done     bool
	// verifyAt: the bytes target verifyAt sent failed the client's check;
	// the span is read again from it, verified there, so that the target
	// finds (and repairs) a corrupt chunk, or the bytes were bad in flight.
	verifyAt proto.TargetID
	// noLocal: a local read of the span failed (its file was replaced by
	// a newer version since the reply, or is not readable here): the span
	// is read over the connection.
	noLocal     bool
	localFailed bool // the local read failed in the last attempt
	direct      bool // some member asked for O_DIRECT (ChunkRead.Direct)
	// hedged: a read of the span was abandoned for another replica in
	// this ReadChunks (it is not hedged twice); justHedged: in the last
	// attempt.
	hedged, justHedged bool
}

// affinitySlack is how many more bytes in flight a chunk's preferred
// replica may have than another before the other takes the read.
const affinitySlack = 8 << 20

// chunkHash picks a chunk's preferred replica (the one whose storage
// service also keeps the chunk in its page cache when written).
func chunkHash(id ChunkID) uint64 { return proto.ChunkHash(id) }

// fail records that target t failed the span.
func (sp *span) fail(t proto.TargetID) {
	if sp.failed == nil {
		sp.failed = map[proto.TargetID]bool{}
	}
	sp.failed[t] = true
}

// ReadChunks performs a batch of reads; see the package comment.
func (c *Client) ReadChunks(ctx context.Context, reads []ChunkRead) error {
	c.countReadCall()
	order := make([]int, 0, len(reads))
	for i := range reads {
		rd := &reads[i]
		rd.N = 0
		if rd.Off < 0 || rd.Off > MaxChunkSize || int64(len(rd.Buf)) > MaxChunkSize-rd.Off {
			return fmt.Errorf("%w: read [%d, +%d) of chunk %v", ErrBadRequest, rd.Off, len(rd.Buf), rd.Chunk)
		}
		if len(rd.Buf) > 0 {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		x, y := &reads[a], &reads[b]
		if x.Chain != y.Chain {
			return int(x.Chain) - int(y.Chain)
		}
		if x.Chunk != y.Chunk {
			if x.Chunk.Inode != y.Chunk.Inode {
				return cmpU(x.Chunk.Inode, y.Chunk.Inode)
			}
			return cmpU(x.Chunk.Index, y.Chunk.Index)
		}
		return cmpI(x.Off, y.Off)
	})
	// One allocation for all spans; a span's members are a run of order.
	all := make([]span, 0, len(order))
	for k, i := range order {
		rd := &reads[i]
		end := rd.Off + int64(len(rd.Buf))
		if n := len(all); n > 0 {
			sp := &all[n-1]
			if sp.chain == rd.Chain && sp.chunk == rd.Chunk && rd.Off <= sp.end+c.opts.MergeGap {
				sp.end = max(sp.end, end)
				sp.members = order[k-len(sp.members) : k+1]
				sp.direct = sp.direct || rd.Direct
				continue
			}
		}
		all = append(all, span{chain: rd.Chain, chunk: rd.Chunk, off: rd.Off, end: end, members: order[k : k+1], direct: rd.Direct})
	}
	spans := make([]*span, len(all))
	for i := range all {
		spans[i] = &all[i]
	}
	return c.retry(ctx, fmt.Sprintf("read %d ranges", len(reads)), func(ctx context.Context, r *proto.Routing) error {
		err := c.readAttempt(ctx, r, reads, spans)
		for err != nil && justHedged(spans) {
			// Reads abandoned on a slow replica go to another at once,
			// without the backoff and routing refresh of a failed
			// attempt (each span is hedged once, so this ends).
			err = c.readAttempt(ctx, r, reads, spans)
		}
		if err != nil && localFailed(spans) {
			// A local read failed (its file was just replaced, most
			// likely): read those spans over the connection now, without
			// the backoff and routing refresh of a failed attempt.
			err = c.readAttempt(ctx, r, reads, spans)
		}
		return err
	})
}

// takeMark reports whether a span not read yet has the mark that flag
// selects (set in the last attempt), and clears the mark on every span.
func takeMark(spans []*span, flag func(*span) *bool) bool {
	marked := false
	for _, sp := range spans {
		f := flag(sp)
		marked = marked || *f && !sp.done
		*f = false
	}
	return marked
}

// localFailed: a span not read yet failed its local read in the last
// attempt (the marks are cleared).
func localFailed(spans []*span) bool {
	return takeMark(spans, func(sp *span) *bool { return &sp.localFailed })
}

// justHedged: a span not read yet was hedged in the last attempt (the
// marks are cleared).
func justHedged(spans []*span) bool {
	return takeMark(spans, func(sp *span) *bool { return &sp.justHedged })
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpI(a, b int64) int { return cmpU(uint64(a-b+1<<62), 1<<62) }

type batch struct {
	node  proto.NodeID
	spans []*span
	ios   []proto.ReadIO
	bytes int64
	// hedge: every span has another replica to go to (alts) and was not
	// hedged yet: the batch may be abandoned for them when it is slow
	// (failover.go). A local read's file is read after the reply, which
	// the hedge no longer cancels.
	hedge bool
	alts  map[proto.NodeID]bool
}

// readAttempt reads every span not done yet, once; it returns nil when all
// are done, or the error that kept some from finishing.
func (c *Client) readAttempt(ctx context.Context, r *proto.Routing, reads []ChunkRead, spans []*span) error {
	batches := map[proto.NodeID][]*batch{}
	var firstErr error
	now := time.Now().UnixNano()
	for _, sp := range spans {
		if sp.done {
			continue
		}
		ch, err := c.chain(r, sp.chain)
		if err != nil {
			return err
		}
		cands := ch.Readable()
		if len(cands) == 0 {
			firstErr = fmt.Errorf("%w: chain %d has no serving target (%s)", proto.ErrTargetOffline, ch.ID, ch.String())
			continue
		}
		allBad := true
		for _, t := range cands {
			allBad = allBad && sp.badSum[t.ID]
		}
		if allBad {
			return fmt.Errorf("%w: chunk %v fails its checksum on every replica of chain %d", proto.ErrChecksum, sp.chunk, sp.chain)
		}
		var okBuf [8]proto.ChainTarget
		ok := okBuf[:0]
		for _, t := range cands {
			if !sp.failed[t.ID] && !c.node(t.Node).avoid() {
				ok = append(ok, t)
			}
		}
		if len(ok) == 0 {
			for _, t := range cands {
				if !sp.failed[t.ID] {
					ok = append(ok, t)
				}
			}
		}
		if len(ok) == 0 {
			clear(sp.failed) // every replica failed once: try them all again
			ok = cands
		}
		n := sp.end - sp.off
		// A read that can be a local one (proto.ReadIO.Local: large,
		// block-aligned, client-verified) goes to a replica on this host
		// if there is one.
		canLocal := !c.opts.NoLocalReads && !sp.noLocal && sp.verifyAt == 0 && proto.HostID() != "" &&
			n >= clientVerifyMin && sp.off%proto.BlockSize == 0
		if canLocal {
			var hereBuf [8]proto.ChainTarget
			here := hereBuf[:0]
			for _, t := range ok {
				if nl := c.node(t.Node); nl.here.Load() && !nl.noLocal.Load() {
					here = append(here, t)
				}
			}
			if len(here) > 0 {
				ok = here
			}
		}
		// Each chunk has a preferred replica (by hash), so that repeated
		// reads of it find it in that replica's page cache and the hosts
		// cache one copy of it, not three; a replica with clearly less
		// work queued (affinitySlack) takes the read instead.
		pick := int(chunkHash(sp.chunk) % uint64(len(ok)))
		best := ok[pick]
		bl := c.node(best.Node).inflight.Load() - affinitySlack
		for _, t := range ok {
			if l := c.node(t.Node).inflight.Load(); l < bl {
				best, bl = t, l
			}
		}
		// A clearly slow replica (a throttled host, a congested link)
		// gives its reads to a faster one.
		if len(ok) > 1 {
			var latBuf [8]time.Duration
			lat := latBuf[:0]
			for i, t := range ok {
				lat = append(lat, c.node(t.Node).recentLatency(now))
				if t == best {
					pick = i
				}
			}
			best = ok[preferFast(lat, pick)]
		}
		sums := true
		verify := sp.verifyAt != 0
		if sp.verifyAt != 0 {
			for _, t := range cands {
				if t.ID == sp.verifyAt {
					best = t
				}
			}
			sp.verifyAt, sums = 0, false
		}
		// Large block-aligned reads are verified here, on bytes just
		// received (see proto.ReadIO.Sums); the target does not read them.
		sums = sums && n >= clientVerifyMin && sp.off%proto.BlockSize == 0
		// And read from the chunk file itself when the target is on this
		// host (proto.ReadIO.Local).
		local := canLocal && !c.node(best.Node).noLocal.Load()
		c.node(best.Node).inflight.Add(n)
		bs := batches[best.Node]
		if len(bs) == 0 || len(bs[len(bs)-1].ios) >= c.opts.MaxBatchIOs || bs[len(bs)-1].bytes+n > c.opts.MaxBatchBytes && len(bs[len(bs)-1].ios) > 0 {
			n := min(len(spans), c.opts.MaxBatchIOs)
			bs = append(bs, &batch{node: best.Node, spans: make([]*span, 0, n), ios: make([]proto.ReadIO, 0, n), hedge: true, alts: map[proto.NodeID]bool{}})
			batches[best.Node] = bs
		}
		b := bs[len(bs)-1]
		alt := false
		for _, t := range ok {
			if t.Node != best.Node {
				b.alts[t.Node], alt = true, true
			}
		}
		b.hedge = b.hedge && alt && !sp.hedged && !verify
		b.spans = append(b.spans, sp)
		b.ios = append(b.ios, proto.ReadIO{Chain: sp.chain, ChainVer: ch.Version, Target: best.ID, Chunk: sp.chunk, Off: sp.off, Len: n, Sums: sums, Local: local})
		b.bytes += n
	}
	var mu sync.Mutex // guards firstErr
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for node, bs := range batches {
		nl := c.node(node)
		for _, b := range bs {
			g.Go(func() error {
				defer nl.inflight.Add(-b.bytes)
				select {
				case nl.sem <- struct{}{}:
				case <-gctx.Done():
					return gctx.Err()
				}
				err := c.hedgedBatch(gctx, r, reads, b)
				<-nl.sem
				if err != nil {
					mu.Lock()
					if firstErr == nil || !retryable(err) {
						firstErr = err
					}
					mu.Unlock()
					if !retryable(err) {
						return err
					}
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, sp := range spans {
		if !sp.done {
			if firstErr == nil {
				firstErr = fmt.Errorf("%w: chunk %v not read", proto.ErrTargetOffline, sp.chunk)
			}
			return firstErr
		}
	}
	return nil
}

// errHedged: a batch read was abandoned on a slow replica; its spans are
// read from another at once (ReadChunks).
var errHedged = fmt.Errorf("%w: read abandoned on a slow replica (hedged to another)", proto.ErrTargetOffline)

// hedgedBatch runs readBatch; when b may be hedged, a watcher abandons it
// once it has taken longer than hedgeAfter allows (recomputed as the
// other replicas' samples come in: batches to them run meanwhile), and its
// spans are marked for another replica.
func (c *Client) hedgedBatch(ctx context.Context, r *proto.Routing, reads []ChunkRead, b *batch) error {
	nl := c.node(b.node)
	if !b.hedge {
		err := c.readBatch(ctx, r, reads, b)
		if err == nil {
			nl.sampleBytes(b.bytes)
		}
		return err
	}
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var fired atomic.Bool
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // owned here: stopped and waited for below
		defer close(done)
		t := time.NewTimer(hedgePoll)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			var others []hedgeSample
			now := time.Now().UnixNano()
			for id := range b.alts {
				n := c.node(id)
				if !n.avoid() {
					others = append(others, hedgeSample{n.recentLatency(now), n.batchBytes.Load()})
				}
			}
			bound := hedgeAfter(others, b.bytes)
			if el := time.Since(start); bound > 0 && el >= bound {
				fired.Store(true)
				cancel()
				return
			} else if bound > 0 {
				t.Reset(min(bound-el, hedgePoll))
			} else {
				t.Reset(hedgePoll)
			}
		}
	}()
	err := c.readBatch(bctx, r, reads, b)
	close(stop)
	<-done
	if err == nil {
		nl.sampleBytes(b.bytes)
		return nil
	}
	if fired.Load() && ctx.Err() == nil {
		// What it took so far is a lower bound of its latency: reads
		// prefer the others from now on (preferFast), and mgmtd hears of
		// it (latencyReport).
		nl.sample(time.Since(start))
		nl.hedged.Add(1)
		select {
		case c.kick <- struct{}{}:
		default:
		}
		for _, sp := range b.spans {
			sp.hedged, sp.justHedged = true, true
		}
		return fmt.Errorf("%w: node %d after %v", errHedged, b.node, time.Since(start).Round(time.Millisecond))
	}
	return err
}

// hedgePoll: how often a hedge watcher looks at the other replicas'
// samples while none is known.
const hedgePoll = 25 * time.Millisecond

func (c *Client) readBatch(ctx context.Context, r *proto.Routing, reads []ChunkRead, b *batch) error {
	c.countReadRequest(len(b.ios), b.bytes)
	c.node(b.node).reads.Add(1)
	req := proto.BatchReadReq{IOs: b.ios}
	for _, io := range b.ios {
		if io.Local {
			req.Host = proto.HostID()
		}
	}
	var resp proto.BatchReadResp
	got := make([]int64, len(b.ios))    // bytes stored per IO, from the reply
	bad := make([]bool, len(b.ios))     // bytes that failed the client's check
	local := make([][]byte, len(b.ios)) // a local read's block CRCs
	// deliver fills IO i's callers' buffers with its n bytes, checked
	// against sums, by fill: a span read for one buffer at its offset, or
	// for buffers that follow each other at block boundaries (a whole
	// file fetched in pieces), lands in place; other merged spans go
	// through a scratch buffer and are scattered.
	deliver := func(i int, n int64, fill fillFunc, sums []byte) error {
		sp := b.spans[i]
		if pieces := tiles(reads, sp, n); pieces != nil {
			at := int64(0)
			for _, p := range pieces {
				ok, err := fill(p, at, sumsAt(sums, at))
				bad[i] = bad[i] || !ok
				if err != nil {
					return err
				}
				at += int64(len(p))
			}
			return nil
		}
		tmp := transport.GetBuffer(int(n))
		defer transport.PutBuffer(tmp)
		ok, err := fill(tmp, 0, sums)
		bad[i] = !ok
		if err == nil && ok {
			for _, m := range sp.members {
				q := &reads[m]
				if lo := q.Off - sp.off; lo < n {
					copy(q.Buf, tmp[lo:])
				}
			}
		}
		return err
	}
	// The reply's data goes straight from the connection into the callers'
	// buffers; local reads are done once the reply is in.
	sink := func(rd io.Reader, n int) error {
		if len(resp.Results) != len(b.ios) {
			return fmt.Errorf("%w: node %d answered %d results for %d reads", proto.ErrIO, b.node, len(resp.Results), len(b.ios))
		}
		total := int64(0)
		for i, res := range resp.Results {
			if res.N < 0 || res.N > b.ios[i].Len || (res.Code != "" && res.N != 0) ||
				(res.Sums != 0 && (!b.ios[i].Sums || res.Sums != 4*((res.N+proto.BlockSize-1)/proto.BlockSize))) ||
				(res.Path != "" && (!b.ios[i].Local || res.Sums == 0 || res.FileOff < 0)) {
				return fmt.Errorf("%w: node %d sent a malformed read reply", proto.ErrIO, b.node)
			}
			total += res.Sums
			if res.Path == "" {
				total += res.N
			}
		}
		if total != int64(n) {
			return fmt.Errorf("%w: node %d sent %d data bytes for results totalling %d", proto.ErrIO, b.node, n, total)
		}
		for i, res := range resp.Results {
			if res.N == 0 {
				continue
			}
			var sums []byte
			if res.Sums > 0 {
				sums = make([]byte, res.Sums)
				if _, err := io.ReadFull(rd, sums); err != nil {
					return err
				}
			}
			if res.Path != "" {
				local[i] = sums
				c.node(b.node).here.Store(true)
				continue
			}
			if err := deliver(i, res.N, streamFill(rd), sums); err != nil {
				return err
			}
			got[i] = res.N
		}
		return nil
	}
	err := c.callInto(ctx, r, b.node, proto.MBatchRead, req, &resp, sink)
	if err != nil {
		for i, sp := range b.spans {
			sp.fail(b.ios[i].Target)
		}
		return err
	}
	// Local reads, a few at once (the disk serves them in parallel).
	var localMu sync.Mutex // guards localErr
	var localErr error
	var lg errgroup.Group
	lg.SetLimit(localParallel)
	nl := c.node(b.node)
	for i, sums := range local {
		if sums == nil {
			continue
		}
		lg.Go(func() error {
			res := &resp.Results[i]
			err := c.readLocal(i, res, b.spans[i].direct, sums, deliver)
			if err == nil {
				nl.localFails.Store(0)
				got[i] = res.N
				return nil
			}
			// The span is read again over the connection, at once
			// (ReadChunks); a node whose files keep failing here is read
			// over the connection from now on.
			b.spans[i].noLocal, b.spans[i].localFailed = true, true
			if errors.Is(err, os.ErrPermission) || nl.localFails.Add(1) >= maxLocalFails {
				nl.noLocal.Store(true)
			}
			localMu.Lock()
			if localErr == nil {
				localErr = fmt.Errorf("%w: %w (reading it from the target instead)", proto.ErrTargetOffline, err)
			}
			localMu.Unlock()
			return nil
		})
	}
	lg.Wait()
	firstErr := localErr
	for i, res := range resp.Results {
		sp := b.spans[i]
		if local[i] != nil && got[i] == 0 {
			continue // the local read failed
		}
		if res.Code != "" {
			e := error(&transport.RemoteError{Code: res.Code, Msg: res.Msg})
			if errors.Is(e, proto.ErrChecksum) {
				if sp.badSum == nil {
					sp.badSum = map[proto.TargetID]bool{}
				}
				sp.badSum[b.ios[i].Target] = true
			}
			if !errors.Is(e, proto.ErrNotCommitted) {
				sp.fail(b.ios[i].Target)
			}
			if firstErr == nil || !retryable(firstErr) {
				firstErr = e
			}
			if errors.Is(e, proto.ErrChecksum) {
				firstErr = fmt.Errorf("%w (retrying another replica)", proto.ErrTargetOffline)
			}
			continue
		}
		if bad[i] {
			// The bytes failed their block CRCs here: read them again from
			// the same target, verified there (it repairs a corrupt chunk
			// and answers ErrChecksum, and the read fails over).
			sp.verifyAt = b.ios[i].Target
			if firstErr == nil {
				firstErr = fmt.Errorf("%w: chunk %v from target %d failed its checksum in the client (re-reading it verified by the target)", proto.ErrTargetOffline, sp.chunk, b.ios[i].Target)
			}
			continue
		}
		for _, m := range sp.members {
			q := &reads[m]
			n := int(max(0, min(got[i]-(q.Off-sp.off), int64(len(q.Buf)))))
			clear(q.Buf[n:])
			q.N = n
		}
		sp.done = true
	}
	return firstErr
}

// clientVerifyMin: reads at least this large (and block-aligned) are
// verified by the client; smaller ones by the target.
const clientVerifyMin = 64 << 10

// fillFunc fills buf with the bytes at offset at of one read and checks
// them against sums (the big-endian CRC32C of each proto.BlockSize block
// of buf; nil: no check): ok=false on a mismatch. err is a read error. A
// read is filled in one call, or in several of consecutive pieces, in
// order, each starting at a block boundary.
type fillFunc func(buf []byte, at int64, sums []byte) (ok bool, err error)

// streamFill fills from a stream (the connection, a file section), in
// order.
func streamFill(r io.Reader) fillFunc {
	return func(buf []byte, _ int64, sums []byte) (bool, error) { return readVerified(r, buf, sums) }
}

// tiles returns the callers' buffers of span sp, in order, cut to its n
// bytes, if they follow each other from sp.off with every boundary on a
// block (so that each piece has its own block CRCs); nil otherwise.
func tiles(reads []ChunkRead, sp *span, n int64) [][]byte {
	if len(sp.members) == 1 && reads[sp.members[0]].Off == sp.off {
		return [][]byte{reads[sp.members[0]].Buf[:n]}
	}
	var out [][]byte
	at := int64(0) // where the next buffer must start, from sp.off
	for _, m := range sp.members {
		q := &reads[m]
		if q.Off != sp.off+at || at%proto.BlockSize != 0 {
			return nil
		}
		if at < n {
			out = append(out, q.Buf[:min(int64(len(q.Buf)), n-at)])
		}
		// A buffer past the n bytes gets none (it is zeroed after).
		at += int64(len(q.Buf))
	}
	if at < n {
		return nil
	}
	return out
}

// sumsAt returns the block CRCs from byte at (a block boundary) on.
func sumsAt(sums []byte, at int64) []byte {
	if sums == nil {
		return nil
	}
	return sums[4*(at/proto.BlockSize):]
}

// checkSums reports whether every block of buf matches sums (nil: no
// check).
func checkSums(buf, sums []byte) bool {
	if sums == nil {
		return true
	}
	for b := 0; b < len(buf); b += proto.BlockSize {
		k := b / proto.BlockSize
		if crc32.Checksum(buf[b:min(b+proto.BlockSize, len(buf))], castagnoli) != binary.BigEndian.Uint32(sums[4*k:]) {
			return false
		}
	}
	return true
}

// readVerified fills buf from r. With sums (the big-endian CRC32C of each
// proto.BlockSize block of buf, the last possibly short), it checks the
// blocks as they arrive, a segment at a time while the bytes are still in
// the CPU's cache, and reports ok=false on a mismatch (buf is filled
// anyway, so the connection stays in step). err is a read error.
func readVerified(r io.Reader, buf []byte, sums []byte) (ok bool, err error) {
	if sums == nil {
		_, err := io.ReadFull(r, buf)
		return err == nil, err
	}
	const seg = 64 * proto.BlockSize
	ok = true
	for lo := 0; lo < len(buf); lo += seg {
		hi := min(lo+seg, len(buf))
		if _, err := io.ReadFull(r, buf[lo:hi]); err != nil {
			return false, err
		}
		ok = ok && checkSums(buf[lo:hi], sums[4*(lo/proto.BlockSize):])
	}
	return ok, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ReplicaChunks lists the chunks of inode held by one target of a chain
// (committed ones; ErrNotCommitted-wrapped if any is pending), for
// consistency checks: every serving replica of a chain must list the same.
func (c *Client) ReplicaChunks(ctx context.Context, chain ChainID, target proto.TargetID, inode uint64) ([]proto.ChunkMeta, error) {
	var out []proto.ChunkMeta
	err := c.routed(ctx, func(r *proto.Routing) error {
		var err error
		out, err = c.replicaChunks(ctx, r, chain, target, inode)
		return err
	})
	return out, err
}

// routed runs fn, retrying briefly while the target's routing version
// differs from ours (one of us has not seen the newest routing yet).
func (c *Client) routed(ctx context.Context, fn func(r *proto.Routing) error) error {
	for attempt := 0; ; attempt++ {
		err := fn(c.routing.Load())
		if err == nil || !errors.Is(err, proto.ErrRoutingVersion) || attempt >= 20 {
			return err
		}
		select {
		case <-time.After(25 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
		c.refresh(ctx)
	}
}

func (c *Client) replicaChunks(ctx context.Context, r *proto.Routing, chain ChainID, target proto.TargetID, inode uint64) ([]proto.ChunkMeta, error) {
	ch, t, err := c.chainTarget(r, chain, target)
	if err != nil {
		return nil, err
	}
	var resp proto.ListChunksResp
	if _, err := c.call(ctx, r, t.Node, proto.MListChunks, proto.ListChunksReq{Chain: chain, ChainVer: ch.Version, Target: target, Inode: inode}, nil, &resp); err != nil {
		return nil, err
	}
	return resp.Chunks, nil
}

// ReadReplica reads one range of a chunk from one given target (no
// failover), for consistency checks and repair tests. It returns the bytes
// stored there (fewer than n past the chunk's end).
func (c *Client) ReadReplica(ctx context.Context, chain ChainID, target proto.TargetID, chunk ChunkID, off, n int64) ([]byte, error) {
	var out []byte
	err := c.routed(ctx, func(r *proto.Routing) error {
		var err error
		out, err = c.readReplica(ctx, r, chain, target, chunk, off, n)
		return err
	})
	return out, err
}

func (c *Client) readReplica(ctx context.Context, r *proto.Routing, chain ChainID, target proto.TargetID, chunk ChunkID, off, n int64) ([]byte, error) {
	ch, t, err := c.chainTarget(r, chain, target)
	if err != nil {
		return nil, err
	}
	var resp proto.BatchReadResp
	io := proto.ReadIO{Chain: chain, ChainVer: ch.Version, Target: target, Chunk: chunk, Off: off, Len: n}
	data, err := c.call(ctx, r, t.Node, proto.MBatchRead, proto.BatchReadReq{IOs: []proto.ReadIO{io}}, nil, &resp)
	if err != nil {
		return nil, err
	}
	if len(resp.Results) != 1 {
		return nil, fmt.Errorf("%w: malformed reply", proto.ErrIO)
	}
	if res := resp.Results[0]; res.Code != "" {
		return nil, &transport.RemoteError{Code: res.Code, Msg: res.Msg}
	}
	return data, nil
}
