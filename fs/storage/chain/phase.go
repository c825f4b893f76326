package chain

import "github.com/ffkit/ffkit/fs/proto"

// Phase is a target's local life cycle, as its storage service sees it.
type Phase int

const (
	// Restarting: report offline until mgmtd's routing shows the target
	// not serving (it may hold stale data: it must not serve).
	Restarting Phase = iota
	// Online: alive, reported online, waiting for mgmtd to make it syncing
	// and its predecessor to resync it (or to promote it, as a lastsrv).
	Online
	// UpToDate: holds the chain's data; serves when mgmtd says serving.
	UpToDate
)

func (p Phase) String() string {
	switch p {
	case Restarting:
		return "restarting"
	case Online:
		return "online"
	case UpToDate:
		return "uptodate"
	}
	return "phase?"
}

// Local is the state a target reports to mgmtd in this phase.
func (p Phase) Local() proto.LocalState {
	switch p {
	case Online:
		return proto.Online
	case UpToDate:
		return proto.UpToDate
	}
	return proto.LocalOff
}

// NextPhase is the rejoin rule: the phase a target moves to given the
// routing it holds now. inChain is false when the routing has the target
// in no chain; st is then ignored.
//
// It must be applied on every heartbeat with the current routing, not
// only when a newer routing arrives: a target that leaves serving
// (restarting) while mgmtd already shows it offline sees no newer routing
// (mgmtd publishes none while nothing changes), and must still move on to
// online, or it never rejoins (the frozen-node bug).
//
//	restarting --(not in a chain, or offline/lastsrv/waiting)--> online
//	online     --(serving: promoted, e.g. a returning lastsrv)--> uptodate
//	uptodate   --(offline/lastsrv/waiting: mgmtd dropped it)--> restarting
//
// online -> uptodate also happens when a resync ends (SyncDone), outside
// this rule. Pure.
func NextPhase(p Phase, st proto.PublicState, inChain bool) Phase {
	out := !inChain || st == proto.Offline || st == proto.LastSrv || st == proto.Waiting
	switch {
	case p == Restarting && out:
		return Online
	case p == Online && inChain && st == proto.Serving:
		return UpToDate
	case p == UpToDate && inChain && out:
		return Restarting
	}
	return p
}

// ResyncHolds tells whether a target's "uptodate" report still holds
// under its chain as routed now: st is the target's public state in the
// chain, chainVer the chain's version, and reported the chain version the
// report refers to (the one under which the target's resync ended, or
// under which it was promoted). Only a syncing target is promoted on its
// report, and only a resync that ended under the very chain version now
// routed counts: a report from under an earlier version is stale. In
// between the target may have been dropped (offline) while writes were
// acknowledged without it, and made syncing again; a report still in
// flight from before would promote it without those writes (simulator
// seeds 68656 and 145469: an acknowledged write lost). A target whose
// report is stale is resynced again under the current version (its
// predecessor restarts the resync on every chain change) and reports
// anew. Pure.
func ResyncHolds(st proto.PublicState, chainVer, reported uint64) bool {
	return st != proto.Syncing || reported == chainVer
}
