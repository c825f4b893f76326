package mgmtd

import (
	"slices"
	"time"

	"github.com/ffkit/ffkit/fs/proto"
)

// Slow nodes (issue 16). A storage service that answers heartbeats but
// serves slowly (a throttled or congested link, a failing disk) paces
// every write of every chain it is in, and mgmtd sees nothing wrong from
// its heartbeats. Clients and peers do see it. Readers keep the recent
// read round trip of every storage node they read from, and send it with
// their routing requests (proto.RoutingReq); mgmtd turns each report into
// votes (Votes). Writers and storage nodes measure the write path hop by
// hop (proto.HopLatency: a client's write to a chain head, a node's
// forward to its successor, each split into the network's part and the
// answering node's own work) and send it with their routing requests and
// heartbeats; mgmtd judges every node by all recent hops it is an end of
// (HopVotes), so a node slow to forward or to acknowledge is found when
// nobody reads. From the votes of both kinds mgmtd finds the nodes that have been persistently slower than their peers
// (SlowNodes), and takes one such node's targets out of their chains for
// a while (NextExclusions): they go offline, their chains serve on with
// the other members at their speed, and when the hold ends the targets
// come back through resync (syncing, then serving). A node found slow
// again soon after is held twice as long. All three are pure functions of
// their arguments, tested with tables (slow_test.go).

// SlowParams are the thresholds of slow-node detection. Zero fields take
// the defaults (DefaultSlowParams); a negative Factor turns detection off.
type SlowParams struct {
	// Factor and Floor: a node is slow in one client's report when its
	// latency is more than Factor times the fastest other node's in that
	// report and above Floor, or when the client abandoned a read to it
	// for another replica (a hedged read) since its last report. Default
	// 4 and 250 ms.
	Factor float64
	Floor  time.Duration
	// Window: votes older than this are forgotten. Default 10 s.
	Window time.Duration
	// MinVotes and Persist: a node is slow when at least MinVotes slow
	// votes within Window span Persist or more, outnumber its fast votes
	// two to one, and the latest vote on it says slow. Default 3 and 2 s.
	MinVotes int
	Persist  time.Duration
	// Hold: how long a slow node stays out of its chains the first time;
	// it doubles with every exclusion that follows within Recall of the
	// previous one ending (the node was still slow), up to MaxHold; a
	// node slow again later starts from Hold. Default 10 s, 20 s, 1 min:
	// a node out for a passing fault (a throttle, a pause, a drop) serves
	// again within the 30 s of the fault's end, resync included,
	// and a persistently slow one is tried again every 20 s (reads hedge
	// away from it meanwhile).
	Hold, MaxHold, Recall time.Duration
}

// DefaultSlowParams are the documented defaults (docs/cluster.md).
var DefaultSlowParams = SlowParams{Factor: 4, Floor: 250 * time.Millisecond, Window: 10 * time.Second,
	MinVotes: 3, Persist: 2 * time.Second, Hold: 10 * time.Second, MaxHold: 20 * time.Second, Recall: time.Minute}

func (p SlowParams) withDefaults() SlowParams {
	d := DefaultSlowParams
	if p.Factor != 0 {
		d.Factor = p.Factor
	}
	if p.Floor > 0 {
		d.Floor = p.Floor
	}
	if p.Window > 0 {
		d.Window = p.Window
	}
	if p.MinVotes > 0 {
		d.MinVotes = p.MinVotes
	}
	if p.Persist > 0 {
		d.Persist = p.Persist
	}
	if p.Hold > 0 {
		d.Hold = p.Hold
	}
	if p.MaxHold > 0 {
		d.MaxHold = p.MaxHold
	}
	if p.Recall > 0 {
		d.Recall = p.Recall
	}
	return d
}

// Off reports whether detection is turned off.
func (p SlowParams) Off() bool { return p.Factor < 0 }

// LatencyVote is one client's verdict on one node at one time.
type LatencyVote struct {
	Node     proto.NodeID
	Reporter uint64
	At       time.Time
	Slow     bool
	// Latency is the node's reported latency, Base the fastest other
	// node's in the same report (for the log line).
	Latency, Base time.Duration
}

// Votes turns one client's report into votes: every node it measured is
// compared with the fastest other node of the same report (so clients
// near and far from the cluster each judge on their own scale); a node
// the client hedged away from is slow whatever its latency. A node alone
// in a report, and not hedged, gets no vote. Pure.
func Votes(rep []proto.NodeLatency, reporter uint64, at time.Time, p SlowParams) []LatencyVote {
	p = p.withDefaults()
	var out []LatencyVote
	for i, n := range rep {
		base := time.Duration(0)
		for j, o := range rep {
			if j != i && o.Latency > 0 && (base == 0 || time.Duration(o.Latency) < base) {
				base = time.Duration(o.Latency)
			}
		}
		lat := time.Duration(n.Latency)
		v := LatencyVote{Node: n.Node, Reporter: reporter, At: at, Latency: lat, Base: base}
		switch {
		case n.Hedged > 0:
			v.Slow = true
		case lat <= 0 || base == 0:
			continue
		default:
			v.Slow = lat > p.Floor && float64(lat) > p.Factor*float64(base)
		}
		out = append(out, v)
	}
	return out
}

// Hop is one hop report as mgmtd keeps it: who sent it (a client's id,
// or a storage node's id for its forwards) and when it arrived.
type Hop struct {
	proto.HopLatency
	Reporter uint64
	At       time.Time
}

// HopVotes judges, from the write path's hop reports, every storage node
// that is an end of a hop in fresh (the report that just arrived); hops
// holds every report kept (fresh included, any order). Of each hop
// (reporter, from, to) the latest two reports within Window count, with
// the lesser of their times.
//
// A hop's network time (Link) is evidence against both its ends. A hop is
// slow when its time is above Floor and Factor times the fastest hop's.
// Of a slow hop's two ends, the one that has another hop at least twice
// as fast as every other hop of the other end is cleared (its link works:
// a node throttled on its way out is slow on the hop it forwards on, and
// its acknowledgements on the hop into it wait behind that traffic, while
// its neighbours have fast hops elsewhere) and the other end is blamed; a
// slow hop whose ends cannot be told apart blames nobody. A client end is
// a client, never blamed, whose other hops are its other writes. A node is
// also slow when its own time (the least its predecessors saw it spend on
// its own work: disk, CPU) is above Floor and Factor times the fastest
// other node's. Every node of fresh gets a vote, slow if it is blamed or
// its own time is slow. Pure.
func HopVotes(hops []Hop, fresh []Hop, at time.Time, p SlowParams) []LatencyVote {
	p = p.withDefaults()
	type key struct {
		reporter uint64
		from, to proto.NodeID
	}
	// The latest two reports of every hop; the hop counts with the lesser
	// of each time (below).
	type pair struct{ last, prev *Hop }
	recent := map[key]*pair{}
	for i := range hops {
		h := &hops[i]
		if at.Sub(h.At) > p.Window || h.At.After(at) {
			continue
		}
		k := key{h.Reporter, h.From, h.To}
		r := recent[k]
		switch {
		case r == nil:
			recent[k] = &pair{last: h}
		case !h.At.Before(r.last.At):
			r.prev, r.last = r.last, h
		case r.prev == nil || !h.At.Before(r.prev.At):
			r.prev = h
		}
	}
	// A hop's time is the lesser of its latest two reports': a node that
	// is slow is slow in both, while requests that waited out a pause
	// all end at once, in one report, and an idle hop's last report would
	// otherwise stand for the whole window.
	latest := map[key]Hop{}
	for k, r := range recent {
		h := *r.last
		if r.prev != nil {
			h.Link, h.Own = lesser(h.Link, r.prev.Link), lesser(h.Own, r.prev.Own)
		}
		latest[k] = h
	}
	// An end is a node, or a client (node 0) told apart by its id.
	type end struct {
		node   proto.NodeID
		client uint64
	}
	ends := func(k key) [2]end {
		from := end{node: k.from}
		if k.from == 0 {
			from.client = k.reporter
		}
		return [2]end{from, {node: k.to}}
	}
	// The two fastest hops of every end, so that bestOther, the fastest
	// hop of an end other than a given one, takes no second pass.
	type fast struct {
		k    [2]key
		d    [2]time.Duration
		have int
	}
	two := map[end]*fast{}
	for k, h := range latest {
		if h.Link <= 0 {
			continue
		}
		d := time.Duration(h.Link)
		for _, e := range ends(k) {
			f := two[e]
			if f == nil {
				f = &fast{}
				two[e] = f
			}
			switch {
			case f.have == 0 || d < f.d[0]:
				f.k[1], f.d[1] = f.k[0], f.d[0]
				f.k[0], f.d[0] = k, d
				f.have = min(f.have+1, 2)
			case f.have == 1 || d < f.d[1]:
				f.k[1], f.d[1] = k, d
				f.have = 2
			}
		}
	}
	bestOther := func(e end, k key) time.Duration {
		f := two[e]
		switch {
		case f == nil:
			return 0
		case f.k[0] != k:
			return f.d[0]
		case f.have == 2:
			return f.d[1]
		}
		return 0
	}
	fastest := time.Duration(0)
	own := map[proto.NodeID]time.Duration{}
	for _, h := range latest {
		if d := time.Duration(h.Link); d > 0 && (fastest == 0 || d < fastest) {
			fastest = d
		}
		if d := time.Duration(h.Own); h.To != 0 && d > 0 {
			if o, ok := own[h.To]; !ok || d < o {
				own[h.To] = d
			}
		}
	}
	slowOver := func(d, base time.Duration) bool {
		return base > 0 && d > p.Floor && float64(d) > p.Factor*float64(base)
	}
	type verdict struct{ lat, base time.Duration }
	blamed := map[proto.NodeID]verdict{}
	for k, h := range latest {
		lat := time.Duration(h.Link)
		if !slowOver(lat, fastest) {
			continue
		}
		es := ends(k)
		b0, b1 := bestOther(es[0], k), bestOther(es[1], k)
		var culprit end
		var base time.Duration
		switch {
		case b0 > 0 && (b1 == 0 || b1 >= 2*b0):
			culprit, base = es[1], b0
		case b1 > 0 && (b0 == 0 || b0 >= 2*b1):
			culprit, base = es[0], b1
		default:
			continue // cannot tell which end
		}
		if culprit.node == 0 {
			continue // a client's own link: not a storage node's fault
		}
		if v, ok := blamed[culprit.node]; !ok || lat > v.lat {
			blamed[culprit.node] = verdict{lat, base}
		}
	}
	var nodes []proto.NodeID
	for _, h := range fresh {
		for _, n := range []proto.NodeID{h.From, h.To} {
			if n != 0 && !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(nodes)
	var out []LatencyVote
	for _, n := range nodes {
		v := LatencyVote{Node: n, Reporter: fresh[0].Reporter, At: at}
		if b, ok := blamed[n]; ok {
			v.Slow, v.Latency, v.Base = true, b.lat, b.base
		}
		base := time.Duration(0)
		for o, d := range own {
			if o != n && (base == 0 || d < base) {
				base = d
			}
		}
		if o := own[n]; slowOver(o, base) && o > v.Latency {
			v.Slow, v.Latency, v.Base = true, o, base
		}
		if !v.Slow && fastest == 0 && own[n] == 0 {
			continue // nothing known of it
		}
		out = append(out, v)
	}
	return out
}

// lesser is the lesser of two times of which 0 means unknown.
func lesser(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return max(a, b)
	}
	return min(a, b)
}

// SlowNodes returns, sorted, the nodes that votes (any order) show
// persistently slow at now (see SlowParams). Pure.
func SlowNodes(votes []LatencyVote, now time.Time, p SlowParams) []proto.NodeID {
	p = p.withDefaults()
	type tally struct {
		slow, fast        int
		first, last, vote time.Time
		lastSlow          bool
	}
	by := map[proto.NodeID]*tally{}
	for _, v := range votes {
		if now.Sub(v.At) > p.Window || v.At.After(now) {
			continue
		}
		t := by[v.Node]
		if t == nil {
			t = &tally{}
			by[v.Node] = t
		}
		if !v.At.Before(t.vote) {
			t.vote, t.lastSlow = v.At, v.Slow
		}
		if !v.Slow {
			t.fast++
			continue
		}
		t.slow++
		if t.first.IsZero() || v.At.Before(t.first) {
			t.first = v.At
		}
		if v.At.After(t.last) {
			t.last = v.At
		}
	}
	var out []proto.NodeID
	for id, t := range by {
		if t.slow >= p.MinVotes && t.slow >= 2*t.fast && t.last.Sub(t.first) >= p.Persist && t.lastSlow {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Exclusion is a slow node's time out of its chains: it is out until
// Until; Count is how many exclusions in a row (each within Recall of the
// previous one's end) it has had, which sets the next hold.
type Exclusion struct {
	Until time.Time
	Count int
}

// Excluded reports the nodes of ex that are out of their chains at now.
func Excluded(ex map[proto.NodeID]Exclusion, now time.Time) map[proto.NodeID]bool {
	out := map[proto.NodeID]bool{}
	for id, e := range ex {
		if now.Before(e.Until) {
			out[id] = true
		}
	}
	return out
}

// NextExclusions decides which nodes are out of their chains from now
// on. cur is the previous decision (excluded nodes and the memory of past
// exclusions), slow the nodes SlowNodes found, r the published routing and
// local the targets' local states (missing = offline). A slow node is
// taken out only when no other node is out (one at a time: a cluster
// where many nodes look slow is loaded, not broken) and every chain it is
// in keeps a serving target on another live node that is not out, so no
// chain loses its last replica; its hold is Hold doubled per exclusion
// in a row, up to MaxHold. A node whose hold ended returns (its targets
// rejoin through resync); its memory is forgotten Recall after that.
// It returns the new decision and the nodes taken out now. Pure.
func NextExclusions(cur map[proto.NodeID]Exclusion, slow []proto.NodeID, r *proto.Routing, local map[proto.TargetID]proto.LocalState, now time.Time, p SlowParams) (map[proto.NodeID]Exclusion, []proto.NodeID) {
	p = p.withDefaults()
	next := map[proto.NodeID]Exclusion{}
	out := 0
	for id, e := range cur {
		if now.Sub(e.Until) > p.Recall {
			continue // forgotten
		}
		next[id] = e
		if now.Before(e.Until) {
			out++
		}
	}
	var taken []proto.NodeID
	for _, id := range slow {
		if out > 0 {
			break
		}
		if e, ok := next[id]; ok && now.Before(e.Until) {
			continue
		}
		if !canExclude(id, r, local, next, now) {
			continue
		}
		e := next[id]
		hold := p.Hold
		for i := 0; i < e.Count && hold < p.MaxHold; i++ {
			hold *= 2
		}
		next[id] = Exclusion{Until: now.Add(min(hold, p.MaxHold)), Count: e.Count + 1}
		taken = append(taken, id)
		out++
	}
	return next, taken
}

// canExclude: every chain with a target on node keeps a serving target on
// another node that is alive and not out.
func canExclude(node proto.NodeID, r *proto.Routing, local map[proto.TargetID]proto.LocalState, ex map[proto.NodeID]Exclusion, now time.Time) bool {
	in := false
	for _, c := range r.Chains {
		has, other := false, false
		for _, t := range c.Targets {
			if t.Node == node {
				has = true
				continue
			}
			st, ok := local[t.ID]
			e, out := ex[t.Node]
			if t.State == proto.Serving && ok && st != proto.LocalOff && !(out && now.Before(e.Until)) {
				other = true
			}
		}
		if has && !other {
			return false
		}
		in = in || has
	}
	return in
}

// ApplyExclusions marks every target on an excluded node offline in local,
// so that Decide takes it out of its chain (and keeps it out); when the
// node is no longer excluded its reported state counts again and Decide
// resyncs it. Pure but for local.
func ApplyExclusions(local map[proto.TargetID]proto.LocalState, r *proto.Routing, excluded map[proto.NodeID]bool) {
	for _, c := range r.Chains {
		for _, t := range c.Targets {
			if excluded[t.Node] {
				local[t.ID] = proto.LocalOff
			}
		}
	}
}
