// Package sim is a deterministic simulator of the storage replication
// protocol (package chain): several replicas of one chain, a model of
// mgmtd that decides the routing with mgmtd's own pure functions, and
// clients, all driven from one goroutine by a seeded scheduler. It
// delivers, delays, drops, duplicates and reorders messages; kills
// replicas (losing unsynced commits by the crash file system's rules) and
// restarts them; pauses them (SIGSTOP); partitions them from mgmtd and
// from each other; flips bits of stored chunks; and advances a fake clock.
// Invariants are checked after every step, convergence once faults stop,
// and linearizability of the clients' history per chunk (porcupine) at
// the end. A run is a pure function of its seed and options.
package sim

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage/chain"
)

// Options configure a run. Zero values take the defaults.
type Options struct {
	Seed  uint64
	Bugs  chain.Bugs // mutation tests only
	Trace bool       // record a readable trace of every step
	// BitFlips: flip one bit of one stored chunk in some runs.
	BitFlips bool
	noScrub  bool // tests: replicas do not scrub
}

// ErrCheckUnknown: the linearizability check did not finish within its
// bound; the history is neither accepted nor shown to break.
var ErrCheckUnknown = errors.New("sim: linearizability unknown (the check did not finish)")

// checkBound bounds the linearizability check of one run.
const checkBound = 2 * time.Minute

// Result is a run's outcome.
type Result struct {
	Err   error    // the first invariant broken, nil if none
	Trace []string // every step, with Options.Trace
	Steps int
	Acked int // acknowledged writes
	Fault int // faults injected
	Stale int // stale "uptodate" reports mgmtd ignored (chain.ResyncHolds)
}

const (
	nTargets    = 3
	nChunks     = 2
	nClients    = 3
	failTimeout = 40
	hbInterval  = 5
	retry       = 12
	scrubEvery  = 100
	faultUntil  = 500  // faults stop at this time
	quietBound  = 1500 // everything converges by then
	clientWait  = 30   // a client resends after this long
	clientTries = 8
	opsPerCli   = 12
)

type disk struct {
	chunks map[uint64]chain.DiskChunk
	// undo: commits not yet durable, by chunk: the committed version a
	// crash may bring back (the renamed version then returns pending).
	undo        map[uint64]chain.Version
	incarnation uint64
}

type node struct {
	id     proto.TargetID
	rep    *chain.Replica // nil while crashed
	disk   *disk
	paused bool
	downAt int64
	was    [nChunks]uint64 // by chunk: version held when last checked readable
	wasSet bool
}

type envelope struct {
	m  chain.Msg
	at int64 // deliverable from
}

type op struct {
	write   bool
	chunk   uint64
	delta   uint64
	req     chain.Req
	call    int64
	tries   int
	sentAt  int64
	to      chain.Addr
	retryAt int64
}

type client struct {
	addr chain.Addr
	cur  *op
	left int
}

type hist struct {
	in   input
	out  output
	call int64
	ret  int64
	cli  int
}

type input struct {
	write bool
	chunk uint64
	delta uint64
}

// output: a read's (or an acknowledged write's) version and content. A
// write answered by dedup (the retry of a write applied earlier) carries
// no version (ver 0): it may have taken effect at any version.
type output struct {
	ver     uint64
	val     uint64
	unknown bool
}

type world struct {
	opt       Options
	rng       *rand.Rand
	now       int64
	events    int64
	nodes     []*node
	net       []envelope
	routing   *proto.Routing
	mgLast    map[proto.TargetID]int64
	mgSent    map[proto.TargetID]int64 // send time of the newest heartbeat heard
	decided   uint64                   // routing version Decide last ran on
	checked   uint64                   // routing version CheckChain last passed
	lastLocal map[proto.TargetID]proto.LocalState
	mgLocal   map[proto.TargetID]proto.LocalState
	mgCV      map[proto.TargetID]uint64 // the chain version each report refers to
	// blocked links, both ways: a-b (0 = mgmtd)
	blocked  map[[2]chain.Addr]int64 // until
	clients  []*client
	nextReq  chain.Req
	history  []hist
	acked    map[uint64]uint64    // chunk -> highest acknowledged version
	ackedVal map[[2]uint64]uint64 // (chunk, version) -> content acknowledged at it
	flips    int
	res      Result
	// scratch, reused every step (no allocation in the hot loop)
	dueBuf   []int
	localBuf map[proto.TargetID]proto.LocalState
}

// Run runs one seed.
func Run(opt Options) Result {
	w := &world{opt: opt, rng: rand.New(rand.NewPCG(opt.Seed, 0x5eed)), mgLast: map[proto.TargetID]int64{}, mgSent: map[proto.TargetID]int64{},
		mgLocal: map[proto.TargetID]proto.LocalState{}, mgCV: map[proto.TargetID]uint64{}, blocked: map[[2]chain.Addr]int64{},
		acked: map[uint64]uint64{}, ackedVal: map[[2]uint64]uint64{}}
	ch := proto.Chain{ID: 1, Version: 1}
	for i := 1; i <= nTargets; i++ {
		ch.Targets = append(ch.Targets, proto.ChainTarget{ID: proto.TargetID(i), Node: proto.NodeID(i), State: proto.Serving})
	}
	w.routing = &proto.Routing{Version: 1, Chains: []proto.Chain{ch}}
	for i := 1; i <= nTargets; i++ {
		id := proto.TargetID(i)
		n := &node{id: id, disk: &disk{chunks: map[uint64]chain.DiskChunk{}, undo: map[uint64]chain.Version{}}}
		n.rep = chain.Bootstrap(w.cfg(id), w.routing, 0)
		w.nodes = append(w.nodes, n)
		w.mgLast[id], w.mgLocal[id], w.mgCV[id] = 0, proto.UpToDate, 1
	}
	for i := 0; i < nClients; i++ {
		w.clients = append(w.clients, &client{addr: chain.Addr(100 + i), left: opsPerCli})
	}
	w.res.Err = w.run()
	return w.res
}

func (w *world) cfg(id proto.TargetID) chain.Config {
	c := chain.Config{ID: id, FailTimeout: failTimeout, HeartbeatInterval: hbInterval, RetryInterval: retry, ScrubInterval: scrubEvery, Bugs: w.opt.Bugs}
	if w.opt.noScrub {
		c.ScrubInterval = 0
	}
	return c
}

// trace records a step with Options.Trace; hot callers test the option
// first, so a run without a trace does not format (or box) arguments.
func (w *world) trace(format string, args ...any) {
	if w.opt.Trace {
		w.res.Trace = append(w.res.Trace, fmt.Sprintf("t=%d ", w.now)+fmt.Sprintf(format, args...))
	}
}

func (w *world) faulty() bool { return w.now < faultUntil }

func (w *world) run() error {
	for w.now < quietBound {
		w.res.Steps++
		if err := w.step(); err != nil {
			return fmt.Errorf("t=%d step %d: %w", w.now, w.res.Steps, err)
		}
		if err := w.check(); err != nil {
			return fmt.Errorf("t=%d step %d: %w", w.now, w.res.Steps, err)
		}
		if !w.faulty() && w.quiet() {
			break
		}
	}
	if err := w.converged(); err != nil {
		return fmt.Errorf("t=%d, %d time units after the last fault: %w", w.now, w.now-faultUntil, err)
	}
	return w.linearizable()
}

// due lists the indexes of deliverable messages.
func (w *world) due() []int {
	out := w.dueBuf[:0]
	for i, e := range w.net {
		if e.at > w.now {
			continue
		}
		if n := w.node(e.m.To); n != nil && n.paused {
			continue
		}
		out = append(out, i)
	}
	w.dueBuf = out
	return out
}

func (w *world) node(a chain.Addr) *node {
	if a >= 1 && int(a) <= len(w.nodes) {
		return w.nodes[a-1]
	}
	return nil
}

func (w *world) step() error {
	due := w.due()
	x := w.rng.IntN(100)
	switch {
	case len(due) > 0 && x < 70:
		i := due[w.rng.IntN(len(due))]
		e := w.net[i]
		if w.faulty() && w.rng.IntN(100) < 3 {
			if w.opt.Trace {
				w.trace("duplicate %s", e.m)
			} // deliver now, keep a copy for later
		} else {
			w.net = slices.Delete(w.net, i, i+1)
		}
		if w.faulty() && w.rng.IntN(100) < 4 {
			if w.opt.Trace {
				w.trace("drop %s", e.m)
			}
			return nil
		}
		return w.deliver(e.m)
	case x < 90 || !w.faulty():
		w.tick()
	default:
		w.fault()
	}
	return nil
}

func (w *world) linkBlocked(a, b chain.Addr) bool {
	if a > b {
		a, b = b, a
	}
	until, ok := w.blocked[[2]chain.Addr{a, b}]
	return ok && until > w.now
}

func (w *world) deliver(m chain.Msg) error {
	if w.linkBlocked(m.From, m.To) {
		if w.opt.Trace {
			w.trace("lost (partition) %s", m)
		}
		return nil
	}
	if w.opt.Trace {
		w.trace("deliver %s", m)
	}
	switch {
	case m.To == chain.MgmtdAddr:
		w.heartbeat(m)
	case w.node(m.To) != nil:
		n := w.node(m.To)
		if n.rep == nil {
			return nil
		}
		m.Now = w.now
		n.rep.Step(m)
		w.drain(n)
	default:
		w.clientRecv(m)
	}
	return nil
}

// drain carries out a replica's Ready: persists first (a pending version
// durably, with every earlier commit of the target), then sends.
func (w *world) drain(n *node) {
	rd := n.rep.Ready()
	for _, p := range rd.Persist {
		d := n.disk
		dc := d.chunks[p.Chunk]
		switch p.Kind {
		case chain.PersistPending:
			clear(d.undo) // the directory fsync makes earlier renames durable
			v := p.Version
			dc.Pending = &v
		case chain.PersistCommit:
			if dc.Pending != nil {
				if _, ok := d.undo[p.Chunk]; !ok {
					d.undo[p.Chunk] = dc.Committed
				}
				dc.Committed, dc.Pending = *dc.Pending, nil
			}
		}
		d.chunks[p.Chunk] = dc
	}
	for _, m := range rd.Msgs {
		w.send(m)
	}
}

func (w *world) send(m chain.Msg) {
	delay := int64(0)
	if w.faulty() {
		delay = int64(w.rng.IntN(4))
	}
	w.net = append(w.net, envelope{m: m, at: w.now + delay})
}

// heartbeat is mgmtd's side: note the target alive with its local state
// and answer with the routing when the target's is older.
func (w *world) heartbeat(m chain.Msg) {
	id := proto.TargetID(m.From)
	if m.Now < w.mgSent[id] {
		return // an older heartbeat overtaken by a newer one (real ones carry a sequence)
	}
	w.mgSent[id] = m.Now
	w.mgLast[id], w.mgLocal[id], w.mgCV[id] = w.now, m.Local, m.ChainVer
	if ch := w.routing.Chain(1); m.Local == proto.UpToDate {
		if me, _ := ch.Target(id); !chain.ResyncHolds(me.State, ch.Version, m.ChainVer) {
			w.res.Stale++
		}
	}
	resp := chain.Msg{Type: chain.MsgRouting, From: chain.MgmtdAddr, To: m.From, SentAt: m.Now, Now: w.now}
	if m.Known != w.routing.Version {
		resp.Routing = w.routing
	}
	w.send(resp)
}

func (w *world) tick() {
	w.now++
	// mgmtd decides with its own pure functions.
	if w.localBuf == nil {
		w.localBuf = map[proto.TargetID]proto.LocalState{}
	}
	local := w.localBuf
	clear(local)
	for id, st := range w.mgLocal {
		if w.now-w.mgLast[id] <= failTimeout {
			local[id] = st
		} else {
			local[id] = proto.LocalOff
		}
	}
	if !w.opt.Bugs.StaleResyncHolds {
		mgmtd.StaleResyncs(w.routing, local, w.mgCV)
	}
	// Decide is pure: skip it when neither input changed since last time.
	if w.decided != w.routing.Version || !maps.Equal(local, w.lastLocal) {
		if r, changed := mgmtd.Decide(w.routing, local); changed {
			w.routing = r
			if w.opt.Trace {
				w.trace("mgmtd routing r%d %s", r.Version, r.Chains[0].String())
			}
		}
		w.decided, w.lastLocal = w.routing.Version, maps.Clone(local)
	}
	for _, n := range w.nodes {
		if n.rep != nil && !n.paused {
			n.rep.Step(chain.Msg{Type: chain.MsgTick, Now: w.now})
			w.drain(n)
		}
	}
	for _, c := range w.clients {
		w.clientTick(c)
	}
	if !w.faulty() {
		// Faults stop: every target comes back, every link heals.
		clear(w.blocked)
		for _, n := range w.nodes {
			if n.paused {
				w.resume(n)
			}
			if n.rep == nil {
				w.restart(n)
			}
		}
	}
}

func (w *world) down() int {
	k := 0
	for _, n := range w.nodes {
		if n.rep == nil || n.paused {
			k++
		}
	}
	return k
}

func (w *world) fault() {
	n := w.nodes[w.rng.IntN(len(w.nodes))]
	w.res.Fault++
	switch x := w.rng.IntN(100); {
	case x < 20 && n.rep != nil && !n.paused && w.down() < nTargets-1:
		w.crash(n)
	case x < 40 && n.rep == nil && w.now-n.downAt > 10:
		w.restart(n)
	case x < 55 && n.rep != nil && !n.paused && w.down() < nTargets-1:
		n.paused, n.downAt = true, w.now
		w.trace("pause %d", n.id)
	case x < 70 && n.paused:
		w.resume(n)
	case x < 85:
		other := chain.Addr(w.rng.IntN(nTargets + 1)) // 0 = mgmtd
		a, b := chain.Addr(n.id), other
		if a == b {
			return
		}
		if a > b {
			a, b = b, a
		}
		d := int64(5 + w.rng.IntN(3*failTimeout))
		w.blocked[[2]chain.Addr{a, b}] = w.now + d
		w.trace("partition %d-%d for %d", a, b, d)
	case x < 88 && w.opt.BitFlips && w.flips == 0 && n.rep != nil:
		ids := n.rep.Chunks()
		if len(ids) == 0 {
			return
		}
		id := ids[w.rng.IntN(len(ids))]
		v, _ := n.rep.Chunk(id)
		if v.Ver == 0 || v.Corrupt() {
			return
		}
		// One disk fault: another replica holds a good copy of the
		// version (else no protocol could bring the bytes back).
		copies := 0
		for _, o := range w.nodes {
			if o != n && o.rep != nil {
				if ov, _ := o.rep.Chunk(id); ov.Ver == v.Ver && ov.Val == v.Val {
					copies++
				}
			}
		}
		if copies == 0 {
			return
		}
		mask := uint64(1) << w.rng.IntN(64)
		n.rep.Corrupt(id, mask)
		dc := n.disk.chunks[id]
		dc.Committed.Val ^= mask
		n.disk.chunks[id] = dc
		w.flips++
		w.trace("bitflip target %d chunk %d", n.id, id)
	default:
		w.res.Fault--
	}
}

// resume is SIGCONT: the process runs on and sees the clock first.
func (w *world) resume(n *node) {
	n.paused = false
	w.trace("resume %d", n.id)
	n.rep.Step(chain.Msg{Type: chain.MsgTick, Now: w.now})
	w.drain(n)
}

// crash is kill -9: the process state is gone, and a commit rename not
// yet made durable by a later directory sync may be undone.
func (w *world) crash(n *node) {
	n.rep, n.paused, n.downAt = nil, false, w.now
	d := n.disk
	ids := make([]uint64, 0, len(d.undo))
	for id := range d.undo {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	lost := 0
	for _, id := range ids {
		if w.rng.IntN(2) == 0 {
			dc := d.chunks[id]
			renamed := dc.Committed
			dc.Committed, dc.Pending = d.undo[id], &renamed
			d.chunks[id] = dc
			lost++
		}
	}
	clear(d.undo)
	w.trace("kill -9 %d (%d unsynced commits undone)", n.id, lost)
}

func (w *world) restart(n *node) {
	n.disk.incarnation++
	disk := map[uint64]chain.DiskChunk{}
	for id, dc := range n.disk.chunks {
		disk[id] = dc
	}
	n.rep = chain.New(w.cfg(n.id), disk, n.disk.incarnation, w.now)
	w.trace("restart %d", n.id)
}

// ---- clients ----

func (w *world) clientTick(c *client) {
	if c.cur == nil {
		if c.left == 0 || (w.rng.IntN(4) != 0) {
			return
		}
		c.left--
		w.nextReq++
		w.events++
		c.cur = &op{write: w.rng.IntN(3) != 0, chunk: uint64(w.rng.IntN(nChunks)), delta: w.rng.Uint64(), req: w.nextReq, call: w.events}
		w.clientSend(c)
		return
	}
	if o := c.cur; w.now-o.sentAt >= clientWait || (o.retryAt > 0 && w.now >= o.retryAt) {
		if !o.write && o.tries >= clientTries {
			c.cur = nil // a read that never answered: not in the history
			return
		}
		// A write is retried (same request id) until it is answered: the
		// cluster converges once faults stop, so none stays unknown, and
		// the linearizability check stays cheap.
		w.clientSend(c)
	}
}

func (w *world) clientSend(c *client) {
	o := c.cur
	o.tries++
	o.sentAt, o.retryAt = w.now, 0
	ch := w.routing.Chain(1)
	var to proto.ChainTarget
	var ok bool
	if o.write {
		to, ok = ch.Head()
	} else if rd := ch.Readable(); len(rd) > 0 {
		to, ok = rd[w.rng.IntN(len(rd))], true
	}
	if !ok {
		o.retryAt = w.now + 3
		return
	}
	o.to = chain.Addr(to.ID)
	m := chain.Msg{Type: chain.MsgRead, From: c.addr, To: o.to, Chunk: o.chunk, Req: o.req, Now: w.now}
	if o.write {
		m.Type, m.Delta = chain.MsgWrite, o.delta
	}
	w.send(m)
}

func (w *world) clientRecv(m chain.Msg) {
	c := w.clients[m.To-100]
	o := c.cur
	if o == nil || o.req != m.Req {
		return
	}
	switch {
	case m.Err != "":
		o.retryAt = w.now + 2
	case o.write:
		if m.Ver > w.acked[o.chunk] {
			w.acked[o.chunk] = m.Ver
		}
		if m.Ver > 0 {
			w.ackedVal[[2]uint64{o.chunk, m.Ver}] = m.Val
		}
		w.res.Acked++
		w.finish(c, output{ver: m.Ver, val: m.Val})
	default:
		w.finish(c, output{ver: m.Ver, val: m.Val})
	}
}

func (w *world) finish(c *client, out output) {
	o := c.cur
	c.cur = nil
	w.events++
	ret := w.events
	if out.unknown {
		ret = math.MaxInt64 // may take effect any time after its call
	}
	w.history = append(w.history, hist{in: input{write: o.write, chunk: o.chunk, delta: o.delta}, out: out, call: o.call, ret: ret, cli: int(c.addr - 100)})
}

// ---- invariants ----

func (w *world) check() error {
	if w.checked != w.routing.Version { // a pure function of the routing
		if err := mgmtd.CheckChain(*w.routing.Chain(1)); err != nil {
			return err
		}
		w.checked = w.routing.Version
	}
	for _, n := range w.nodes {
		if n.rep == nil || n.paused || !n.rep.Readable() {
			n.wasSet = false // it left: a returning replica is resynced
			continue
		}
		var now [nChunks]uint64
		for ck := uint64(0); ck < nChunks; ck++ {
			cv, pv := n.rep.Chunk(ck)
			if pv == nil && cv.Ver < w.acked[ck] {
				return fmt.Errorf("acknowledged write lost: target %d serves chunk %d at v%d, v%d was acknowledged", n.id, ck, cv.Ver, w.acked[ck])
			}
			if v, ok := w.ackedVal[[2]uint64{ck, cv.Ver}]; ok && v != cv.Val && !cv.Corrupt() {
				return fmt.Errorf("acknowledged write lost: target %d serves chunk %d v%d with content %x, %x was acknowledged at v%d", n.id, ck, cv.Ver, cv.Val, v, cv.Ver)
			}
			h := cv.Ver
			if pv != nil && pv.Ver > h {
				h = pv.Ver
			}
			if prev := n.was[ck]; n.wasSet && h < prev {
				return fmt.Errorf("chunk %d went back on target %d while it served: v%d after v%d", ck, n.id, h, prev)
			}
			now[ck] = h
		}
		n.was, n.wasSet = now, true
	}
	return nil
}

func (w *world) quiet() bool {
	for _, c := range w.clients {
		if c.cur != nil || c.left > 0 {
			return false
		}
	}
	return w.converged() == nil
}

// converged: every target serves, nothing is pending, the replicas agree
// and hold every acknowledged write.
func (w *world) converged() error {
	ch := w.routing.Chain(1)
	for _, t := range ch.Targets {
		if t.State != proto.Serving {
			return fmt.Errorf("not every target serves: %s", ch)
		}
	}
	for ck := uint64(0); ck < nChunks; ck++ {
		var ref chain.Version
		for i, n := range w.nodes {
			if n.rep == nil || !n.rep.Readable() {
				return fmt.Errorf("target %d does not serve (phase %s, fenced %t)", n.id, n.rep.Phase(), n.rep.Fenced())
			}
			cv, pv := n.rep.Chunk(ck)
			switch {
			case pv != nil:
				return fmt.Errorf("target %d: chunk %d pending v%d", n.id, ck, pv.Ver)
			case cv.Ver < w.acked[ck]:
				return fmt.Errorf("acknowledged write lost: target %d holds chunk %d v%d, v%d acknowledged", n.id, ck, cv.Ver, w.acked[ck])
			case i == 0:
				ref = cv
			case cv.Ver != ref.Ver || cv.Val != ref.Val:
				return fmt.Errorf("replicas differ: chunk %d: target %d v%d %x, target %d v%d %x", ck, w.nodes[0].id, ref.Ver, ref.Val, n.id, cv.Ver, cv.Val)
			}
		}
	}
	return nil
}

// state is the register's state: the chunk's version and content.
type state struct{ ver, val uint64 }

// model is a register of (version, content) per chunk: a write applies
// chain.Mix(content, delta) and moves the version by one; an answer
// names the version it was applied at (the head assigns it), so that
// write can only be linearized right after the version before it, and
// a read only at the state it returned. Knowing the order of the writes
// keeps the check linear in the history: with contents alone, every
// order of overlapping writes gives a different content, and a history
// of a few dozen overlapping retried writes made porcupine search for
// longer than ten minutes (seed 763395). The model is stronger than the
// content-only register: a history it accepts projects to one that
// register accepts.
var model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[uint64][]porcupine.Operation{}
		for _, o := range h {
			k := o.Input.(input).chunk
			by[k] = append(by[k], o)
		}
		var out [][]porcupine.Operation
		for k := uint64(0); k < nChunks; k++ {
			if len(by[k]) > 0 {
				out = append(out, by[k])
			}
		}
		return out
	},
	Init: func() interface{} { return state{} },
	Step: func(st, in, out interface{}) (bool, interface{}) {
		s, i, o := st.(state), in.(input), out.(output)
		if i.write {
			next := state{ver: s.ver + 1, val: chain.Mix(s.val, i.delta)}
			if o.unknown || o.ver == 0 {
				return true, next
			}
			return o.ver == next.ver && o.val == next.val, next
		}
		return o.ver == s.ver && o.val == s.val, s
	},
	DescribeOperation: func(in, out interface{}) string {
		i, o := in.(input), out.(output)
		if i.write {
			return fmt.Sprintf("write c%d %x -> v%d %x unknown=%t", i.chunk, i.delta, o.ver, o.val, o.unknown)
		}
		return fmt.Sprintf("read c%d -> v%d %x", i.chunk, o.ver, o.val)
	},
}

// linearizable checks the clients' history plus a final read of every
// chunk (the converged content) against a register of Mix.
func (w *world) linearizable() error {
	ops := make([]porcupine.Operation, 0, len(w.history)+nChunks)
	for _, h := range w.history {
		ops = append(ops, porcupine.Operation{ClientId: h.cli, Input: h.in, Output: h.out, Call: h.call, Return: h.ret})
	}
	for ck := uint64(0); ck < nChunks; ck++ {
		cv, _ := w.nodes[0].rep.Chunk(ck)
		w.events++
		ops = append(ops, porcupine.Operation{ClientId: nClients, Input: input{chunk: ck}, Output: output{ver: cv.Ver, val: cv.Val}, Call: w.events, Return: w.events + 1})
		w.events++
	}
	// The bound only stops a pathological history from hanging the run
	// (with versions in the answers the check is linear in the history);
	// running out of it is reported as such, not as a violation.
	res := porcupine.CheckOperationsTimeout(model, ops, checkBound)
	if res == porcupine.Unknown {
		return fmt.Errorf("%w: %d operations, bound %v", ErrCheckUnknown, len(ops), checkBound)
	}
	if res != porcupine.Ok {
		var b strings.Builder
		for _, o := range ops {
			fmt.Fprintf(&b, "\n  client %d [%d,%d] %s", o.ClientId, o.Call, o.Return, model.DescribeOperation(o.Input, o.Output))
		}
		return fmt.Errorf("history not linearizable:%s", b.String())
	}
	return nil
}
