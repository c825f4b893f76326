package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage/chain"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/fs/trust"
)

// TargetConfig names one target directory.
type TargetConfig struct {
	ID  proto.TargetID
	Dir string
}

// Config configures a storage service. Zero values take the defaults.
type Config struct {
	Node    proto.NodeID   // required, unique in the cluster
	Targets []TargetConfig // required
	Mgmtd   []string       // mgmtd addresses, required
	Token   string         // cluster secret, required
	// Trust is the cluster's CA and member certificate (see fs/trust);
	// TLSLoopback uses TLS on loopback too. Nil Trust: loopback only,
	// plaintext. See transport.Options.
	Trust       *trust.Bundle
	TLSLoopback bool
	// Listen address. Default "127.0.0.1:0".
	Listen string
	// Name for logs and the fault layer. Default "storage-<node>".
	Name   string
	Faults transport.Faults
	// MetricsListen serves Prometheus metrics at /metrics. "" = none.
	MetricsListen string
	// HeartbeatInterval and FailTimeout apply until mgmtd's routing
	// announces its own. Defaults 1 s and 4 s.
	HeartbeatInterval time.Duration
	FailTimeout       time.Duration
	// ForwardTimeout bounds how long an update keeps retrying its
	// successor through reconfiguration. Default 30 s.
	ForwardTimeout time.Duration
	// PendingTimeout: a head re-drives a pending version left this long
	// without a writer (a crash mid-write). Default 2 s.
	PendingTimeout time.Duration
	VFS            VFS // default OS{}
	Logf           func(format string, args ...any)
	// NoLocalReads refuses short-circuit reads (proto.ReadIO.Local): a
	// client on this host then always gets the bytes over the connection.
	NoLocalReads bool
	// ScrubInterval: every so often (the first pass one interval after
	// start) each committed chunk of a serving target is read and checked
	// against its block checksums, one chunk per work tick (100 ms); a
	// rotten one is repaired as a read that found it would be. A rotten
	// copy that nothing reads would else stay until its replicas are
	// needed. Default 24 h; negative: never.
	ScrubInterval time.Duration
}

func (c *Config) defaults() error {
	switch {
	case c.Node == 0:
		return errors.New("storage: a node id (> 0) is required")
	case len(c.Targets) == 0:
		return errors.New("storage: at least one target directory is required")
	case len(c.Mgmtd) == 0:
		return errors.New("storage: the mgmtd address is required")
	case c.Token == "":
		return errors.New("storage: a cluster token is required")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.Name == "" {
		c.Name = fmt.Sprintf("storage-%d", c.Node)
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.FailTimeout <= 0 {
		c.FailTimeout = 4 * time.Second
	}
	if c.ForwardTimeout <= 0 {
		c.ForwardTimeout = 30 * time.Second
	}
	if c.PendingTimeout <= 0 {
		c.PendingTimeout = 2 * time.Second
	}
	if c.ScrubInterval == 0 {
		c.ScrubInterval = 24 * time.Hour
	}
	if c.VFS == nil {
		c.VFS = OS{}
	}
	if c.Logf == nil {
		c.Logf = log.Printf
	}
	return nil
}

// phase is a target's local life cycle (see package doc).
type phase int32

// The values are chain.Phase's, so chain.NextPhase decides the moves.
const (
	phaseRestarting = phase(chain.Restarting) // report offline until mgmtd shows us not serving
	phaseOnline     = phase(chain.Online)     // report online: waiting for resync or promotion
	phaseUpToDate   = phase(chain.UpToDate)   // holds the chain's data
)

func (p phase) local() proto.LocalState {
	switch p {
	case phaseOnline:
		return proto.Online
	case phaseUpToDate:
		return proto.UpToDate
	}
	return proto.LocalOff
}

type tstate struct {
	*Target
	phase       atomic.Int32
	syncRunning atomic.Bool // a resync of our successor is running
	// syncedAt is the chain version at which our successor's resync last
	// completed (no rerun until the chain changes).
	syncedAt atomic.Uint64
	// upToDateCV is the chain version under which this target last became
	// up to date (its resync ended, or mgmtd promoted it); its uptodate
	// reports carry it (chain.ResyncHolds).
	upToDateCV atomic.Uint64
}

func (ts *tstate) ph() phase { return phase(ts.phase.Load()) }

// Service is a running storage service.
type Service struct {
	cfg     Config
	srv     *transport.Server
	pool    *transport.Pool
	targets map[proto.TargetID]*tstate
	routing atomic.Pointer[proto.Routing]
	lastHB  atomic.Int64 // unix nanos when the last heartbeat mgmtd answered was sent
	hbSeq   atomic.Uint64
	fenced  atomic.Bool
	dedup   dedup
	metrics *metrics
	httpSrv *http.Server
	metAddr string
	kick    chan struct{} // heartbeat now
	// hops: this node's forwards to its successors since the last
	// heartbeat, reported with the next one (mgmtd's slow-node detection).
	hops proto.HopMeter

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start opens the targets (recovering from a crash), starts serving and
// heartbeating. Every target starts in the restarting phase: it reports
// offline until mgmtd's routing shows it is not serving, so a restarted
// target always goes through resync before it serves again.
func Start(cfg Config) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, targets: map[proto.TargetID]*tstate{}, kick: make(chan struct{}, 1)}
	s.dedup.m = map[proto.Tag]*inflight{}
	for _, tc := range cfg.Targets {
		if tc.ID == 0 {
			return nil, fmt.Errorf("storage: target %s has id 0", tc.Dir)
		}
		if _, dup := s.targets[tc.ID]; dup {
			return nil, fmt.Errorf("storage: target id %d given twice", tc.ID)
		}
		t, err := OpenTarget(cfg.VFS, tc.ID, tc.Dir)
		if err != nil {
			return nil, err
		}
		s.targets[tc.ID] = &tstate{Target: t}
	}
	s.metrics = newMetrics(s)
	topts := transport.Options{Token: cfg.Token, Name: cfg.Name, Faults: cfg.Faults, Trust: cfg.Trust, TLSLoopback: cfg.TLSLoopback}
	s.pool = transport.NewPool(topts)
	var err error
	s.srv, err = transport.Listen(cfg.Listen, topts, s.handle)
	if err != nil {
		return nil, err
	}
	s.srv.SetLogf(cfg.Logf)
	if cfg.MetricsListen != "" {
		ln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			s.srv.Close()
			return nil, fmt.Errorf("storage: metrics listener: %w", err)
		}
		s.metAddr = ln.Addr().String()
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
		s.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go s.httpSrv.Serve(ln)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.lastHB.Store(time.Now().UnixNano())
	s.hbSeq.Store(uint64(time.Now().UnixNano()))
	s.wg.Add(2)
	go s.heartbeatLoop()
	go s.workLoop()
	return s, nil
}

// Addr is the address the service listens on.
func (s *Service) Addr() string { return s.srv.Addr() }

// MetricsAddr is the Prometheus endpoint's address, or "".
func (s *Service) MetricsAddr() string { return s.metAddr }

// Close stops the service (without any flush: every acknowledged write is
// already durable).
func (s *Service) Close() error {
	s.cancel()
	s.wg.Wait()
	if s.httpSrv != nil {
		s.httpSrv.Close()
	}
	err := s.srv.Close()
	s.pool.Close()
	return err
}

func (s *Service) logf(format string, args ...any) {
	s.cfg.Logf("%s: "+format, append([]any{s.cfg.Name}, args...)...)
}

func (s *Service) failTimeout() time.Duration {
	if r := s.routing.Load(); r != nil && r.FailTimeout > 0 {
		return time.Duration(r.FailTimeout)
	}
	return s.cfg.FailTimeout
}

// callTimeout bounds one replication call to a successor (an update, a
// resync step): after it the sender drops the call and resends.
func (s *Service) callTimeout() time.Duration { return max(s.failTimeout(), time.Second) }

func (s *Service) hbInterval() time.Duration {
	if r := s.routing.Load(); r != nil && r.HeartbeatInterval > 0 {
		return time.Duration(r.HeartbeatInterval)
	}
	return s.cfg.HeartbeatInterval
}

// ---- heartbeats, routing, phases ----

// testHookHeartbeat, when set (tests only), runs after a heartbeat got
// its answer and before the service records it: a test holds it there as
// a loaded host's scheduler would.
var testHookHeartbeat atomic.Pointer[func(s *Service)]

// testHookForward, when set (tests only), runs before each attempt to
// forward version ver of chunk id from ts to its successor: a test holds
// an update there, in flight down the chain.
var testHookForward atomic.Pointer[func(ts *tstate, id proto.ChunkID, ver uint64)]

func (s *Service) heartbeatLoop() {
	defer s.wg.Done()
	mgmtdIdx := 0
	for {
		iv := s.hbInterval()
		req := proto.HeartbeatReq{Node: s.cfg.Node, Addr: s.Addr(), Metrics: s.metAddr, Version: s.hbSeq.Add(1), Hops: s.hops.Report()}
		if r := s.routing.Load(); r != nil {
			req.Known = r.Version
		}
		for id, ts := range s.targets {
			tr := proto.TargetReport{ID: id, State: ts.ph().local(), Used: ts.Used()}
			if tr.State == proto.UpToDate {
				tr.ChainVer = ts.upToDateCV.Load()
			}
			if sp, err := ts.Space(); err != nil {
				s.logf("target %d: %v", id, err) // reported as unknown (0)
			} else {
				tr.Capacity, tr.Free, tr.FS, tr.FSUsed = sp.Capacity, sp.Free, sp.ID, sp.Used
			}
			req.Targets = append(req.Targets, tr)
		}
		var resp proto.HeartbeatResp
		var err error
		// sent is when the heartbeat that got through left: mgmtd cannot
		// have heard it earlier, so its fail timeout runs from a later
		// instant than our fencing window. Taking the time the answer came
		// back instead (as this did) stretches our window by however long
		// the answer took and this goroutine waited to run, which on a
		// loaded host can outlast the fail timeout: mgmtd has made a new
		// chain without us, writes are acknowledged without us, and we
		// still serve reads routed with the old chain version (stale
		// bytes to a reader that opened after the writer's Flush).
		var sent time.Time
		for i := 0; i < len(s.cfg.Mgmtd); i++ {
			addr := s.cfg.Mgmtd[(mgmtdIdx+i)%len(s.cfg.Mgmtd)]
			sent = time.Now()
			ctx, cancel := context.WithTimeout(s.ctx, max(iv, s.failTimeout()/4))
			var c *transport.Conn
			if c, err = s.pool.Get(ctx, addr); err == nil {
				_, err = c.Call(ctx, proto.MHeartbeat, req, nil, &resp)
				if err != nil && errors.Is(err, context.DeadlineExceeded) {
					s.pool.Drop(addr)
				}
			}
			cancel()
			if err == nil {
				mgmtdIdx = (mgmtdIdx + i) % len(s.cfg.Mgmtd)
				break
			}
		}
		if hook := testHookHeartbeat.Load(); err == nil && hook != nil {
			(*hook)(s)
		}
		s.mgmtdContact(sent, resp.Routing, err)
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(iv):
		case <-s.kick:
		}
	}
}

// mgmtdContact records the outcome of one heartbeat round: answered (err
// nil; sent is when the heartbeat that got through left, r the routing in
// its answer, maybe nil) or not.
//
// Self-fencing: after half the fail timeout without an answer from any
// mgmtd, mgmtd may be declaring us dead, so the service refuses every
// request (reads, writes, and updates from its predecessors: a write in a
// chain it serves in fails rather than being acknowledged without it
// under the chain version it holds). Replication in flight from here (a
// forward down the chain, a resync) ends with the fence, as it did when a
// fence sent the targets back to restarting. The targets keep their
// phases: when a
// mgmtd answers again, its routing decides. Unchanged chains (a frozen
// mgmtd that resumed, or a standby that took over with the persisted
// routing) serve again at once, without a resync; a chain in which mgmtd
// dropped us (writes acknowledged without us) moves our target to
// restarting (chain.NextPhase) and it rejoins through resync. (Every
// target used to go back through restart and resync on every fence, so
// a 20 s pause of the one mgmtd stopped the whole cluster; issue 16.)
// The routing is installed before the fence lifts, so no request is
// served under a routing older than the answer's.
func (s *Service) mgmtdContact(sent time.Time, r *proto.Routing, err error) {
	if err == nil {
		s.setRouting(r) // phases move on every answer
		s.lastHB.Store(sent.UnixNano())
		if s.fenced.Swap(false) {
			s.logf("mgmtd reachable again: serving by its routing")
		}
		return
	}
	if since := time.Since(time.Unix(0, s.lastHB.Load())); since > s.failTimeout()/2 && !s.fenced.Swap(true) {
		s.logf("lost mgmtd for %v (> fail timeout/2): stop serving until a mgmtd answers: %v", since.Round(time.Millisecond), err)
	}
}

// setRouting installs r if it is newer (r may be nil: a heartbeat answer
// without routing) and then moves every target's phase by the routing now
// held (chain.NextPhase). It runs on every answered heartbeat, not only on
// a newer routing: a target that left serving while mgmtd already shows it
// offline gets no newer routing and must still move on to online, or it
// never rejoins (a paused process that was declared dead).
func (s *Service) setRouting(r *proto.Routing) {
	for r != nil {
		old := s.routing.Load()
		if old != nil && r.Version <= old.Version {
			break
		}
		if s.routing.CompareAndSwap(old, r) {
			break
		}
	}
	cur := s.routing.Load()
	if cur == nil {
		return
	}
	for id, ts := range s.targets {
		var st proto.PublicState
		ch := chainOfTarget(cur, id)
		if ch != nil {
			t, _ := ch.Target(id)
			st = t.State
		}
		p := ts.ph()
		next := phase(chain.NextPhase(chain.Phase(p), st, ch != nil))
		if next == phaseUpToDate && p != phaseUpToDate {
			ts.upToDateCV.Store(ch.Version) // promoted (stored first: the report must not be stale)
		}
		if next == phaseUpToDate && ch != nil && !chain.ResyncHolds(st, ch.Version, ts.upToDateCV.Load()) {
			// Syncing again under a newer chain version than our resync
			// ended in: we may have missed writes in between (mgmtd ignores
			// such a report anyway); report online until the resync under
			// this version ends.
			next = phaseOnline
		}
		if next == p || !ts.phase.CompareAndSwap(int32(p), int32(next)) {
			continue // unchanged, or moved concurrently: the next heartbeat decides
		}
		switch next {
		case phaseOnline:
			s.logf("target %d: mgmtd shows it %q: online, ready for resync", id, st)
			s.kickHeartbeat()
		case phaseUpToDate:
			s.logf("target %d: promoted to serving by mgmtd", id)
		case phaseRestarting:
			s.logf("target %d: mgmtd shows it %q: stop serving, rejoin through resync", id, st)
			s.kickHeartbeat()
		}
	}
}

func (s *Service) kickHeartbeat() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func chainOfTarget(r *proto.Routing, id proto.TargetID) *proto.Chain {
	for i := range r.Chains {
		if _, ok := r.Chains[i].Target(id); ok {
			return &r.Chains[i]
		}
	}
	return nil
}

// ---- request handling ----

func (s *Service) handle(ctx context.Context, req *transport.Request) (any, [][]byte, error) {
	// Checked per request too, not only when a heartbeat fails: a slow
	// failing heartbeat must not stretch the window past half the timeout.
	if time.Since(time.Unix(0, s.lastHB.Load())) > s.failTimeout()/2 {
		return nil, nil, fmt.Errorf("%w: %s has not reached mgmtd for half the fail timeout", proto.ErrTargetOffline, s.cfg.Name)
	}
	if s.fenced.Load() && req.Method != proto.MUpdate {
		return nil, nil, fmt.Errorf("%w: %s lost contact with mgmtd", proto.ErrTargetOffline, s.cfg.Name)
	}
	start := time.Now()
	resp, data, err := s.dispatch(ctx, req)
	s.metrics.observe(req.Method, start, len(req.Data), data, err)
	return resp, data, err
}

func (s *Service) dispatch(ctx context.Context, req *transport.Request) (any, [][]byte, error) {
	switch req.Method {
	case proto.MWrite:
		var w proto.WriteReq
		if err := req.Decode(&w); err != nil {
			return nil, nil, err
		}
		resp, err := s.handleWrite(ctx, &w, req.Data)
		return resp, nil, err
	case proto.MUpdate:
		var u proto.UpdateReq
		if err := req.Decode(&u); err != nil {
			return nil, nil, err
		}
		resp, err := s.handleUpdate(ctx, &u, req.Data)
		return resp, nil, err
	case proto.MBatchRead:
		var b proto.BatchReadReq
		if err := req.Decode(&b); err != nil {
			return nil, nil, err
		}
		return s.handleRead(req, &b)
	case proto.MSyncStart, proto.MSyncDone:
		var sr proto.SyncReq
		if err := req.Decode(&sr); err != nil {
			return nil, nil, err
		}
		return s.handleSync(req.Method, &sr)
	case proto.MListChunks:
		var l proto.ListChunksReq
		if err := req.Decode(&l); err != nil {
			return nil, nil, err
		}
		return s.handleList(&l)
	case proto.MRemove:
		var rr proto.RemoveReq
		if err := req.Decode(&rr); err != nil {
			return nil, nil, err
		}
		resp, err := s.handleRemove(ctx, &rr)
		return resp, nil, err
	}
	return nil, nil, fmt.Errorf("%w: storage has no method %d", proto.ErrBadRequest, req.Method)
}

// route checks a request's chain version and finds the chain.
func (s *Service) route(chain proto.ChainID, ver uint64) (*proto.Chain, error) {
	r := s.routing.Load()
	ch := r.Chain(chain)
	if ch == nil {
		if r == nil {
			return nil, fmt.Errorf("%w: %s has no routing yet", proto.ErrRoutingVersion, s.cfg.Name)
		}
		return nil, fmt.Errorf("%w: chain %d (routing v%d)", proto.ErrNoChain, chain, r.Version)
	}
	if ch.Version != ver {
		return nil, fmt.Errorf("%w: chain %d is at v%d on %s, request has v%d", proto.ErrRoutingVersion, chain, ch.Version, s.cfg.Name, ver)
	}
	return ch, nil
}

func validRange(op proto.Op, off int64, n int) error {
	switch {
	case off < 0 || off > proto.MaxChunkSize || int64(n) > proto.MaxChunkSize-off:
		return fmt.Errorf("%w: range [%d, +%d) outside a chunk of at most %d bytes", proto.ErrBadRequest, off, n, proto.MaxChunkSize)
	case op > proto.OpRemove:
		return fmt.Errorf("%w: unknown op %d", proto.ErrBadRequest, op)
	}
	return nil
}

func (s *Service) handleWrite(ctx context.Context, w *proto.WriteReq, data []byte) (*proto.WriteResp, error) {
	if err := validRange(w.Op, w.Off, len(data)); err != nil {
		return nil, err
	}
	var crcs []uint32
	if w.Op == proto.OpWrite {
		if crcs = proto.PayloadCRCs(data); proto.PayloadChecksum(crcs) != w.CRC {
			return nil, fmt.Errorf("%w: write payload of chunk %v arrived corrupt", proto.ErrChecksum, w.Chunk)
		}
	}
	ch, err := s.route(w.Chain, w.ChainVer)
	if err != nil {
		return nil, err
	}
	head, ok := ch.Head()
	ts := s.targets[head.ID]
	if !ok || ts == nil {
		return nil, fmt.Errorf("%w: chain %d v%d head is %d (%s)", proto.ErrNotHead, w.Chain, ch.Version, head.ID, head.State)
	}
	if ts.ph() != phaseUpToDate {
		return nil, fmt.Errorf("%w: target %d is not up to date", proto.ErrTargetOffline, ts.ID)
	}
	inf, owner := s.dedup.begin(w.Tag)
	if !owner {
		select {
		case <-inf.done:
			return inf.resp, inf.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	resp, err := s.applyChain(ctx, ts, w.Chain, w.Chunk, update{op: w.Op, off: w.Off, data: data, crcs: crcs, crc: w.CRC}, 0, w.Tag)
	s.dedup.end(w.Tag, inf, resp, err)
	return resp, err
}

// applyChain runs one update on ts and, through forward, on every
// successor, then commits locally: the CRAQ write path. ver 0 means ts is
// the head and assigns the version. It holds the chunk's write slot
// (slot.go) throughout: the updates of one chunk run one at a time on a
// hop, in arrival order, as the core's; no lock is held while the update
// travels, and a queued update whose caller gave up leaves the queue.
func (s *Service) applyChain(ctx context.Context, ts *tstate, chainID proto.ChainID, id proto.ChunkID, u update, ver uint64, tag proto.Tag) (*proto.WriteResp, error) {
	began := time.Now() // the answer's timings (proto.HopLatency)
	c := ts.get(id)
	var patience time.Duration // a client's write waits its turn as long as the client does
	if ver != 0 {
		patience = s.callTimeout() // the predecessor resends after it
	}
	if err := ts.acquire(ctx, id, c, patience); err != nil {
		return nil, err
	}
	defer ts.release(c)
	queued := time.Since(began)
	u.tag = tag
	for ver == 0 {
		// The head's rule (chain.CheckWrite), with the slot held: no other
		// update of the chunk is under way here.
		ts.mu.Lock()
		stale := c.pending
		step := chain.CheckWrite(hasTag(c.committed, tag), stale != nil, hasTag(stale, tag))
		ts.mu.Unlock()
		if step == chain.WriteApply {
			break
		}
		if step == chain.WriteDone {
			// A retry of a write already committed here: it reached us as
			// an update from the previous head (the client retried at us,
			// the new head, while we were forwarding it, so the dedup
			// table did not know it yet). Acknowledged, not applied again.
			return s.chunkResp(ts, c), nil
		}
		// WriteAfterPending, WriteJoin: a pending version left at the head
		// (its writer crashed, gave up or lost the chain) may already be
		// committed further down: it is finished before a new version is
		// built, never reused (if it holds this write, its commit answers
		// it: WriteDone next).
		if err := s.redriveHeld(ctx, ts, chainID, id, c, stale); err != nil {
			return nil, err
		}
	}
	cur := c.commitVer()
	if ver == 0 {
		u.ver = cur + 1
	} else {
		u.ver = ver
		switch chain.CheckUpdate(cur, ver, u.full) { // the core's rule
		case chain.DeltaDone:
			// Already committed here (a retried forward): report our
			// state; the predecessor compares the checksum and, if they
			// differ, sends the whole chunk.
			return s.chunkResp(ts, c), nil
		case chain.DeltaMissing:
			return nil, fmt.Errorf("%w: chunk %v on target %d is at v%d, update is v%d", proto.ErrMissingUpdate, id, ts.ID, cur, ver)
		}
	}
	if ch := s.routing.Load().Chain(chainID); ch != nil {
		u.chainVer = ch.Version
		// Only the replica that will serve the chunk's reads keeps it in
		// its page cache (direct.go).
		u.cache = ch.PreferredReader(id, ts.ID)
	}
	nv, durable, err := ts.prepareAsync(id, c, u)
	if err != nil {
		return nil, err
	}
	ts.working(c, nv.ver)
	// The local fsync runs while the update travels down the chain: the
	// acknowledgement still waits for both.
	synced := make(chan error, 1)
	go func() { synced <- durable() }()
	fwdStart := time.Now()
	err = s.forward(ctx, ts, chainID, id, nv, u, tag)
	fwd := time.Since(fwdStart)
	if serr := <-synced; serr != nil {
		if !errors.Is(serr, proto.ErrNoSpace) {
			s.diskError(ts, serr)
		}
		return nil, serr
	}
	if err != nil {
		if errors.Is(err, proto.ErrNoSpace) || errors.Is(err, proto.ErrBadRequest) {
			// Refused for good further down the chain, before any commit:
			// the update did not happen, so its pending version goes too
			// (each hop drops its own as the error travels back).
			ts.dropPending(id, c)
		}
		return nil, err
	}
	if _, err := ts.commit(id, c); err != nil {
		return nil, err
	}
	resp := s.chunkResp(ts, c)
	resp.Took, resp.Down = int64(time.Since(began)), int64(queued+fwd)
	return resp, nil
}

func (s *Service) chunkResp(ts *tstate, c *chunk) *proto.WriteResp {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	r := &proto.WriteResp{CommitVer: c.commitVer()}
	if c.committed != nil {
		r.Checksum, r.Length = c.committed.checksum(), c.committed.length
	}
	return r
}

// forward sends the pending version nv to ts's current successor and waits
// until it (and everything after it) committed, retrying through routing
// changes for ForwardTimeout. It returns nil at once when ts is the tail.
func (s *Service) forward(ctx context.Context, ts *tstate, chainID proto.ChainID, id proto.ChunkID, nv *version, u update, tag proto.Tag) error {
	deadline := time.Now().Add(s.cfg.ForwardTimeout)
	// The core decides delta or whole, and what each answer means.
	fw := chain.NewForward(nv.ver, uint64(nv.checksum()), !u.full)
	backoff := 5 * time.Millisecond
	var lastErr error
	for attempt := 0; ; attempt++ {
		if hook := testHookForward.Load(); hook != nil {
			(*hook)(ts, id, nv.ver)
		}
		if attempt > 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: forwarding chunk %v v%d from target %d: %v", proto.ErrTargetOffline, id, nv.ver, ts.ID, lastErr)
			}
			select {
			case <-time.After(backoff):
			case <-s.ctx.Done():
				return fmt.Errorf("%w: %s shutting down", proto.ErrTargetOffline, s.cfg.Name)
			}
			backoff = min(backoff*2, 200*time.Millisecond)
		}
		r := s.routing.Load()
		ch := r.Chain(chainID)
		if ch == nil {
			return fmt.Errorf("%w: chain %d vanished", proto.ErrNoChain, chainID)
		}
		me, ok := ch.Target(ts.ID)
		if !ok || (me.State != proto.Serving && me.State != proto.Syncing) || ts.ph() == phaseRestarting {
			return fmt.Errorf("%w: target %d is %s in chain %d v%d", proto.ErrTargetOffline, ts.ID, me.State, chainID, ch.Version)
		}
		if s.fenced.Load() {
			// In-flight replication ends at a fence (mgmtdContact): it
			// must not finish later under a routing that moved on.
			return fmt.Errorf("%w: %s lost contact with mgmtd", proto.ErrTargetOffline, s.cfg.Name)
		}
		hop := fw.Next(ts.ID, ch)
		if hop.Commit {
			return nil // the tail commits first
		}
		succ := hop.To
		req := proto.UpdateReq{
			WriteReq:    proto.WriteReq{Tag: tag, Chain: chainID, ChainVer: ch.Version, Chunk: id, Op: u.op, Off: u.off},
			Target:      succ.ID,
			UpdateVer:   nv.ver,
			FullReplace: hop.Whole,
		}
		data, crc := u.data, u.crc
		if u.crcs == nil && len(data) > 0 {
			crc = proto.PayloadChecksum(proto.PayloadCRCs(data))
		}
		if req.FullReplace {
			req.Tags = nv.tags
		}
		if req.FullReplace && !u.full && u.op != proto.OpRemove {
			// A syncing successor (or one that missed updates, disagreed,
			// or is new since the last send) gets the whole chunk, so it
			// converges whatever it held.
			if data, lastErr = ts.readVersion(id, nv, true); lastErr != nil {
				return lastErr
			}
			crc = proto.PayloadChecksum(nv.crcs)
		}
		if req.Op == proto.OpWrite || req.FullReplace {
			req.CRC = crc
		}
		addr := r.NodeAddr(succ.Node)
		actx, cancel := context.WithTimeout(ctx, s.callTimeout())
		var resp proto.WriteResp
		var conn *transport.Conn
		conn, lastErr = s.pool.Get(actx, addr)
		if lastErr == nil {
			sent := time.Now()
			_, lastErr = conn.Call(actx, proto.MUpdate, req, [][]byte{data}, &resp)
			if errors.Is(lastErr, context.DeadlineExceeded) {
				s.pool.Drop(addr)
			}
			if lastErr == nil {
				s.hops.Sample(s.cfg.Node, succ.Node, time.Since(sent), &resp) // for mgmtd
			}
		}
		cancel()
		switch fw.OnAnswer(answerOf(lastErr, &resp)) {
		case chain.StepCommit:
			return nil
		case chain.StepFail:
			return lastErr
		case chain.StepResend:
			if lastErr == nil {
				lastErr = fmt.Errorf("%w: successor %d answered v%d sum %08x for v%d sum %08x", proto.ErrChecksum, succ.ID, resp.CommitVer, resp.Checksum, nv.ver, nv.checksum())
				if hop.Whole {
					s.logf("forward chunk %v: %v", id, lastErr)
				}
			}
		}
	}
}

// answerOf classifies a successor's answer to an update for
// chain.Forward.OnAnswer: its committed state, a missing update (a delta
// that does not apply there), a refusal for good (no space, a bad
// request), or a failure to try again.
func answerOf(err error, resp *proto.WriteResp) chain.Answer {
	switch {
	case err == nil:
		return chain.Answer{Kind: chain.AnswerOK, Ver: resp.CommitVer, Sum: uint64(resp.Checksum)}
	case errors.Is(err, proto.ErrMissingUpdate):
		return chain.Answer{Kind: chain.AnswerMissing}
	case errors.Is(err, proto.ErrNoSpace) || errors.Is(err, proto.ErrBadRequest):
		return chain.Answer{Kind: chain.AnswerRefused}
	}
	return chain.Answer{Kind: chain.AnswerFailed}
}

// readVersion reads a version's whole content (verified).
func (t *Target) readVersion(id proto.ChunkID, v *version, pending bool) ([]byte, error) {
	if v.removed || v.length == 0 {
		return nil, nil
	}
	p := t.path(id, v.ver, pending)
	f, err := t.vfs.Open(p)
	if err != nil {
		return nil, t.ioErr("open", p, err)
	}
	defer f.Close()
	buf := make([]byte, v.length)
	if n, err := f.ReadAt(buf, HeaderSize); int64(n) < v.length {
		return nil, t.ioErr("read", p, fmt.Errorf("short read %d of %d: %v", n, v.length, err))
	}
	if !equalU32(blockCRCs(buf), v.crcs) {
		return nil, fmt.Errorf("%w: chunk %v v%d on target %d", proto.ErrChecksum, id, v.ver, t.ID)
	}
	return buf, nil
}

func (s *Service) handleUpdate(ctx context.Context, u *proto.UpdateReq, data []byte) (*proto.WriteResp, error) {
	if s.fenced.Load() {
		return nil, fmt.Errorf("%w: %s lost contact with mgmtd", proto.ErrTargetOffline, s.cfg.Name)
	}
	if err := validRange(u.Op, u.Off, len(data)); err != nil {
		return nil, err
	}
	var crcs []uint32
	if u.Op == proto.OpWrite || u.FullReplace {
		if crcs = proto.PayloadCRCs(data); proto.PayloadChecksum(crcs) != u.CRC {
			return nil, fmt.Errorf("%w: update of chunk %v arrived corrupt", proto.ErrChecksum, u.Chunk)
		}
	}
	ts := s.targets[u.Target]
	if ts == nil {
		return nil, fmt.Errorf("%w: %s has no target %d", proto.ErrBadRequest, s.cfg.Name, u.Target)
	}
	ch, err := s.route(u.Chain, u.ChainVer)
	if err != nil {
		return nil, err
	}
	me, _ := ch.Target(ts.ID)
	switch {
	case me.State == proto.Serving && ts.ph() == phaseUpToDate:
	case me.State == proto.Syncing && ts.ph() != phaseRestarting:
	default:
		return nil, fmt.Errorf("%w: target %d is %s (phase %s)", proto.ErrTargetOffline, ts.ID, me.State, ts.ph().local())
	}
	up := update{op: u.Op, off: u.Off, data: data, full: u.FullReplace, crcs: crcs, crc: u.CRC, tags: u.Tags}
	if !u.Commit {
		resp, err := s.applyChain(ctx, ts, u.Chain, u.Chunk, up, u.UpdateVer, u.Tag)
		if err == nil {
			// Remember the client's request here too: if the head dies and
			// this target becomes head, the client's retry is not applied
			// a second time.
			s.dedup.record(u.Tag, resp)
		}
		return resp, err
	}
	// A resync transfer: install this committed version as is, even over
	// a higher one (a version only this replica committed was never
	// acknowledged: the head commits last; the predecessor's data wins).
	c := ts.get(u.Chunk)
	if err := ts.acquire(ctx, u.Chunk, c, s.callTimeout()); err != nil {
		return nil, err
	}
	defer ts.release(c)
	up.ver, up.chainVer, up.full = u.UpdateVer, ch.Version, true
	if _, err := ts.prepare(u.Chunk, c, up); err != nil {
		return nil, err
	}
	if _, err := ts.commit(u.Chunk, c); err != nil {
		return nil, err
	}
	return s.chunkResp(ts, c), nil
}

func (s *Service) handleRead(req *transport.Request, b *proto.BatchReadReq) (any, [][]byte, error) {
	resp := proto.BatchReadResp{Results: make([]proto.ReadResult, len(b.IOs))}
	data := make([][]byte, 0, len(b.IOs))
	// Short-circuit reads only for a client that sees our files at our
	// paths (proto.ReadIO.Local).
	local := !s.cfg.NoLocalReads && b.Host != "" && b.Host == proto.HostID()
	for i, io := range b.IOs {
		buf, release, src, sums, err := s.readOne(&io, local)
		if release != nil {
			req.AfterReply(release)
		}
		if err != nil {
			resp.Results[i].Code, resp.Results[i].Msg = wireCode(err), err.Error()
			continue
		}
		resp.Results[i].N = int64(len(buf))
		if sums != nil {
			b := make([]byte, 4*len(sums))
			for k, c := range sums {
				binary.BigEndian.PutUint32(b[4*k:], c)
			}
			resp.Results[i].Sums = int64(len(b))
			data = append(data, b)
			if local && io.Local && src.f != nil {
				// The client reads the committed (immutable) file itself
				// and checks the bytes against these CRCs.
				if p, err := filepath.Abs(src.f.Name()); err == nil {
					resp.Results[i].Path, resp.Results[i].FileOff, resp.Results[i].Cold = p, src.off, src.cold
					continue
				}
			}
		}
		data = append(data, buf)
		if src.f != nil && len(buf) >= sendfileMin {
			// Verified in the mapping; the socket takes the same bytes
			// from the page cache without a copy.
			req.SendFile(buf, src.f, src.off)
		}
	}
	return resp, data, nil
}

func wireCode(err error) string {
	var w transport.WireCoded
	if errors.As(err, &w) {
		return w.WireCode()
	}
	return proto.ErrIO.WireCode()
}

// readOne serves one read; release (if non-nil) frees the data once the
// reply is written. sums is non-nil when the bytes were not verified here
// but are to be checked by the client against these block CRCs.
func (s *Service) readOne(io *proto.ReadIO, local bool) ([]byte, func(), fileSrc, []uint32, error) {
	var none fileSrc
	if io.Off < 0 || io.Len < 0 || io.Off > proto.MaxChunkSize || io.Len > proto.MaxChunkSize {
		return nil, nil, none, nil, fmt.Errorf("%w: read [%d, +%d)", proto.ErrBadRequest, io.Off, io.Len)
	}
	ts := s.targets[io.Target]
	if ts == nil {
		return nil, nil, none, nil, fmt.Errorf("%w: %s has no target %d", proto.ErrBadRequest, s.cfg.Name, io.Target)
	}
	ch, err := s.route(io.Chain, io.ChainVer)
	if err != nil {
		return nil, nil, none, nil, err
	}
	if me, _ := ch.Target(ts.ID); me.State != proto.Serving || ts.ph() != phaseUpToDate {
		return nil, nil, none, nil, fmt.Errorf("%w: target %d is %s", proto.ErrTargetOffline, ts.ID, me.State)
	}
	// Large client-verified reads skip the check here (see proto.ReadIO.Sums).
	how := verifyHere
	if io.Sums && io.Len >= sendfileMin {
		how = clientSums
		if local && io.Local {
			how = clientLocal
		}
	}
	buf, release, _, src, sums, err := ts.readRefSrc(io.Chunk, io.Off, io.Len, false, how)
	if errors.Is(err, proto.ErrChecksum) {
		s.repair(ts, ch, err)
	}
	return buf, release, src, sums, err
}

// sendfileMin: reply parts at least this large go out with sendfile(2);
// smaller ones are cheaper to copy in the same writev as their header.
const sendfileMin = 64 << 10

// diskError takes a target whose disk failed an fsync out of service (it
// rejoins through resync, as after a restart).
func (s *Service) diskError(ts *tstate, err error) {
	if ts.phase.Swap(int32(phaseRestarting)) != int32(phaseRestarting) {
		s.logf("target %d: disk error, leaving the chain: %v", ts.ID, err)
		s.kickHeartbeat()
	}
}

// repair takes a target with a corrupt chunk out of service so that it
// rejoins through resync, which replaces the chunk from its predecessor.
// A target that is its chain's only serving replica stays (there is no
// good copy to repair from; reads of that chunk keep failing).
func (s *Service) repair(ts *tstate, ch *proto.Chain, cause error) {
	if len(ch.Readable()) < 2 {
		s.logf("target %d: %v; no other serving replica to repair from", ts.ID, cause)
		return
	}
	if ts.phase.CompareAndSwap(int32(phaseUpToDate), int32(phaseRestarting)) {
		s.logf("target %d: %v: leaving the chain to be repaired by resync", ts.ID, cause)
		s.metrics.corrupt.Inc()
		s.kickHeartbeat()
	}
}

func (s *Service) handleSync(method uint16, sr *proto.SyncReq) (any, [][]byte, error) {
	ts := s.targets[sr.Target]
	if ts == nil {
		return nil, nil, fmt.Errorf("%w: %s has no target %d", proto.ErrBadRequest, s.cfg.Name, sr.Target)
	}
	ch, err := s.route(sr.Chain, sr.ChainVer)
	if err != nil {
		return nil, nil, err
	}
	if me, _ := ch.Target(ts.ID); me.State != proto.Syncing || ts.ph() == phaseRestarting {
		return nil, nil, fmt.Errorf("%w: target %d is %s, not syncing", proto.ErrTargetOffline, ts.ID, me.State)
	}
	if method == proto.MSyncStart {
		return proto.SyncStartResp{Chunks: ts.List(0, math.MaxUint64)}, nil, nil
	}
	// The version first: a heartbeat that sees the phase must report it.
	ts.upToDateCV.Store(ch.Version)
	if ts.phase.CompareAndSwap(int32(phaseOnline), int32(phaseUpToDate)) {
		s.logf("target %d: resync of chain %d done (v%d)", ts.ID, sr.Chain, ch.Version)
		s.kickHeartbeat()
	}
	return struct{}{}, nil, nil
}

func (s *Service) handleList(l *proto.ListChunksReq) (any, [][]byte, error) {
	ts := s.targets[l.Target]
	if ts == nil {
		return nil, nil, fmt.Errorf("%w: %s has no target %d", proto.ErrBadRequest, s.cfg.Name, l.Target)
	}
	ch, err := s.route(l.Chain, l.ChainVer)
	if err != nil {
		return nil, nil, err
	}
	if me, _ := ch.Target(ts.ID); me.State != proto.Serving || ts.ph() != phaseUpToDate {
		return nil, nil, fmt.Errorf("%w: target %d is %s", proto.ErrTargetOffline, ts.ID, me.State)
	}
	var out []proto.ChunkMeta
	for _, m := range ts.List(l.Inode, l.Inode) {
		if m.UpdateVer != m.CommitVer {
			return nil, nil, fmt.Errorf("%w: chunk %v", proto.ErrNotCommitted, m.Chunk)
		}
		if m.CommitVer > 0 && m.Length >= 0 {
			out = append(out, m)
		}
	}
	return proto.ListChunksResp{Chunks: out}, nil, nil
}

func (s *Service) handleRemove(ctx context.Context, rr *proto.RemoveReq) (*proto.WriteResp, error) {
	ch, err := s.route(rr.Chain, rr.ChainVer)
	if err != nil {
		return nil, err
	}
	head, ok := ch.Head()
	ts := s.targets[head.ID]
	if !ok || ts == nil || ts.ph() != phaseUpToDate {
		return nil, fmt.Errorf("%w: chain %d v%d", proto.ErrNotHead, rr.Chain, ch.Version)
	}
	for _, m := range ts.List(rr.Inode, rr.Inode) {
		if m.Chunk.Index < rr.FromIndex || (m.Length < 0 && m.UpdateVer == m.CommitVer) {
			continue
		}
		if _, err := s.applyChain(ctx, ts, rr.Chain, m.Chunk, update{op: proto.OpRemove}, 0, proto.Tag{}); err != nil {
			return nil, err
		}
	}
	return &proto.WriteResp{}, nil
}

// ---- background work: resync of syncing successors, stuck pendings ----

func (s *Service) workLoop() {
	defer s.wg.Done()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var syncs sync.WaitGroup
	defer syncs.Wait()
	sc := scrubber{started: time.Now()}
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		r := s.routing.Load()
		if r == nil || s.fenced.Load() {
			continue
		}
		s.dedup.sweep(10 * time.Minute)
		s.scrubStep(&sc, r)
		for _, ts := range s.targets {
			ch := chainOfTarget(r, ts.ID)
			if ch == nil || ts.ph() != phaseUpToDate {
				continue
			}
			if me, _ := ch.Target(ts.ID); me.State != proto.Serving {
				continue
			}
			if succ, ok := ch.Successor(ts.ID); ok && succ.State == proto.Syncing && ts.syncedAt.Load() != ch.Version && ts.syncRunning.CompareAndSwap(false, true) {
				syncs.Add(1)
				go func(ts *tstate, chain proto.Chain, succ proto.ChainTarget) {
					defer syncs.Done()
					defer ts.syncRunning.Store(false)
					err := s.resync(ts, &chain, succ, r)
					if err == nil {
						ts.syncedAt.Store(chain.Version)
					} else if s.ctx.Err() == nil {
						s.logf("resync of target %d from %d (chain %d): %v; will retry", succ.ID, ts.ID, chain.ID, err)
					}
				}(ts, *ch, succ)
			}
			if head, ok := ch.Head(); ok && head.ID == ts.ID {
				s.redrivePending(ts, ch.ID)
			}
		}
	}
}

// scrubber is the state of the background scrub; owned by workLoop.
type scrubber struct {
	started time.Time // when the current (or last) pass began
	queue   []scrubItem
}

type scrubItem struct {
	ts *tstate
	id proto.ChunkID
}

// scrubStep checks the next chunk of the scrub pass (Config.ScrubInterval)
// and starts a new pass when the last one is over and the interval has
// passed.
func (s *Service) scrubStep(sc *scrubber, r *proto.Routing) {
	if s.cfg.ScrubInterval < 0 {
		return
	}
	if len(sc.queue) == 0 {
		if time.Since(sc.started) < s.cfg.ScrubInterval {
			return
		}
		sc.started = time.Now()
		for _, ts := range s.targets {
			for _, m := range ts.List(0, math.MaxUint64) {
				if m.CommitVer > 0 && m.Length > 0 {
					sc.queue = append(sc.queue, scrubItem{ts, m.Chunk})
				}
			}
		}
		return
	}
	it := sc.queue[0]
	sc.queue = sc.queue[1:]
	ch := chainOfTarget(r, it.ts.ID)
	if ch == nil || it.ts.ph() != phaseUpToDate {
		return
	}
	if me, _ := ch.Target(it.ts.ID); me.State != proto.Serving {
		return
	}
	_, release, _, _, _, err := it.ts.readRefSrc(it.id, 0, proto.MaxChunkSize, false, verifyHere)
	if release != nil {
		release()
	}
	if errors.Is(err, proto.ErrChecksum) {
		s.logf("scrub: %v", err)
		s.repair(it.ts, ch, err)
	}
}

// redrivePending finishes updates a crash left pending at the head: the
// version may already be committed further down the chain, so it is sent
// on (as a full replace) and then committed, never dropped.
func (s *Service) redrivePending(ts *tstate, chain proto.ChainID) {
	ts.mu.Lock()
	var stuck []proto.ChunkID
	for id, c := range ts.chunks {
		if c.pending != nil && time.Since(c.pendingSince) > s.cfg.PendingTimeout {
			stuck = append(stuck, id)
		}
	}
	ts.mu.Unlock()
	for _, id := range stuck {
		c := ts.get(id)
		if !ts.tryAcquire(c) {
			continue // an update of the chunk is under way: it finishes the pending version first
		}
		ts.mu.Lock()
		nv := c.pending
		ts.mu.Unlock()
		if nv != nil {
			if err := s.redriveHeld(s.ctx, ts, chain, id, c, nv); err != nil {
				s.logf("re-drive pending chunk %v v%d: %v", id, nv.ver, err)
			}
		}
		ts.release(c)
	}
}

// redriveHeld finishes the pending version nv of a chunk at the head:
// sends it down the chain as a full replace (a successor that committed it
// answers with the same checksum, one that did not installs it) and
// commits it. The caller holds the chunk's write slot.
func (s *Service) redriveHeld(ctx context.Context, ts *tstate, chain proto.ChainID, id proto.ChunkID, c *chunk, nv *version) error {
	u := update{op: proto.OpWrite, full: true, tags: nv.tags}
	if nv.removed {
		u.op = proto.OpRemove
	}
	data, err := ts.readVersion(id, nv, true)
	if err == nil {
		u.data = data
		err = s.forward(ctx, ts, chain, id, nv, u, proto.Tag{})
	}
	if err == nil {
		_, err = ts.commit(id, c)
	}
	if err == nil {
		s.logf("re-drove pending chunk %v v%d to commit", id, nv.ver)
	}
	return err
}

// resync brings the syncing successor succ up to date with ts: it lists
// the successor's chunks and sends every chunk where the two disagree in
// any way (version, pending state, checksum, corruption) as a full,
// committed copy, removes chunks only the successor has, and then tells it
// the sync is done. It never gives up on a mismatch: it copies.
func (s *Service) resync(ts *tstate, ch *proto.Chain, succ proto.ChainTarget, r *proto.Routing) error {
	addr := r.NodeAddr(succ.Node)
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Minute)
	defer cancel()
	conn, err := s.pool.Get(ctx, addr)
	if err != nil {
		return err
	}
	call := func(method uint16, req any, data []byte, resp any) error {
		actx, cancel := context.WithTimeout(ctx, s.callTimeout())
		defer cancel()
		_, err := conn.Call(actx, method, req, [][]byte{data}, resp)
		return err
	}
	sr := proto.SyncReq{Chain: ch.ID, ChainVer: ch.Version, Target: succ.ID}
	var start proto.SyncStartResp
	if err := call(proto.MSyncStart, sr, nil, &start); err != nil {
		return fmt.Errorf("sync start: %w", err)
	}
	remote := map[proto.ChunkID]proto.ChunkMeta{}
	for _, m := range start.Chunks {
		remote[m.Chunk] = m
	}
	s.logf("resync target %d from %d (chain %d v%d): successor holds %d chunks", succ.ID, ts.ID, ch.ID, ch.Version, len(remote))
	sent := 0
	transfer := func(id proto.ChunkID) error {
		if s.fenced.Load() {
			return fmt.Errorf("%w: %s lost contact with mgmtd", proto.ErrTargetOffline, s.cfg.Name)
		}
		c := ts.get(id)
		if err := ts.acquire(ctx, id, c, 0); err != nil {
			return err
		}
		defer ts.release(c)
		ts.mu.Lock()
		cv, pv := c.committed, c.pending
		ts.mu.Unlock()
		if pv != nil {
			// A pending version left here by a crash or a failed writer (we
			// hold the chunk's write slot: no update is in flight) may be an
			// acknowledged write whose commit rename a power loss undid
			// (a returning LASTSRV). Copying the older committed version
			// would roll it back on the successor, which then serves it:
			// the head finishes (re-drives) its pending version first,
			// through the successor too; another hop waits for the head to.
			cur := s.routing.Load().Chain(ch.ID)
			if cur == nil {
				return fmt.Errorf("%w: chain %d vanished", proto.ErrNoChain, ch.ID)
			}
			if h, ok := cur.Head(); !ok || h.ID != ts.ID {
				return fmt.Errorf("chunk %v v%d pending on target %d: waiting for the head to finish it", id, pv.ver, ts.ID)
			}
			if err := s.redriveHeld(ctx, ts, ch.ID, id, c, pv); err != nil {
				return fmt.Errorf("chunk %v: finishing pending v%d before the transfer: %w", id, pv.ver, err)
			}
			ts.mu.Lock()
			cv = c.committed
			ts.mu.Unlock()
		}
		rm, has := remote[id]
		delete(remote, id)
		req := proto.UpdateReq{WriteReq: proto.WriteReq{Chain: ch.ID, ChainVer: ch.Version, Chunk: id},
			Target: succ.ID, FullReplace: true, Commit: true}
		var data []byte
		switch {
		case cv == nil && !has:
			return nil
		case cv == nil:
			// Only the successor has it (never committed here): drop it there.
			req.Op, req.UpdateVer = proto.OpRemove, max(rm.CommitVer, rm.UpdateVer)+1
		default:
			if has && rm.CommitVer == cv.ver && rm.UpdateVer == rm.CommitVer && rm.Checksum == cv.checksum() && !rm.Corrupt {
				return nil
			}
			req.UpdateVer, req.Tags = cv.ver, cv.tags
			if cv.removed {
				req.Op = proto.OpRemove
			} else {
				var err error
				if data, err = ts.readVersion(id, cv, false); err != nil {
					return err
				}
			}
		}
		req.CRC = proto.PayloadChecksum(proto.PayloadCRCs(data))
		var resp proto.WriteResp
		if err := call(proto.MUpdate, req, data, &resp); err != nil {
			return fmt.Errorf("transfer chunk %v: %w", id, err)
		}
		sent++
		return nil
	}
	for _, m := range ts.List(0, math.MaxUint64) {
		if err := transfer(m.Chunk); err != nil {
			return err
		}
	}
	for id := range remote {
		if err := transfer(id); err != nil {
			return err
		}
	}
	if err := call(proto.MSyncDone, sr, nil, nil); err != nil {
		return fmt.Errorf("sync done: %w", err)
	}
	s.metrics.resyncChunks.Add(float64(sent))
	s.logf("resync target %d from %d (chain %d): done, %d chunks sent", succ.ID, ts.ID, ch.ID, sent)
	return nil
}

// ---- request dedup (write retries are applied once) ----

type inflight struct {
	done chan struct{}
	resp *proto.WriteResp
	err  error
	at   time.Time
}

type dedup struct {
	mu sync.Mutex
	m  map[proto.Tag]*inflight // guarded by mu
}

// begin registers tag; owner=false means another call with the same tag
// runs or ran: wait on its done channel for its result.
func (d *dedup) begin(tag proto.Tag) (*inflight, bool) {
	if tag.Client == 0 {
		return &inflight{done: make(chan struct{})}, true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.m[tag]; f != nil {
		return f, false
	}
	f := &inflight{done: make(chan struct{})}
	d.m[tag] = f
	return f, true
}

// end publishes the result. Retryable failures are forgotten, so a retry
// runs again; success and permanent failures are remembered.
func (d *dedup) end(tag proto.Tag, f *inflight, resp *proto.WriteResp, err error) {
	f.resp, f.err, f.at = resp, err, time.Now()
	close(f.done)
	if tag.Client == 0 {
		return
	}
	if err != nil && proto.Retryable(err) {
		d.mu.Lock()
		delete(d.m, tag)
		d.mu.Unlock()
	}
}

// record remembers a successful result for tag (a forwarded update).
func (d *dedup) record(tag proto.Tag, resp *proto.WriteResp) {
	if tag.Client == 0 {
		return
	}
	f := &inflight{done: make(chan struct{}), resp: resp, at: time.Now()}
	close(f.done)
	d.mu.Lock()
	if _, ok := d.m[tag]; !ok {
		d.m[tag] = f
	}
	d.mu.Unlock()
}

func (d *dedup) sweep(age time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, f := range d.m {
		select {
		case <-f.done: // f.at is set before done closes
			if time.Since(f.at) > age {
				delete(d.m, k)
			}
		default:
		}
	}
}
