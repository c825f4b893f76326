package chain

import (
	"fmt"

	"github.com/ffkit/ffkit/fs/proto"
)

// Addr names an endpoint: a target (its proto.TargetID), mgmtd (0), or a
// client (any other number the driver chooses).
type Addr int

// MgmtdAddr is mgmtd's address.
const MgmtdAddr Addr = 0

// MsgType is the kind of a message.
type MsgType int

const (
	MsgTick      MsgType = iota // the driver's clock moved (Now)
	MsgWrite                    // client -> head: apply Delta to Chunk (Req)
	MsgWriteResp                // head -> client: Req done (Err "" = acknowledged)
	MsgRead                     // client -> replica: read Chunk
	MsgReadResp                 // replica -> client: Val at Ver, or Err
	MsgUpdate                   // predecessor -> successor: version Ver of Chunk
	MsgAck                      // successor -> predecessor: Chunk committed at Ver with Val
	MsgSyncStart                // predecessor -> syncing successor: list your chunks
	MsgSyncList                 // syncing successor -> predecessor: Metas
	MsgSyncDone                 // predecessor -> syncing successor: resync ended
	MsgHeartbeat                // target -> mgmtd: Local state, Known routing version
	MsgRouting                  // mgmtd -> target: heartbeat answer, Routing nil = unchanged
	MsgFetch                    // target -> chain peer: send me your copy of Chunk at Ver (repair)
	MsgFetchResp                // peer -> target: its copy (Val) of Chunk at Ver, or Err
)

var msgNames = [...]string{"tick", "write", "write-resp", "read", "read-resp", "update", "ack",
	"sync-start", "sync-list", "sync-done", "heartbeat", "routing", "fetch", "fetch-resp"}

func (t MsgType) String() string {
	if int(t) < len(msgNames) {
		return msgNames[t]
	}
	return "msg?"
}

// Req identifies a client request; a retry carries the same Req, so it is
// applied once (every hop remembers the Reqs of the versions it holds).
type Req uint64

// Version is one version of a chunk: its number and content. The content
// is modelled by one word: a write applies a Delta (Mix), so applying an
// update on the wrong base version gives a different content. Sum is the
// checksum written with the content: a bit flip on disk changes Val only.
// Reqs are the last client requests applied up to this version (dedup).
type Version struct {
	Ver  uint64
	Val  uint64
	Sum  uint64
	Reqs []Req
}

// Corrupt tells whether the content fails its checksum.
func (v Version) Corrupt() bool { return v.Ver > 0 && v.Sum != Checksum(v.Val) }

// Mix is the content after a write of delta on content val.
func Mix(val, delta uint64) uint64 {
	x := val*0x9E3779B97F4A7C15 ^ delta
	x ^= x >> 29
	x *= 0xBF58476D1CE4E5B9
	return x ^ x>>32
}

// Checksum is the checksum of a content.
func Checksum(val uint64) uint64 { return Mix(val, 0x5bd1e995) }

// Meta is a chunk's state as a resync lists it.
type Meta struct {
	Chunk   uint64
	Ver     uint64
	Val     uint64
	Pending bool
	Corrupt bool
}

// Msg is one message in or out of a Replica. Fields a type does not use
// are zero.
type Msg struct {
	Type     MsgType
	From, To Addr
	Now      int64 // the driver's clock when stepped in; the sender's when out

	Chunk uint64
	Req   Req
	Delta uint64 // MsgWrite, and MsgUpdate unless Full
	Err   string // responses: "" = success

	ChainVer uint64           // chain messages: the chain version the sender routes by; MsgHeartbeat (uptodate): the one its resync ended under
	Seq      uint64           // MsgUpdate/MsgAck: the sender's sequence (stale copies are dropped)
	Ver      uint64           // MsgUpdate, MsgAck, MsgReadResp
	Val      uint64           // MsgUpdate if Full or Install, MsgAck, MsgReadResp
	Full     bool             // MsgUpdate: Val is the whole content, not a delta
	Install  bool             // MsgUpdate: a resync transfer, committed at once
	Reqs     []Req            // MsgUpdate: the requests applied up to Ver
	Metas    []Meta           // MsgSyncList
	Local    proto.LocalState // MsgHeartbeat
	Known    uint64           // MsgHeartbeat: routing version held
	SentAt   int64            // MsgRouting: when the heartbeat it answers was sent
	Routing  *proto.Routing   // MsgRouting
}

func (m Msg) String() string {
	s := fmt.Sprintf("%s %d->%d", m.Type, m.From, m.To)
	switch m.Type {
	case MsgWrite:
		s += fmt.Sprintf(" c%d req=%d delta=%x", m.Chunk, m.Req, m.Delta)
	case MsgWriteResp:
		s += fmt.Sprintf(" req=%d err=%q", m.Req, m.Err)
	case MsgRead:
		s += fmt.Sprintf(" c%d req=%d", m.Chunk, m.Req)
	case MsgReadResp:
		s += fmt.Sprintf(" req=%d v%d val=%x err=%q", m.Req, m.Ver, m.Val, m.Err)
	case MsgUpdate:
		s += fmt.Sprintf(" c%d cv%d seq=%d v%d full=%t install=%t", m.Chunk, m.ChainVer, m.Seq, m.Ver, m.Full, m.Install)
	case MsgAck:
		s += fmt.Sprintf(" c%d cv%d seq=%d v%d val=%x err=%q", m.Chunk, m.ChainVer, m.Seq, m.Ver, m.Val, m.Err)
	case MsgSyncStart, MsgSyncDone:
		s += fmt.Sprintf(" cv%d", m.ChainVer)
	case MsgSyncList:
		s += fmt.Sprintf(" cv%d chunks=%d", m.ChainVer, len(m.Metas))
	case MsgHeartbeat:
		s += fmt.Sprintf(" %s known=%d", m.Local, m.Known)
		if m.ChainVer != 0 {
			s += fmt.Sprintf(" cv%d", m.ChainVer)
		}
	case MsgFetch:
		s += fmt.Sprintf(" c%d v%d", m.Chunk, m.Ver)
	case MsgFetchResp:
		s += fmt.Sprintf(" c%d v%d val=%x err=%q", m.Chunk, m.Ver, m.Val, m.Err)
	case MsgRouting:
		if m.Routing != nil {
			s += fmt.Sprintf(" r%d", m.Routing.Version)
		} else {
			s += " unchanged"
		}
	}
	return s
}

// PersistKind is what a Persist asks of the chunk store.
type PersistKind int

const (
	// PersistPending writes Version as the chunk's pending version and
	// syncs it (file and directory entry: every earlier commit of the
	// target is durable after it too) before any message of the same
	// Ready is sent.
	PersistPending PersistKind = iota
	// PersistCommit makes the pending version committed: a rename, not
	// synced (a crash may undo it: the version comes back pending).
	PersistCommit
)

// Persist is one change to a target's chunk store.
type Persist struct {
	Kind    PersistKind
	Chunk   uint64
	Version Version // PersistPending: the version
}
