package mgmtd

import (
	"slices"
	"time"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage/chain"
)

// NodeView is what mgmtd knows of a storage service from its heartbeats.
type NodeView struct {
	Addr    string
	LastHB  time.Time                           // when the last heartbeat arrived
	Targets map[proto.TargetID]proto.LocalState // as last reported
	// ChainVer is, for each target reported uptodate, the chain version
	// its report refers to (see StaleResyncs).
	ChainVer map[proto.TargetID]uint64
}

// LocalStates derives every target's effective local state: as reported by
// its node, or offline when the node has been silent for failTimeout or
// never reported the target. Pure.
func LocalStates(nodes map[proto.NodeID]NodeView, now time.Time, failTimeout time.Duration) map[proto.TargetID]proto.LocalState {
	out := map[proto.TargetID]proto.LocalState{}
	for _, n := range nodes {
		alive := now.Sub(n.LastHB) <= failTimeout
		for id, st := range n.Targets {
			if !alive {
				st = proto.LocalOff
			}
			out[id] = st
		}
	}
	return out
}

// StallCredit is how much time mgmtd adds to every node's last heartbeat
// after its decision loop ran late by gap (it runs every interval): while
// mgmtd was frozen (SIGSTOP, a swap storm) or starved of CPU, the
// heartbeats sent to it were not taken in, so that stretch must not count
// against the nodes, or a resumed mgmtd would declare every node dead at
// once. Only a stall of more than half the fail timeout is credited (less
// cannot make a live node look dead: its next heartbeat is due well
// within the other half); shorter late ticks, ordinary on a loaded host,
// change nothing. Crediting only delays failure detection, never hastens
// it, so the storage services' self-fencing bound (they stop serving after
// half the fail timeout without an answer) still holds. Pure.
func StallCredit(gap, interval, failTimeout time.Duration) time.Duration {
	if gap <= max(2*interval, failTimeout/2) {
		return 0
	}
	return gap - interval
}

// StaleResyncs finds the "uptodate" reports in local that no longer hold
// under r (chain.ResyncHolds: a syncing target whose resync ended under
// an older chain version than r routes), turns them into online in
// local, so Decide does not promote those targets, and returns them in
// sorted order. reported is the chain version each report refers to.
// Pure but for local.
func StaleResyncs(r *proto.Routing, local map[proto.TargetID]proto.LocalState, reported map[proto.TargetID]uint64) []proto.TargetID {
	var stale []proto.TargetID
	for _, c := range r.Chains {
		for _, t := range c.Targets {
			if local[t.ID] == proto.UpToDate && !chain.ResyncHolds(t.State, c.Version, reported[t.ID]) {
				local[t.ID] = proto.Online
				stale = append(stale, t.ID)
			}
		}
	}
	slices.Sort(stale)
	return stale
}

// NextChain computes a chain's next target list from its current public
// states and the targets' local states (missing = offline). It is 3FS's
// transition table, made to converge:
//
//   - serving stays serving while alive; when serving targets die, the
//     first of them becomes lastsrv if no serving target survives, the
//     others offline;
//   - lastsrv returns to serving when it is alive and nothing else serves;
//   - syncing becomes serving once its node reports it uptodate, stays
//     syncing while alive and something serves (else waiting), offline if
//     dead;
//   - waiting/offline targets that are alive become syncing when something
//     serves and no other target of the chain is syncing (one at a time),
//     else waiting; dead ones offline.
//
// The result is in canonical order: serving, lastsrv, syncing, waiting,
// offline, each group in its previous relative order (so a failed target
// moves to the chain's end). The version is bumped iff anything changed.
// Pure: no clocks, no I/O.
func NextChain(c proto.Chain, local map[proto.TargetID]proto.LocalState) (proto.Chain, bool) {
	st := func(id proto.TargetID) proto.LocalState {
		if s, ok := local[id]; ok {
			return s
		}
		return proto.LocalOff
	}
	next := make([]proto.ChainTarget, len(c.Targets))
	copy(next, c.Targets)

	// 1. Serving targets: alive stay, dead ones are demoted below.
	serving := 0
	for _, t := range next {
		if t.State == proto.Serving && st(t.ID) != proto.LocalOff {
			serving++
		}
	}
	lastAssigned := false
	for i, t := range next {
		if t.State == proto.LastSrv {
			lastAssigned = true
			_ = i
		}
	}
	for i, t := range next {
		if t.State != proto.Serving || st(t.ID) != proto.LocalOff {
			continue
		}
		if serving == 0 && !lastAssigned {
			next[i].State = proto.LastSrv
			lastAssigned = true
		} else {
			next[i].State = proto.Offline
		}
	}
	// 2. A returning lastsrv serves again when nothing else does.
	for i, t := range next {
		if t.State != proto.LastSrv {
			continue
		}
		switch {
		case serving > 0:
			next[i].State = proto.Offline // others serve: it is just stale now
		case st(t.ID) != proto.LocalOff:
			next[i].State = proto.Serving
			serving++
		}
	}
	// 3. Syncing targets finish, wait, or die.
	syncing := 0
	for i, t := range next {
		if t.State != proto.Syncing {
			continue
		}
		switch s := st(t.ID); {
		case s == proto.LocalOff:
			next[i].State = proto.Offline
		case serving == 0:
			next[i].State = proto.Waiting
		case s == proto.UpToDate:
			next[i].State = proto.Serving
		default:
			syncing++
		}
	}
	if serving > 0 {
		// Serving targets promoted from syncing in this round count too.
		serving = 0
		for _, t := range next {
			if t.State == proto.Serving {
				serving++
			}
		}
	}
	// 4. Waiting and offline targets.
	for i, t := range next {
		if t.State != proto.Waiting && t.State != proto.Offline {
			continue
		}
		switch {
		case st(t.ID) == proto.LocalOff:
			next[i].State = proto.Offline
		case serving > 0 && syncing == 0:
			next[i].State = proto.Syncing
			syncing++
		default:
			next[i].State = proto.Waiting
		}
	}
	rank := map[proto.PublicState]int{proto.Serving: 0, proto.LastSrv: 1, proto.Syncing: 2, proto.Waiting: 3, proto.Offline: 4}
	slices.SortStableFunc(next, func(a, b proto.ChainTarget) int { return rank[a.State] - rank[b.State] })
	if slices.Equal(next, c.Targets) {
		return c, false
	}
	out := proto.Chain{ID: c.ID, Version: c.Version + 1, Targets: next}
	return out, true
}

// Decide applies NextChain to every chain of r and bumps the routing
// version if any chain changed. It returns r itself when nothing changed,
// else a new Routing. Pure.
func Decide(r *proto.Routing, local map[proto.TargetID]proto.LocalState) (*proto.Routing, bool) {
	var out *proto.Routing
	for i, c := range r.Chains {
		n, changed := NextChain(c, local)
		if !changed {
			continue
		}
		if out == nil {
			out = r.Clone()
			out.Version++
		}
		out.Chains[i] = n
	}
	if out == nil {
		return r, false
	}
	return out, true
}

// CheckChain verifies the invariants of a chain's states (3FS's): the
// order is serving*, lastsrv?, syncing?, waiting*, offline*; a serving
// target excludes lastsrv; at most one syncing and one lastsrv; nothing
// syncing without something serving.
func CheckChain(c proto.Chain) error {
	rank := map[proto.PublicState]int{proto.Serving: 0, proto.LastSrv: 1, proto.Syncing: 2, proto.Waiting: 3, proto.Offline: 4}
	count := map[proto.PublicState]int{}
	prev := -1
	for _, t := range c.Targets {
		r, ok := rank[t.State]
		if !ok {
			return errf("chain %d: target %d in unknown state %q", c.ID, t.ID, t.State)
		}
		if r < prev {
			return errf("chain %d: %v out of canonical order", c.ID, c.String())
		}
		prev = r
		count[t.State]++
	}
	switch {
	case count[proto.Serving] > 0 && count[proto.LastSrv] > 0:
		return errf("chain %d: serving and lastsrv at once: %v", c.ID, c.String())
	case count[proto.Syncing] > 1, count[proto.LastSrv] > 1:
		return errf("chain %d: more than one syncing or lastsrv: %v", c.ID, c.String())
	case count[proto.Syncing] > 0 && count[proto.Serving] == 0:
		return errf("chain %d: syncing without serving: %v", c.ID, c.String())
	}
	return nil
}
