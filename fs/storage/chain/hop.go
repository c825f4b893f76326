package chain

import "github.com/ffkit/ffkit/fs/proto"

// The per-chunk decisions of the write path, as small pure transitions
// that both Replica and fs/storage.Service take: what the head does with
// a client's write (WriteCheck), what a hop does with an update
// (CheckUpdate), and how one hop forwards a pending version and what it
// does with its successor's answer (Forward). A content is opaque here:
// the Replica's is one word, the service's the chunk store's bytes (a
// Forward carries only the version and its checksum); each driver reads
// the bytes to send when Forward says "whole".

// WriteStep is what the head does with a client's write of a chunk.
type WriteStep int

const (
	// WriteApply: build version committed+1 from the write.
	WriteApply WriteStep = iota
	// WriteDone: the request made the committed version or an earlier
	// one (a retry): answer with the chunk's state, apply nothing.
	WriteDone
	// WriteJoin: the pending version holds the request (a retry that
	// reached a new head while it forwarded the old head's update): answer
	// when that version commits, apply nothing.
	WriteJoin
	// WriteAfterPending: another pending version is under way or left (a
	// crash, a lost chain: it may be committed further down): it is
	// finished (sent on whole, committed), never dropped or reused; then
	// the write is decided again.
	WriteAfterPending
)

func (w WriteStep) String() string {
	switch w {
	case WriteApply:
		return "apply"
	case WriteDone:
		return "done"
	case WriteJoin:
		return "join"
	case WriteAfterPending:
		return "after pending"
	}
	return "write?"
}

// CheckWrite is the head's rule on a client's write: committedHas tells
// whether the request is among the committed version's requests,
// pending whether a pending version exists, pendingHas whether the
// request is among its requests.
func CheckWrite(committedHas, pending, pendingHas bool) WriteStep {
	switch {
	case committedHas:
		return WriteDone
	case pending && pendingHas:
		return WriteJoin
	case pending:
		return WriteAfterPending
	}
	return WriteApply
}

// CheckUpdate is a hop's rule on an update of version ver from its
// predecessor: a whole content is built whatever the local version (the
// predecessor's data wins); a delta must follow the committed version
// (CheckDelta).
func CheckUpdate(committed, ver uint64, whole bool) DeltaCheck {
	if whole {
		return DeltaApply
	}
	return CheckDelta(committed, ver)
}

// Forward is one hop's forwarding of its pending version to its
// successor, from the first send to the commit: whether the successor
// gets a delta or the whole content, and what each answer means.
type Forward struct {
	Ver uint64 // the pending version
	Sum uint64 // its content's checksum, compared with the successor's (CheckAck)
	// Delta: the driver holds the change from the committed version, so
	// the successor may get just that; else it gets the whole content.
	Delta bool
	// Whole: send the whole content from now on (the successor missed a
	// version, disagreed, or the chain changed since the last send).
	Whole bool
	// ChainVer is the chain version of the last send (a chain change
	// makes the next one whole: the new successor may hold anything).
	ChainVer uint64
}

// NewForward starts forwarding version ver with checksum sum; delta
// tells whether the driver holds the change from the committed version.
func NewForward(ver, sum uint64, delta bool) Forward {
	return Forward{Ver: ver, Sum: sum, Delta: delta}
}

// Hop is where a Forward's next send goes.
type Hop struct {
	// Commit: this target is the tail: commit at once (the tail commits
	// first), send nothing.
	Commit bool
	// To is the successor, Whole whether it gets the whole content
	// (always when it is syncing: it converges whatever it held).
	To    proto.ChainTarget
	Whole bool
}

// Next decides the next send of the pending version by target me under
// chain ch, and records ch's version for it.
func (f *Forward) Next(me proto.TargetID, ch *proto.Chain) Hop {
	succ, ok := ch.Successor(me)
	if !ok {
		return Hop{Commit: true}
	}
	if f.ChainVer != 0 && f.ChainVer != ch.Version {
		f.Whole = true
	}
	f.ChainVer = ch.Version
	return Hop{To: succ, Whole: f.Whole || !f.Delta || succ.State == proto.Syncing}
}

// Resend makes every later send whole (a pending version left by a
// crash or a lost chain: the successor may hold anything).
func (f *Forward) Resend() { f.Whole = true }

// Answer is the successor's answer to a send, as the driver received it.
type Answer struct {
	Kind     AnswerKind
	Ver, Sum uint64 // AnswerOK: the successor's committed version and checksum
}

// AnswerKind classifies a successor's answer.
type AnswerKind int

const (
	AnswerOK      AnswerKind = iota // it committed: Ver and Sum are its committed state
	AnswerMissing                   // it missed a version in between (a delta does not apply)
	AnswerCorrupt                   // its own copy is corrupt: it needs the whole content
	AnswerRefused                   // refused for good (no space, a bad request): the update fails
	AnswerFailed                    // no answer or a passing error: try again, as before
)

// Step is what a hop does next with its Forward.
type Step int

const (
	StepCommit Step = iota // the successor holds this very version: commit here
	StepResend             // send again, whole
	StepRetry              // send again later, as before
	StepFail               // give up: the update did not happen
)

func (s Step) String() string {
	switch s {
	case StepCommit:
		return "commit"
	case StepResend:
		return "resend whole"
	case StepRetry:
		return "retry"
	case StepFail:
		return "fail"
	}
	return "step?"
}

// OnAnswer decides what the successor's answer a means for the pending
// version (the rule CheckAck for an acknowledgement).
func (f *Forward) OnAnswer(a Answer) Step {
	switch a.Kind {
	case AnswerOK:
		if CheckAck(f.Ver, f.Sum, a.Ver, a.Sum) == AckCommit {
			return StepCommit
		}
		f.Whole = true // it holds other data: replace it wholesale
		return StepResend
	case AnswerMissing, AnswerCorrupt:
		f.Whole = true // a delta cannot apply there
		return StepResend
	case AnswerRefused:
		return StepFail
	}
	return StepRetry
}
