package mgmtd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage/chain"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/fs/trust"
	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrNotPrimary answers requests to a mgmtd that does not (or no longer)
// hold the primary lease; clients and storage services try the next
// mgmtd address.
var ErrNotPrimary = errkind.New(errkind.Unavailable, "mgmtd: not the primary (the lease is held elsewhere or lapsed)")

func errf(format string, args ...any) error {
	return errkind.Wrap(errkind.Data, fmt.Errorf("mgmtd: "+format, args...))
}

// routingKey holds the persisted routing.
var routingKey = []byte("mgmtd/routing")

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// Listen is the address to serve on. Default "127.0.0.1:0".
	Listen string
	// Token is the cluster secret. Required.
	Token string
	// Trust is the cluster's CA and member certificate (see fs/trust);
	// TLSLoopback uses TLS on loopback too. Nil Trust: loopback only,
	// plaintext. See transport.Options.
	Trust       *trust.Bundle
	TLSLoopback bool
	// Store persists the routing. Required.
	Store kv.Store
	// Replicas per chain when the chain table is built. Default 3.
	Replicas int
	// ExpectTargets: the chain table is built once this many targets have
	// registered. Default 0: never built automatically (see BuildChains).
	ExpectTargets int
	// ChunkSize announced to clients. Default proto.DefaultChunkSize.
	ChunkSize int64
	// HeartbeatInterval is how often storage services report (they read it
	// from their own flags; mgmtd uses it for the Freeze default). Default 1 s.
	HeartbeatInterval time.Duration
	// FailTimeout: a node silent this long is dead. Default 4 s.
	FailTimeout time.Duration
	// UpdateInterval: how often decisions run. Default 200 ms.
	UpdateInterval time.Duration
	// Freeze: after start, no decision for this long. Default
	// 2*HeartbeatInterval.
	Freeze time.Duration
	// Fence runs inside every write transaction; an error aborts the write.
	// The seam for a lease-holding primary. Default none.
	Fence func(ctx context.Context, tx kv.Txn) error
	// Holding reports whether this mgmtd still holds the primary lease by
	// its own clock (lease.Lease.Held). While it reports false, mgmtd
	// answers no heartbeat and no routing request (ErrNotPrimary) and
	// decides nothing: a primary resumed after a freeze, whose lease a
	// standby may have taken, must not keep storage services serving on
	// its say-so nor hand clients its old routing. Default: always.
	Holding func() bool
	// Faults and Name feed the transport fault layer. Name default "mgmtd".
	Faults transport.Faults
	Name   string
	// Slow sets slow-node detection's thresholds (slow.go); zero fields
	// take DefaultSlowParams, a negative Factor turns it off.
	Slow SlowParams
	// Logf logs decisions. Default log.Printf.
	Logf func(format string, args ...any)
	// Registry receives the metrics. Default: a new registry.
	Registry *prometheus.Registry
}

func (o *Options) defaults() error {
	if o.Token == "" {
		return fmt.Errorf("mgmtd: a cluster token is required")
	}
	if o.Store == nil {
		return fmt.Errorf("mgmtd: a kv store is required")
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if o.Replicas <= 0 {
		o.Replicas = 3
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = proto.DefaultChunkSize
	}
	if o.ChunkSize > proto.MaxChunkSize {
		return fmt.Errorf("mgmtd: chunk size %d above the maximum %d", o.ChunkSize, proto.MaxChunkSize)
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = time.Second
	}
	if o.FailTimeout <= 0 {
		o.FailTimeout = 4 * time.Second
	}
	if o.UpdateInterval <= 0 {
		o.UpdateInterval = 200 * time.Millisecond
	}
	if o.Freeze <= 0 {
		o.Freeze = 2 * o.HeartbeatInterval
	}
	if o.Name == "" {
		o.Name = "mgmtd"
	}
	if o.Logf == nil {
		o.Logf = log.Printf
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	return nil
}

type nodeState struct {
	NodeView
	hbVersion uint64
	metrics   string
	// space is the latest space report of each of the node's targets.
	space map[proto.TargetID]proto.TargetUsage
}

// Server is a running mgmtd.
type Server struct {
	opts   Options
	srv    *transport.Server
	start  time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	routing *proto.Routing              // published routing; guarded by mu
	nodes   map[proto.NodeID]*nodeState // guarded by mu
	targets map[proto.TargetID]proto.NodeID
	// nodesDirty: a node's address changed since the last publish; guarded by mu.
	nodesDirty bool
	// pubMu serialises publishers (the decision loop, BuildChains).
	pubMu sync.Mutex
	// lastTick is when the decision loop last ran (loop goroutine only).
	lastTick time.Time

	mChanges   prometheus.Counter
	mHeartbeat prometheus.Counter
	mVersion   prometheus.Gauge
	mStale     prometheus.Counter
	mSlowOut   prometheus.Counter
	mSlowNodes prometheus.Gauge
	// votes are the recent latency votes of clients and storage nodes
	// (slow.go), oldest first; hops the write path's hop reports they
	// came from (HopVotes), oldest first. Guarded by mu.
	votes []LatencyVote
	hops  []Hop
	// excl: slow nodes out of their chains, and the memory of past
	// exclusions (loop goroutine only, under pubMu).
	excl map[proto.NodeID]Exclusion
	// out: the nodes excluded at the last tick (loop goroutine only).
	out map[proto.NodeID]bool
	// staleResyncs counts the "uptodate" reports ignored as stale.
	staleResyncs atomic.Uint64
}

// StaleResyncs is the number of "uptodate" reports of syncing targets
// ignored since the server started because their resync ended under an
// older chain version than the one routed (chain.ResyncHolds).
func (s *Server) StaleResyncs() uint64 { return s.staleResyncs.Load() }

// Start loads the persisted routing (if any) and starts serving.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, nodes: map[proto.NodeID]*nodeState{}, targets: map[proto.TargetID]proto.NodeID{}}
	s.mChanges = prometheus.NewCounter(prometheus.CounterOpts{Name: "ffkit_mgmtd_routing_changes_total", Help: "Routing changes published."})
	s.mHeartbeat = prometheus.NewCounter(prometheus.CounterOpts{Name: "ffkit_mgmtd_heartbeats_total", Help: "Heartbeats received."})
	s.mVersion = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ffkit_mgmtd_routing_version", Help: "Current routing version."})
	s.mStale = prometheus.NewCounter(prometheus.CounterOpts{Name: "ffkit_mgmtd_stale_resync_reports_total", Help: "Uptodate reports of syncing targets ignored: their resync ended under an older chain version."})
	s.mSlowOut = prometheus.NewCounter(prometheus.CounterOpts{Name: "ffkit_mgmtd_slow_exclusions_total", Help: "Times a slow storage node was taken out of its chains."})
	s.mSlowNodes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ffkit_mgmtd_slow_nodes_out", Help: "Storage nodes out of their chains for being slow."})
	for _, c := range []prometheus.Collector{s.mChanges, s.mHeartbeat, s.mVersion, s.mStale, s.mSlowOut, s.mSlowNodes} {
		if err := opts.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("mgmtd: metrics: %w", err)
		}
	}
	r := &proto.Routing{Version: 1, ChunkSize: opts.ChunkSize}
	err := opts.Store.View(ctx, func(tx kv.ReadTxn) error {
		v, ok, err := tx.Get(ctx, routingKey)
		if err != nil || !ok {
			return err
		}
		var got proto.Routing
		if err := json.Unmarshal(v, &got); err != nil {
			return fmt.Errorf("mgmtd: persisted routing is corrupt: %w", err)
		}
		r = &got
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mgmtd: load state: %w", err)
	}
	// The timers are this process's options, whatever was persisted.
	r.FailTimeout = int64(opts.FailTimeout)
	r.HeartbeatInterval = int64(opts.HeartbeatInterval)
	r.ChunkSize = opts.ChunkSize
	if len(r.Chains) > 0 {
		// A restart: publish a new version so everyone re-reads.
		r.Version++
		if err := s.persist(ctx, r); err != nil {
			return nil, err
		}
	}
	for _, c := range r.Chains {
		for _, t := range c.Targets {
			s.targets[t.ID] = t.Node
		}
	}
	s.routing = r
	s.mVersion.Set(float64(r.Version))
	s.start = time.Now()
	s.srv, err = listen(ctx, opts, s.handle)
	if err != nil {
		return nil, err
	}
	s.srv.SetLogf(opts.Logf)
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go s.loop(lctx)
	return s, nil
}

// listenRetry bounds how long Start keeps trying to bind a fixed address
// that is in use; testHookListenBusy (tests only) runs after each failed
// attempt.
var (
	listenRetry        = 30 * time.Second
	testHookListenBusy func()
)

// listen binds opts.Listen. A restarted mgmtd binds the address it had,
// which its cluster's URL names; meanwhile the kernel may have handed that
// port to another socket as the local port of an outgoing connection (it
// was an ephemeral port when first chosen, ":0"), and bind fails with
// EADDRINUSE until that connection closes. Start waits for it, trying
// again every 100 ms for up to listenRetry, rather than exit.
func listen(ctx context.Context, opts Options, h transport.Handler) (*transport.Server, error) {
	deadline := time.Now().Add(listenRetry)
	logged := false
	for {
		srv, err := transport.Listen(opts.Listen, transport.Options{Token: opts.Token, Name: opts.Name, Faults: opts.Faults, Trust: opts.Trust, TLSLoopback: opts.TLSLoopback}, h)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return srv, err
		}
		if !logged {
			opts.Logf("mgmtd: %v; trying again for up to %v", err, listenRetry)
			logged = true
		}
		if testHookListenBusy != nil {
			testHookListenBusy()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("mgmtd: listen %s: %w", opts.Listen, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Addr is the address mgmtd serves on.
func (s *Server) Addr() string { return s.srv.Addr() }

// Routing returns the published routing (a copy).
func (s *Server) Routing() *proto.Routing {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.routing.Clone()
}

// Close stops the server.
func (s *Server) Close() error {
	s.cancel()
	s.wg.Wait()
	return s.srv.Close()
}

func (s *Server) persist(ctx context.Context, r *proto.Routing) error {
	start := time.Now()
	defer func() {
		if d := time.Since(start); d > s.opts.FailTimeout/4 {
			s.opts.Logf("mgmtd: slow store: persisting routing v%d took %v", r.Version, d.Round(time.Millisecond))
		}
	}()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	err = s.opts.Store.Update(ctx, func(tx kv.Txn) error {
		if s.opts.Fence != nil {
			if err := s.opts.Fence(ctx, tx); err != nil {
				return err
			}
		}
		tx.Set(routingKey, b)
		return nil
	})
	if err != nil {
		return fmt.Errorf("mgmtd: persist routing v%d: %w", r.Version, err)
	}
	return nil
}

// holding reports whether this mgmtd may answer and decide (Options.Holding).
func (s *Server) holding() bool { return s.opts.Holding == nil || s.opts.Holding() }

func (s *Server) handle(ctx context.Context, req *transport.Request) (any, [][]byte, error) {
	if !s.holding() {
		return nil, nil, fmt.Errorf("%w (%s)", ErrNotPrimary, s.opts.Name)
	}
	switch req.Method {
	case proto.MHeartbeat:
		var hb proto.HeartbeatReq
		if err := req.Decode(&hb); err != nil {
			return nil, nil, err
		}
		return s.heartbeat(ctx, &hb)
	case proto.MGetRouting:
		var rr proto.RoutingReq
		if err := req.Decode(&rr); err == nil {
			if len(rr.Latency) > 0 {
				s.takeLatency(&rr)
			}
			if len(rr.Hops) > 0 {
				s.takeHops(rr.Client, rr.Hops)
			}
		}
		r := s.Routing()
		s.addMeta(ctx, r)
		return r, nil, nil
	case proto.MStatus:
		r := s.Routing()
		s.addMeta(ctx, r)
		return proto.StatusResp{Routing: r, Targets: s.Space(), Ready: s.Ready()}, nil, nil
	}
	return nil, nil, fmt.Errorf("%w: mgmtd has no method %d", proto.ErrBadRequest, req.Method)
}

func (s *Server) heartbeat(ctx context.Context, hb *proto.HeartbeatReq) (any, [][]byte, error) {
	s.mHeartbeat.Inc()
	if hb.Node == 0 || hb.Addr == "" {
		return nil, nil, fmt.Errorf("%w: heartbeat without node id or address", proto.ErrBadRequest)
	}
	s.mu.Lock()
	n := s.nodes[hb.Node]
	if n != nil && hb.Version <= n.hbVersion {
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: stale heartbeat version %d from node %d (have %d)", proto.ErrBadRequest, hb.Version, hb.Node, n.hbVersion)
	}
	for _, t := range hb.Targets {
		if owner, ok := s.targets[t.ID]; ok && owner != hb.Node {
			s.mu.Unlock()
			return nil, nil, fmt.Errorf("%w: target %d reported by node %d belongs to node %d", proto.ErrBadRequest, t.ID, hb.Node, owner)
		}
	}
	if n == nil {
		n = &nodeState{}
		s.nodes[hb.Node] = n
		s.opts.Logf("mgmtd: node %d registered at %s", hb.Node, hb.Addr)
	}
	n.hbVersion = hb.Version
	n.LastHB = time.Now()
	n.metrics = hb.Metrics
	n.Targets = map[proto.TargetID]proto.LocalState{}
	n.ChainVer = map[proto.TargetID]uint64{}
	n.space = map[proto.TargetID]proto.TargetUsage{}
	now := time.Now().UnixNano()
	for _, t := range hb.Targets {
		n.Targets[t.ID] = t.State
		n.ChainVer[t.ID] = t.ChainVer
		if ch := chainOfTarget(s.routing, t.ID); t.State == proto.UpToDate && ch != nil {
			if me, _ := ch.Target(t.ID); !chain.ResyncHolds(me.State, ch.Version, t.ChainVer) {
				s.staleResyncs.Add(1)
				s.mStale.Inc()
				s.opts.Logf("mgmtd: target %d reports uptodate from chain v%d, chain %d is at v%d: ignored", t.ID, t.ChainVer, ch.ID, ch.Version)
			}
		}
		n.space[t.ID] = proto.TargetUsage{ID: t.ID, Node: hb.Node, Used: t.Used, Capacity: t.Capacity, Free: t.Free, FS: t.FS, FSUsed: t.FSUsed, Reported: now}
		s.targets[t.ID] = hb.Node
	}
	if n.Addr != hb.Addr || s.routing.NodeAddr(hb.Node) != hb.Addr {
		// Published by the next tick: a heartbeat never waits for the store.
		s.nodesDirty = true
	}
	n.Addr = hb.Addr
	r := s.routing
	s.mu.Unlock()
	if len(hb.Hops) > 0 {
		s.takeHops(uint64(hb.Node), hb.Hops)
	}
	if hb.Known == r.Version {
		return proto.HeartbeatResp{}, nil, nil
	}
	return proto.HeartbeatResp{Routing: r}, nil, nil
}

// takeLatency records a client's latency report as votes (slow.go).
func (s *Server) takeLatency(rr *proto.RoutingReq) {
	s.withSlow(func(now time.Time, p SlowParams) {
		var known []proto.NodeLatency
		for _, l := range rr.Latency {
			if _, ok := s.nodes[l.Node]; ok {
				known = append(known, l)
			}
		}
		s.addVotesLocked(Votes(known, rr.Client, now, p), now, p)
	})
}

// withSlow runs fn with mu held and the slow-node parameters, unless
// slow-node detection is off.
func (s *Server) withSlow(fn func(now time.Time, p SlowParams)) {
	if s.opts.Slow.Off() {
		return
	}
	now := time.Now()
	p := s.opts.Slow.withDefaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(now, p)
}

// addVotesLocked adds votes, forgetting those out of the window and
// keeping at most maxVotes. Caller holds mu.
func (s *Server) addVotesLocked(votes []LatencyVote, now time.Time, p SlowParams) {
	s.votes = append(recent(s.votes, func(v LatencyVote) time.Time { return v.At }, now, p.Window), votes...)
}

// recent is xs without its entries older than window (xs is in time
// order) and without the oldest beyond maxVotes.
func recent[T any](xs []T, at func(T) time.Time, now time.Time, window time.Duration) []T {
	i := 0
	for i < len(xs) && (now.Sub(at(xs[i])) > window || len(xs)-i > maxVotes) {
		i++
	}
	return xs[i:]
}

// takeHops records a write-path hop report (a client's writes, reporter
// its id, or a storage node's forwards, reporter the node) and the votes
// it gives (HopVotes).
func (s *Server) takeHops(reporter uint64, rep []proto.HopLatency) {
	s.withSlow(func(now time.Time, p SlowParams) {
		var fresh []Hop
		for _, h := range rep {
			_, to := s.nodes[h.To]
			_, from := s.nodes[h.From]
			if to && (from || h.From == 0) {
				fresh = append(fresh, Hop{HopLatency: h, Reporter: reporter, At: now})
			}
		}
		if len(fresh) == 0 {
			return
		}
		s.hops = append(recent(s.hops, func(h Hop) time.Time { return h.At }, now, p.Window), fresh...)
		s.addVotesLocked(HopVotes(s.hops, fresh, now, p), now, p)
	})
}

// maxVotes bounds the latency votes mgmtd keeps (clients report on every
// routing refresh, by default once a second).
const maxVotes = 4096

// Space returns the latest space report of every target heard from since
// this mgmtd started, by target id. It lives in memory only: every
// heartbeat refreshes it.
func (s *Server) Space() []proto.TargetUsage {
	s.mu.Lock()
	out := []proto.TargetUsage{}
	for _, n := range s.nodes {
		for _, u := range n.space {
			out = append(out, u)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b proto.TargetUsage) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// nodesLocked returns r with the node address list brought up to date (a
// node registered or moved).
func (s *Server) nodesLocked(r *proto.Routing) *proto.Routing {
	r = r.Clone()
	r.Nodes = r.Nodes[:0]
	for id, n := range s.nodes {
		r.Nodes = append(r.Nodes, proto.Node{ID: id, Addr: n.Addr})
	}
	// Keep nodes known from the persisted routing that have not come back.
	for _, old := range s.routing.Nodes {
		if _, ok := s.nodes[old.ID]; !ok {
			r.Nodes = append(r.Nodes, old)
		}
	}
	sortNodes(r.Nodes)
	return r
}

// publish persists r and then makes it the published routing. The caller
// holds pubMu (not mu: a slow store must not stall heartbeats).
func (s *Server) publish(ctx context.Context, r *proto.Routing) error {
	if err := s.persist(ctx, r); err != nil {
		return err
	}
	s.mu.Lock()
	s.routing = r
	s.mu.Unlock()
	s.mChanges.Inc()
	s.mVersion.Set(float64(r.Version))
	return nil
}

func (s *Server) loop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.UpdateInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if err := s.tick(ctx, now); err != nil && ctx.Err() == nil {
				s.opts.Logf("mgmtd: %v", err)
			}
		}
	}
}

// tick runs one round of decisions.
func (s *Server) tick(ctx context.Context, now time.Time) error {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	gap := time.Duration(0)
	if !s.lastTick.IsZero() {
		gap = now.Sub(s.lastTick)
	}
	s.lastTick = now
	if !s.holding() {
		return nil
	}
	s.mu.Lock()
	if credit := StallCredit(gap, s.opts.UpdateInterval, s.opts.FailTimeout); credit > 0 {
		// mgmtd itself did not run (frozen, starved): the heartbeats it
		// could not take in meanwhile do not count against the nodes.
		s.opts.Logf("mgmtd: did not run for %v: every node's failure clock pauses as long", gap.Round(time.Millisecond))
		for _, n := range s.nodes {
			if n.LastHB = n.LastHB.Add(credit); n.LastHB.After(now) {
				n.LastHB = now
			}
		}
	}
	cur := s.routing
	next := cur
	if s.nodesDirty {
		next = s.nodesLocked(cur)
		s.nodesDirty = false
	}
	views := make(map[proto.NodeID]NodeView, len(s.nodes))
	for id, n := range s.nodes {
		views[id] = NodeView{Addr: n.Addr, LastHB: n.LastHB, Targets: maps.Clone(n.Targets), ChainVer: maps.Clone(n.ChainVer)}
	}
	votes := slices.Clone(s.votes)
	build := len(cur.Chains) == 0 && s.opts.ExpectTargets > 0 && len(s.targets) >= s.opts.ExpectTargets
	targets := maps.Clone(s.targets)
	s.mu.Unlock()

	if build {
		if next == cur {
			next = cur.Clone()
		}
		if err := s.buildInto(next, targets); err != nil {
			return err
		}
	} else if len(next.Chains) > 0 && now.Sub(s.start) >= s.opts.Freeze {
		local := LocalStates(views, now, s.opts.FailTimeout)
		reported := map[proto.TargetID]uint64{}
		for _, v := range views {
			maps.Copy(reported, v.ChainVer)
		}
		StaleResyncs(next, local, reported) // counted as they arrive
		if !s.opts.Slow.Off() {
			s.slowNodes(next, local, votes, now)
		}
		if d, changed := Decide(next, local); changed {
			for i, c := range d.Chains {
				if c.Version != next.Chains[i].Version {
					s.opts.Logf("mgmtd: routing v%d: %s", d.Version, c.String())
				}
			}
			next = d
		}
	}
	if next == cur {
		return nil
	}
	if next.Version == cur.Version {
		next.Version++
	}
	if err := s.publish(ctx, next); err != nil {
		s.mu.Lock()
		s.nodesDirty = true // retry next tick
		s.mu.Unlock()
		return err
	}
	return nil
}

// slowNodes takes persistently slow nodes out of their chains and lets
// them back when their hold ends (slow.go), by marking their targets
// offline in local before Decide. Caller holds pubMu.
func (s *Server) slowNodes(r *proto.Routing, local map[proto.TargetID]proto.LocalState, votes []LatencyVote, now time.Time) {
	p := s.opts.Slow.withDefaults()
	before := s.out
	next, taken := NextExclusions(s.excl, SlowNodes(votes, now, p), r, local, now, p)
	after := Excluded(next, now)
	for _, id := range taken {
		var lat, base []string
		for _, v := range votes {
			if v.Node == id && v.Slow && now.Sub(v.At) <= p.Window {
				lat = append(lat, v.Latency.Round(time.Millisecond).String())
				base = append(base, v.Base.Round(time.Millisecond).String())
			}
		}
		if len(lat) > 5 {
			lat, base = lat[len(lat)-5:], base[len(base)-5:]
		}
		s.opts.Logf("mgmtd: node %d is slow (reads from it or write hops through it took %v against %v on the fastest other node): taking its targets out of their chains until %s (exclusion %d in a row)",
			id, lat, base, next[id].Until.Format("15:04:05.000"), next[id].Count)
		s.mSlowOut.Inc()
	}
	for id := range before {
		if !after[id] {
			s.opts.Logf("mgmtd: node %d's hold for slowness ended: its targets rejoin through resync", id)
		}
	}
	s.excl, s.out = next, after
	s.mSlowNodes.Set(float64(len(after)))
	ApplyExclusions(local, r, after)
}

// BuildChains builds the chain table from the registered targets now, if
// none exists yet.
func (s *Server) BuildChains(ctx context.Context) error {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	s.mu.Lock()
	r := s.nodesLocked(s.routing)
	targets := maps.Clone(s.targets)
	s.mu.Unlock()
	if len(r.Chains) > 0 {
		return nil
	}
	if err := s.buildInto(r, targets); err != nil {
		return err
	}
	r.Version++
	return s.publish(ctx, r)
}

// buildInto sets r's chain table (r must be a private copy).
func (s *Server) buildInto(r *proto.Routing, targets map[proto.TargetID]proto.NodeID) error {
	chains, err := Placement(targets, s.opts.Replicas)
	if err != nil {
		return err
	}
	if len(chains) == 0 {
		return fmt.Errorf("mgmtd: no chain could be built from %d targets", len(targets))
	}
	r.Chains = chains
	for _, c := range chains {
		s.opts.Logf("mgmtd: created %s", c.String())
	}
	return nil
}

func sortNodes(ns []proto.Node) {
	for i := 1; i < len(ns); i++ {
		for j := i; j > 0 && ns[j].ID < ns[j-1].ID; j-- {
			ns[j], ns[j-1] = ns[j-1], ns[j]
		}
	}
}

// Ready reports whether the cluster serves fully: a chain table exists,
// every target in it is serving in the published routing, and its storage
// service's latest heartbeat (fresher than FailTimeout) reports it up to
// date.
func (s *Server) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.routing.Chains) == 0 {
		return false
	}
	for _, c := range s.routing.Chains {
		for _, t := range c.Targets {
			n := s.nodes[t.Node]
			if t.State != proto.Serving || n == nil || time.Since(n.LastHB) > s.opts.FailTimeout || n.Targets[t.ID] != proto.UpToDate {
				return false
			}
		}
	}
	return true
}

// WaitReady waits until Ready reports true. It returns an error naming the
// routing it last saw if ctx ends first.
func (s *Server) WaitReady(ctx context.Context) error {
	for !s.Ready() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("mgmtd: cluster not ready: %w (chains %v)", ctx.Err(), s.Routing().Chains)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// chainOfTarget is the chain of r that holds target id, or nil.
func chainOfTarget(r *proto.Routing, id proto.TargetID) *proto.Chain {
	for i := range r.Chains {
		if _, ok := r.Chains[i].Target(id); ok {
			return &r.Chains[i]
		}
	}
	return nil
}
