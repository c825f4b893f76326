package chain

import (
	"slices"

	"github.com/ffkit/ffkit/fs/proto"
)

// Bugs are deliberate protocol bugs, switched on only by the simulator's
// mutation tests to prove that it catches each. All false in real use.
type Bugs struct {
	AckBeforeTail           bool // commit and acknowledge before the successor committed
	SkipVersionCheck        bool // apply a delta update whatever the local version
	ServePending            bool // a read returns a pending version
	NoDedupAcrossHead       bool // hops other than the head forget request ids
	RejoinNeedsNewerRouting bool // phases move only when a newer routing arrives
	ServeBeforeResyncEnds   bool // a syncing target is up to date as soon as its resync starts
	AcceptStaleSender       bool // accept any update: a stale copy, another chain version, a non-predecessor
	NoFence                 bool // keep serving when mgmtd has not answered for half the fail timeout
	RepairByLeaving         bool // the old repair: leave the chain (if another replica serves) instead of fetching a peer's copy
	StaleResyncHolds        bool // an "uptodate" report counts whatever chain version its resync ended under (sim's mgmtd and the replica)
}

// Config configures a Replica. Times are in the driver's clock units.
type Config struct {
	ID                proto.TargetID
	FailTimeout       int64 // mgmtd declares a silent target dead after it; fence at half
	HeartbeatInterval int64
	RetryInterval     int64 // resend an unanswered update, sync start or sync done after it
	// ScrubInterval: every so often the target checks every committed
	// chunk against its checksum and repairs a corrupt one from a peer
	// (a rotten copy that no read, write or resync touches would else
	// stay). 0: no scrub.
	ScrubInterval int64
	Bugs          Bugs
}

// DiskChunk is a chunk as the chunk store holds it after a restart.
type DiskChunk struct {
	Committed Version
	Pending   *Version
}

type waiter struct {
	client Addr
	req    Req
	// earlier: the request made an earlier version in the pending one's
	// history, not the pending one: its answer names no version (0).
	earlier bool
}

type upstream struct {
	from Addr
	seq  uint64
}

type flight struct {
	msg    Msg
	sentAt int64
}

type chunkState struct {
	committed Version
	pending   *Version
	delta     uint64    // pending's delta on committed, when fw.Delta
	fw        Forward   // the forwarding of pending to the successor (hop.go)
	clients   []waiter  // head: acknowledged when pending commits
	up        *upstream // non-head: acknowledged when pending commits
	inflight  *flight   // the one update or transfer awaiting the successor's ack
	queue     []Msg     // head: client writes waiting for pending to commit
	fetchAt   int64     // when a peer's copy was last asked for (repair)
	lastSeq   map[Addr]uint64
}

type resync struct {
	chainVer uint64
	succ     proto.TargetID
	sentAt   int64
	listed   bool
	done     bool
	metas    map[uint64]Meta
	plan     map[uint64]bool
}

// Replica is one target's replication state: the CRAQ protocol of
// fs/storage as a pure state machine. Step feeds it a message (the
// driver's clock rides on every message); Ready returns what to persist
// and send. No I/O, clocks, goroutines or locks: one goroutine owns it.
type Replica struct {
	cfg     Config
	phase   Phase
	routing *proto.Routing
	lastHB  int64 // send time of the newest answered heartbeat
	hbSent  int64
	scrubAt int64 // when the last scrub ran
	now     int64
	fenced  bool
	// syncedCV is the chain version under which the target last became
	// up to date (a resync ended, or mgmtd promoted it); heartbeats carry
	// it so mgmtd can tell a stale report (ResyncHolds).
	syncedCV uint64
	chunks   map[uint64]*chunkState
	ids      []uint64 // the keys of chunks, sorted (chunks are never forgotten)
	seq      uint64
	sync     *resync
	ready    Ready
}

// Ready is what a Replica asks of its driver: apply Persist in order (a
// PersistPending durably) before sending Msgs.
type Ready struct {
	Persist []Persist
	Msgs    []Msg
}

// MaxReqs bounds the request ids remembered per chunk.
const MaxReqs = 16

// New restores a target from its chunk store. incarnation must grow on
// every restart (the driver keeps it durably): sequence numbers of an
// earlier life never pass for new ones. A new replica is restarting.
func New(cfg Config, disk map[uint64]DiskChunk, incarnation uint64, now int64) *Replica {
	r := &Replica{cfg: cfg, chunks: map[uint64]*chunkState{}, seq: incarnation << 32, now: now, lastHB: now, fenced: true}
	for id, d := range disk {
		c := r.chunk(id)
		c.committed = d.Committed
		if d.Pending != nil && d.Pending.Ver > d.Committed.Ver {
			p := *d.Pending
			c.pending = &p
		}
	}
	return r
}

// Phase returns the target's phase.
func (r *Replica) Phase() Phase { return r.phase }

// Fenced tells whether the target refuses requests (mgmtd silent).
func (r *Replica) Fenced() bool { return r.fenced }

// Routing returns the routing the replica holds (nil before the first).
func (r *Replica) Routing() *proto.Routing { return r.routing }

// Chunk returns a chunk's committed and pending versions.
func (r *Replica) Chunk(id uint64) (Version, *Version) {
	c := r.chunks[id]
	if c == nil {
		return Version{}, nil
	}
	return c.committed, c.pending
}

// Chunks lists the chunk ids the replica knows, sorted.
func (r *Replica) Chunks() []uint64 { return slices.Clone(r.ids) }

// Corrupt flips bits of a committed content, as a failing disk would (the
// driver calls it where its store was corrupted).
func (r *Replica) Corrupt(id uint64, mask uint64) {
	if c := r.chunks[id]; c != nil && c.committed.Ver > 0 {
		c.committed.Val ^= mask
	}
}

// Readable tells whether the replica would answer reads now.
func (r *Replica) Readable() bool {
	me, _ := r.me()
	return !r.fenced && r.phase == UpToDate && me.State == proto.Serving
}

// Ready returns and clears the pending actions.
func (r *Replica) Ready() Ready {
	out := r.ready
	r.ready = Ready{}
	return out
}

func (r *Replica) send(m Msg) {
	m.From, m.Now = Addr(r.cfg.ID), r.now
	r.ready.Msgs = append(r.ready.Msgs, m)
}

func (r *Replica) persist(p Persist) { r.ready.Persist = append(r.ready.Persist, p) }

func (r *Replica) chunk(id uint64) *chunkState {
	c := r.chunks[id]
	if c == nil {
		c = &chunkState{lastSeq: map[Addr]uint64{}}
		r.chunks[id] = c
		i, _ := slices.BinarySearch(r.ids, id)
		r.ids = slices.Insert(r.ids, i, id)
	}
	return c
}

func (r *Replica) chain() *proto.Chain {
	if r.routing == nil {
		return nil
	}
	for i := range r.routing.Chains {
		if _, ok := r.routing.Chains[i].Target(r.cfg.ID); ok {
			return &r.routing.Chains[i]
		}
	}
	return nil
}

func (r *Replica) me() (proto.ChainTarget, *proto.Chain) {
	ch := r.chain()
	if ch == nil {
		return proto.ChainTarget{}, nil
	}
	t, _ := ch.Target(r.cfg.ID)
	return t, ch
}

// inChain tells whether the target takes part in its chain's writes.
func (r *Replica) inChain() bool {
	if r.fenced {
		return false
	}
	me, ch := r.me()
	if ch == nil {
		return false
	}
	return (me.State == proto.Serving && r.phase == UpToDate) || (me.State == proto.Syncing && r.phase != Restarting)
}

func (r *Replica) isHead() bool {
	me, ch := r.me()
	if ch == nil || r.fenced || r.phase != UpToDate || me.State != proto.Serving {
		return false
	}
	h, ok := ch.Head()
	return ok && h.ID == r.cfg.ID
}

// leave puts the target back in the restarting phase: it drops every
// in-flight action (pending versions stay on disk).
func (r *Replica) leave() {
	r.phase = Restarting
	r.sync = nil
	for _, c := range r.chunks {
		c.inflight, c.up, c.clients, c.queue = nil, nil, nil, nil
		c.fw.Whole, c.fw.ChainVer = false, 0
	}
}

// Step applies one message.
func (r *Replica) Step(m Msg) {
	if m.Now > r.now {
		r.now = m.Now
	}
	if !r.cfg.Bugs.NoFence && !r.fenced && r.now-r.lastHB > r.cfg.FailTimeout/2 {
		// mgmtd may already be declaring us dead: never serve stale data.
		r.fenced = true
		r.leave()
	}
	switch m.Type {
	case MsgTick:
		r.tick()
	case MsgRouting:
		r.onRouting(m)
	case MsgWrite:
		r.onWrite(m)
	case MsgRead:
		r.onRead(m)
	case MsgUpdate:
		r.onUpdate(m)
	case MsgAck:
		r.onAck(m)
	case MsgSyncStart, MsgSyncDone:
		r.onSyncMsg(m)
	case MsgSyncList:
		r.onSyncList(m)
	case MsgFetch:
		r.onFetch(m)
	case MsgFetchResp:
		r.onFetchResp(m)
	}
}

func (r *Replica) tick() {
	if r.now-r.hbSent >= r.cfg.HeartbeatInterval {
		r.hbSent = r.now
		var known uint64
		if r.routing != nil {
			known = r.routing.Version
		}
		hb := Msg{Type: MsgHeartbeat, To: MgmtdAddr, Local: r.phase.Local(), Known: known}
		if r.phase == UpToDate {
			hb.ChainVer = r.syncedCV
		}
		r.send(hb)
	}
	if r.cfg.ScrubInterval > 0 && r.now-r.scrubAt >= r.cfg.ScrubInterval {
		r.scrubAt = r.now
		r.scrub()
	}
	if !r.inChain() {
		return
	}
	me, ch := r.me()
	for _, id := range r.ids {
		c := r.chunks[id]
		switch {
		case c.inflight != nil && (c.inflight.msg.ChainVer != ch.Version || r.now-c.inflight.sentAt >= r.cfg.RetryInterval):
			if c.pending != nil {
				r.forward(id, c) // whole if the chain changed (Forward.Next)
			} else {
				c.inflight = nil // a transfer: the resync plan resends it
			}
		case c.pending != nil && c.inflight == nil && r.isHead():
			// Left pending by a crash or a lost chain: it may be committed
			// further down, so it is finished (sent whole), never dropped.
			c.fw.Resend()
			r.forward(id, c)
		case c.pending == nil && len(c.queue) > 0 && r.isHead():
			r.startQueued(id, c)
		}
	}
	if me.State == proto.Serving && r.phase == UpToDate {
		r.resyncTick(ch)
	}
}

func (r *Replica) onRouting(m Msg) {
	if m.SentAt >= r.lastHB {
		r.lastHB = m.SentAt
		if r.fenced && r.now-r.lastHB <= r.cfg.FailTimeout/2 {
			r.fenced = false
		}
	}
	newer := m.Routing != nil && (r.routing == nil || m.Routing.Version > r.routing.Version)
	if newer {
		r.routing = m.Routing
	}
	if r.routing == nil || (!newer && r.cfg.Bugs.RejoinNeedsNewerRouting) {
		return
	}
	me, ch := r.me()
	next := NextPhase(r.phase, me.State, ch != nil)
	if next == Restarting && r.phase != Restarting {
		r.leave()
	}
	if next == UpToDate && r.phase != UpToDate {
		r.syncedCV = ch.Version // promoted
	}
	r.phase = next
	if r.phase == UpToDate && ch != nil && !r.cfg.Bugs.StaleResyncHolds && !ResyncHolds(me.State, ch.Version, r.syncedCV) {
		// Syncing again under a newer chain version than our resync
		// ended in: we may have missed writes in between; wait for the
		// resync under this version.
		r.phase = Online
	}
	if r.sync != nil && (ch == nil || r.sync.chainVer != ch.Version) {
		r.sync = nil
	}
}

func (r *Replica) reply(m Msg, resp Msg) {
	resp.To, resp.Req, resp.Chunk = m.From, m.Req, m.Chunk
	r.send(resp)
}

func hasReq(reqs []Req, q Req) bool { return slices.Contains(reqs, q) }

func appendReq(reqs []Req, q Req) []Req {
	out := append(slices.Clone(reqs), q)
	if len(out) > MaxReqs {
		out = out[len(out)-MaxReqs:]
	}
	return out
}

func (r *Replica) onWrite(m Msg) {
	if !r.isHead() {
		r.reply(m, Msg{Type: MsgWriteResp, Err: "not head"})
		return
	}
	c := r.chunk(m.Chunk)
	switch CheckWrite(hasReq(c.committed.Reqs, m.Req), c.pending != nil, c.pending != nil && hasReq(c.pending.Reqs, m.Req)) {
	case WriteDone:
		r.reply(m, Msg{Type: MsgWriteResp}) // a retry of a done write (Ver 0: applied at some earlier version)
		return
	case WriteJoin:
		// Answered when the pending version commits: it holds the write.
		// If an earlier version made it (a new head holds the newer
		// pending version, not that one), the answer names no version.
		c.clients = append(c.clients, waiter{m.From, m.Req, c.pending.Reqs[len(c.pending.Reqs)-1] != m.Req})
		return
	}
	// WriteApply, or WriteAfterPending: queued; the first queued write is
	// built when no version is pending.
	for _, q := range c.queue {
		if q.Req == m.Req {
			return
		}
	}
	c.queue = append(c.queue, m)
	if c.pending == nil && len(c.queue) == 1 {
		r.startQueued(m.Chunk, c)
	}
}

// startQueued builds the next version from the first queued write.
func (r *Replica) startQueued(id uint64, c *chunkState) {
	m := c.queue[0]
	c.queue = c.queue[1:]
	if c.committed.Corrupt() {
		r.repair(id)
		r.reply(m, Msg{Type: MsgWriteResp, Err: "corrupt"})
		return
	}
	nv := Version{Ver: c.committed.Ver + 1, Val: Mix(c.committed.Val, m.Delta), Reqs: appendReq(c.committed.Reqs, m.Req)}
	nv.Sum = Checksum(nv.Val)
	c.pending, c.delta, c.fw = &nv, m.Delta, NewForward(nv.Ver, nv.Val, true)
	c.clients = []waiter{{client: m.From, req: m.Req}}
	r.persist(Persist{Kind: PersistPending, Chunk: id, Version: nv})
	r.forward(id, c)
}

// forward sends the pending version to the successor, or commits it at
// the tail (the tail commits first).
func (r *Replica) forward(id uint64, c *chunkState) {
	if c.pending.Corrupt() {
		// A pending version whose bytes rotted (its commit rename was
		// undone by a crash): never sent on or committed; repaired from a
		// peer's copy first.
		c.inflight = nil
		r.repair(id)
		return
	}
	_, ch := r.me()
	c.fw.Ver, c.fw.Sum = c.pending.Ver, c.pending.Val // the content is its own checksum here
	hop := c.fw.Next(r.cfg.ID, ch)
	if hop.Commit {
		r.commit(id, c)
		return
	}
	r.seq++
	u := Msg{Type: MsgUpdate, To: Addr(hop.To.ID), ChainVer: ch.Version, Seq: r.seq, Chunk: id, Ver: c.pending.Ver, Reqs: c.pending.Reqs}
	if hop.Whole {
		u.Full, u.Val = true, c.pending.Val
	} else {
		u.Delta = c.delta
	}
	c.inflight = &flight{msg: u, sentAt: r.now}
	r.send(u)
	if r.cfg.Bugs.AckBeforeTail {
		r.commit(id, c)
	}
}

func (r *Replica) commit(id uint64, c *chunkState) {
	if c.pending == nil {
		return
	}
	c.committed, c.pending, c.inflight, c.fw = *c.pending, nil, nil, Forward{}
	r.persist(Persist{Kind: PersistCommit, Chunk: id})
	for _, w := range c.clients {
		if w.earlier {
			r.send(Msg{Type: MsgWriteResp, To: w.client, Req: w.req, Chunk: id})
			continue
		}
		r.send(Msg{Type: MsgWriteResp, To: w.client, Req: w.req, Chunk: id, Ver: c.committed.Ver, Val: c.committed.Val})
	}
	c.clients = nil
	if c.up != nil {
		_, ch := r.me()
		r.send(Msg{Type: MsgAck, To: c.up.from, Seq: c.up.seq, ChainVer: ch.Version, Chunk: id, Ver: c.committed.Ver, Val: c.committed.Val})
		c.up = nil
	}
	if len(c.queue) > 0 && r.isHead() {
		r.startQueued(id, c)
	}
}

func (r *Replica) onUpdate(m Msg) {
	me, ch := r.me()
	if !r.inChain() || (!r.cfg.Bugs.AcceptStaleSender && m.ChainVer != ch.Version) {
		return // the sender retries under the routing it will learn
	}
	if pred, ok := ch.Predecessor(me.ID); !r.cfg.Bugs.AcceptStaleSender && (!ok || Addr(pred.ID) != m.From) {
		return
	}
	c := r.chunk(m.Chunk)
	ack := func(err string) {
		r.send(Msg{Type: MsgAck, To: m.From, Seq: m.Seq, ChainVer: ch.Version, Chunk: m.Chunk, Ver: c.committed.Ver, Val: c.committed.Val, Err: err})
	}
	switch last := c.lastSeq[m.From]; {
	case r.cfg.Bugs.AcceptStaleSender:
	case m.Seq < last:
		return // a stale copy
	case m.Seq == last:
		if c.up == nil || c.up.seq != m.Seq {
			ack("") // a duplicate of one done: answer again
		}
		return
	}
	c.lastSeq[m.From] = m.Seq
	reqs := m.Reqs
	if r.cfg.Bugs.NoDedupAcrossHead {
		reqs = nil
	}
	if m.Install {
		// A resync transfer: install the predecessor's committed version
		// as is, even over a higher one (never acknowledged: the head
		// commits last); the predecessor's data wins.
		v := Version{Ver: m.Ver, Val: m.Val, Sum: Checksum(m.Val), Reqs: reqs}
		c.pending, c.inflight, c.up, c.clients, c.fw = &v, nil, nil, nil, Forward{}
		r.persist(Persist{Kind: PersistPending, Chunk: m.Chunk, Version: v})
		r.commit(m.Chunk, c)
		ack("")
		return
	}
	if c.pending != nil && c.pending.Ver == m.Ver && (!m.Full || c.pending.Val == m.Val) && c.inflight != nil {
		c.up = &upstream{m.From, m.Seq} // a resend of what we are forwarding
		return
	}
	check := CheckUpdate(c.committed.Ver, m.Ver, m.Full)
	if r.cfg.Bugs.SkipVersionCheck {
		check = DeltaApply
	}
	var nv Version
	switch {
	case m.Full:
		nv = Version{Ver: m.Ver, Val: m.Val}
	case check == DeltaDone:
		ack("") // committed here already: the predecessor compares
		return
	case check == DeltaMissing:
		ack("missing update")
		return
	case c.committed.Corrupt():
		ack("corrupt")
		return
	default:
		nv = Version{Ver: m.Ver, Val: Mix(c.committed.Val, m.Delta)}
	}
	nv.Sum, nv.Reqs = Checksum(nv.Val), reqs
	c.pending, c.up, c.clients, c.inflight = &nv, &upstream{m.From, m.Seq}, nil, nil
	c.delta, c.fw = m.Delta, NewForward(nv.Ver, nv.Val, !m.Full)
	r.persist(Persist{Kind: PersistPending, Chunk: m.Chunk, Version: nv})
	r.forward(m.Chunk, c)
}

func (r *Replica) onAck(m Msg) {
	c := r.chunks[m.Chunk]
	if c == nil || c.inflight == nil || c.inflight.msg.Seq != m.Seq || !r.inChain() {
		return // stale
	}
	if s := r.sync; s != nil && s.succ == proto.TargetID(m.From) && m.Err == "" {
		s.metas[m.Chunk] = Meta{Chunk: m.Chunk, Ver: m.Ver, Val: m.Val}
	}
	if c.inflight.msg.Install {
		c.inflight = nil
		return
	}
	if c.pending == nil {
		return
	}
	c.fw.Ver, c.fw.Sum = c.pending.Ver, c.pending.Val
	switch c.fw.OnAnswer(answerOf(m)) {
	case StepCommit:
		r.commit(m.Chunk, c)
	case StepResend:
		r.forward(m.Chunk, c)
	}
}

// answerOf classifies an acknowledgement for Forward.OnAnswer.
func answerOf(m Msg) Answer {
	switch m.Err {
	case "":
		return Answer{Kind: AnswerOK, Ver: m.Ver, Sum: m.Val}
	case "missing update":
		return Answer{Kind: AnswerMissing}
	case "corrupt":
		return Answer{Kind: AnswerCorrupt}
	}
	return Answer{Kind: AnswerFailed}
}

func (r *Replica) onRead(m Msg) {
	if !r.Readable() {
		r.reply(m, Msg{Type: MsgReadResp, Err: "offline"})
		return
	}
	c := r.chunks[m.Chunk]
	if c == nil {
		r.reply(m, Msg{Type: MsgReadResp})
		return
	}
	v := c.committed
	if c.pending != nil {
		if !r.cfg.Bugs.ServePending {
			r.reply(m, Msg{Type: MsgReadResp, Err: "not committed"})
			return
		}
		v = *c.pending
	}
	if v.Corrupt() {
		r.repair(m.Chunk)
		r.reply(m, Msg{Type: MsgReadResp, Err: "corrupt"})
		return
	}
	r.reply(m, Msg{Type: MsgReadResp, Ver: v.Ver, Val: v.Val})
}

// repair fixes a corrupt chunk in place from a peer's copy: it asks every
// other target of the chain (whatever its state: the copy is checked
// against this target's own checksum, so only the very bytes it lost are
// accepted) for the same version. The target stays in its chain: leaving
// it would let mgmtd promote a stale peer as the last serving one while
// this target holds the newest data of every other chunk. Reads of the
// chunk fail over to other replicas until the copy arrives.
func (r *Replica) repair(id uint64) {
	c := r.chunks[id]
	_, ch := r.me()
	if c == nil || ch == nil || r.now-c.fetchAt < r.cfg.RetryInterval && c.fetchAt != 0 {
		return
	}
	v := c.committed
	if c.pending != nil && c.pending.Corrupt() {
		v = *c.pending
	}
	if !v.Corrupt() {
		return
	}
	if r.cfg.Bugs.RepairByLeaving {
		if len(ch.Readable()) >= 2 {
			r.leave()
		}
		return
	}
	c.fetchAt = r.now
	for _, t := range ch.Targets {
		if t.ID != r.cfg.ID {
			r.send(Msg{Type: MsgFetch, To: Addr(t.ID), Chunk: id, Ver: v.Ver})
		}
	}
}

// scrub repairs every committed chunk whose content fails its checksum
// (a pending one is repaired before it is sent on or committed).
func (r *Replica) scrub() {
	if r.chain() == nil {
		return
	}
	for _, id := range r.ids {
		if c := r.chunks[id]; c.pending == nil && c.committed.Corrupt() {
			r.repair(id)
		}
	}
}

func (r *Replica) onFetch(m Msg) {
	c := r.chunks[m.Chunk]
	switch {
	case c == nil:
	case c.committed.Ver == m.Ver && !c.committed.Corrupt():
		r.reply(m, Msg{Type: MsgFetchResp, Ver: m.Ver, Val: c.committed.Val})
		return
	case c.pending != nil && c.pending.Ver == m.Ver && !c.pending.Corrupt():
		r.reply(m, Msg{Type: MsgFetchResp, Ver: m.Ver, Val: c.pending.Val})
		return
	}
	r.reply(m, Msg{Type: MsgFetchResp, Ver: m.Ver, Err: "no such version"})
}

func (r *Replica) onFetchResp(m Msg) {
	c := r.chunks[m.Chunk]
	if c == nil || m.Err != "" {
		return
	}
	fix := func(v *Version) bool {
		return v.Ver == m.Ver && v.Corrupt() && Checksum(m.Val) == v.Sum
	}
	switch {
	case c.pending != nil && fix(c.pending):
		v := *c.pending
		v.Val = m.Val
		c.pending = &v
		r.persist(Persist{Kind: PersistPending, Chunk: m.Chunk, Version: v})
	case c.pending == nil && fix(&c.committed):
		v := c.committed
		v.Val = m.Val
		c.pending = &v
		r.persist(Persist{Kind: PersistPending, Chunk: m.Chunk, Version: v})
		c.committed, c.pending = v, nil
		r.persist(Persist{Kind: PersistCommit, Chunk: m.Chunk})
	}
}

// ---- resync of a syncing successor ----

func (r *Replica) resyncTick(ch *proto.Chain) {
	succ, ok := ch.Successor(r.cfg.ID)
	if !ok || succ.State != proto.Syncing {
		r.sync = nil
		return
	}
	s := r.sync
	if s == nil || s.chainVer != ch.Version || s.succ != succ.ID {
		s = &resync{chainVer: ch.Version, succ: succ.ID, metas: map[uint64]Meta{}, plan: map[uint64]bool{}}
		r.sync = s
		s.sentAt = r.now
		r.send(Msg{Type: MsgSyncStart, To: Addr(succ.ID), ChainVer: ch.Version})
		return
	}
	if !s.listed {
		if r.now-s.sentAt >= r.cfg.RetryInterval {
			s.sentAt = r.now
			r.send(Msg{Type: MsgSyncStart, To: Addr(succ.ID), ChainVer: ch.Version})
		}
		return
	}
	r.resyncProgress(ch)
}

func (r *Replica) onSyncList(m Msg) {
	s := r.sync
	if s == nil || s.listed || Addr(s.succ) != m.From || s.chainVer != m.ChainVer {
		return
	}
	s.listed = true
	for _, mt := range m.Metas {
		s.metas[mt.Chunk] = mt
		s.plan[mt.Chunk] = true
	}
	for id := range r.chunks {
		s.plan[id] = true
	}
	_, ch := r.me()
	r.resyncProgress(ch)
}

// resyncProgress sends every chunk where the successor differs in any way
// (version, content, pending state, corruption) as a committed copy, one
// at a time per chunk, and ends the resync when all agree.
func (r *Replica) resyncProgress(ch *proto.Chain) {
	s := r.sync
	ids := make([]uint64, 0, len(s.plan))
	for id := range s.plan {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c := r.chunk(id)
		if c.pending != nil || c.inflight != nil {
			continue // an update or transfer is on its way: wait for its ack
		}
		if c.committed.Corrupt() {
			r.repair(id) // from the successor's or another peer's copy
			continue
		}
		mt, has := s.metas[id]
		same := has && mt.Ver == c.committed.Ver && Checksum(mt.Val) == c.committed.Sum && !mt.Pending && !mt.Corrupt
		if !has && c.committed.Ver == 0 {
			same = true
		}
		if same {
			delete(s.plan, id)
			continue
		}
		r.seq++
		u := Msg{Type: MsgUpdate, To: Addr(s.succ), ChainVer: ch.Version, Seq: r.seq, Chunk: id,
			Ver: c.committed.Ver, Val: c.committed.Val, Reqs: c.committed.Reqs, Full: true, Install: true}
		c.inflight = &flight{msg: u, sentAt: r.now}
		r.send(u)
	}
	if len(s.plan) == 0 && (!s.done || r.now-s.sentAt >= r.cfg.RetryInterval) {
		s.done, s.sentAt = true, r.now
		r.send(Msg{Type: MsgSyncDone, To: Addr(s.succ), ChainVer: ch.Version})
	}
}

func (r *Replica) onSyncMsg(m Msg) {
	me, ch := r.me()
	if ch == nil || r.fenced || me.State != proto.Syncing || r.phase == Restarting || m.ChainVer != ch.Version {
		return
	}
	if pred, ok := ch.Predecessor(me.ID); !ok || Addr(pred.ID) != m.From {
		return
	}
	if m.Type == MsgSyncDone || r.cfg.Bugs.ServeBeforeResyncEnds {
		r.phase, r.syncedCV = UpToDate, m.ChainVer
	}
	if m.Type == MsgSyncStart {
		var metas []Meta
		for _, id := range r.ids {
			c := r.chunks[id]
			metas = append(metas, Meta{Chunk: id, Ver: c.committed.Ver, Val: c.committed.Val, Pending: c.pending != nil, Corrupt: c.committed.Corrupt()})
		}
		r.send(Msg{Type: MsgSyncList, To: m.From, ChainVer: ch.Version, Metas: metas})
	}
}

// Bootstrap is a target of a new chain: empty and up to date under r
// (nothing to resync), as targets are when a cluster is created.
func Bootstrap(cfg Config, r *proto.Routing, now int64) *Replica {
	rep := New(cfg, nil, 0, now)
	rep.routing, rep.phase, rep.fenced = r, UpToDate, false
	if ch := rep.chain(); ch != nil {
		rep.syncedCV = ch.Version
	}
	return rep
}
