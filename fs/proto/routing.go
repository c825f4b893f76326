package proto

import "fmt"

// PublicState is a target's state as mgmtd publishes it.
type PublicState string

// Public states (3FS's): serving targets are read and written; a syncing
// target receives writes and a resync from its predecessor but is not
// read; waiting targets are alive but not yet syncing; lastsrv is a dead
// target that was the chain's last serving one (it alone holds the newest
// data); offline targets are dead.
const (
	Serving PublicState = "serving"
	Syncing PublicState = "syncing"
	Waiting PublicState = "waiting"
	LastSrv PublicState = "lastsrv"
	Offline PublicState = "offline"
)

// LocalState is a target's state as its storage service reports it.
type LocalState string

// Local states: uptodate (holds the chain's data), online (alive, needs a
// resync), offline (down or refusing to serve).
const (
	UpToDate LocalState = "uptodate"
	Online   LocalState = "online"
	LocalOff LocalState = "offline"
)

// ChainTarget is one target in a chain's order.
type ChainTarget struct {
	ID    TargetID    `json:"id"`
	Node  NodeID      `json:"node"`
	State PublicState `json:"state"`
}

// Chain is a chain's ordered targets and its version, bumped on every
// change of order or state.
type Chain struct {
	ID      ChainID       `json:"id"`
	Version uint64        `json:"version"`
	Targets []ChainTarget `json:"targets"`
}

// Node is a registered storage service.
type Node struct {
	ID   NodeID `json:"id"`
	Addr string `json:"addr"`
}

// Routing is what mgmtd publishes: everything a client or storage service
// needs to route a request. Version is bumped on every change.
type Routing struct {
	Version   uint64 `json:"routing_version"`
	ChunkSize int64  `json:"chunk_size"`
	// FailTimeout (ns): mgmtd declares a silent node dead after it; a
	// storage service that cannot reach mgmtd for half of it stops serving.
	FailTimeout int64 `json:"fail_timeout_ns"`
	// HeartbeatInterval (ns) storage services should use.
	HeartbeatInterval int64   `json:"heartbeat_interval_ns"`
	Nodes             []Node  `json:"nodes"`
	Chains            []Chain `json:"chains"`
	// Meta lists the live metadata servers (host:port), filled in by
	// mgmtd when it answers MGetRouting; not persisted or versioned.
	Meta []string `json:"meta,omitempty"`
}

// Chain returns the chain with id, or nil.
func (r *Routing) Chain(id ChainID) *Chain {
	if r == nil {
		return nil
	}
	// Chains are few and sorted by id; linear search keeps this simple.
	for i := range r.Chains {
		if r.Chains[i].ID == id {
			return &r.Chains[i]
		}
	}
	return nil
}

// NodeAddr returns the address of node id, or "".
func (r *Routing) NodeAddr(id NodeID) string {
	if r == nil {
		return ""
	}
	for _, n := range r.Nodes {
		if n.ID == id {
			return n.Addr
		}
	}
	return ""
}

// Head returns the chain's head: its first target when that target takes
// writes (serving or syncing).
func (c *Chain) Head() (ChainTarget, bool) {
	if len(c.Targets) == 0 {
		return ChainTarget{}, false
	}
	t := c.Targets[0]
	return t, t.State == Serving
}

// Successor returns the target after id that takes writes (the next one,
// if it is serving or syncing); ok=false means id is the tail.
func (c *Chain) Successor(id TargetID) (ChainTarget, bool) {
	for i, t := range c.Targets {
		if t.ID == id {
			if i+1 < len(c.Targets) {
				n := c.Targets[i+1]
				if n.State == Serving || n.State == Syncing {
					return n, true
				}
			}
			return ChainTarget{}, false
		}
	}
	return ChainTarget{}, false
}

// Predecessor returns the target just before id, if any.
func (c *Chain) Predecessor(id TargetID) (ChainTarget, bool) {
	for i, t := range c.Targets {
		if t.ID == id && i > 0 {
			return c.Targets[i-1], true
		}
	}
	return ChainTarget{}, false
}

// Target returns the entry of id in the chain.
func (c *Chain) Target(id TargetID) (ChainTarget, bool) {
	for _, t := range c.Targets {
		if t.ID == id {
			return t, true
		}
	}
	return ChainTarget{}, false
}

// Readable returns the targets a read may go to: the serving prefix.
func (c *Chain) Readable() []ChainTarget {
	n := 0
	for n < len(c.Targets) && c.Targets[n].State == Serving {
		n++
	}
	return c.Targets[:n:n] // shared with the chain: read only
}

func (c *Chain) String() string {
	s := fmt.Sprintf("chain %d v%d [", c.ID, c.Version)
	for i, t := range c.Targets {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d@%d:%s", t.ID, t.Node, t.State)
	}
	return s + "]"
}

// Clone returns a deep copy.
func (r *Routing) Clone() *Routing {
	if r == nil {
		return nil
	}
	c := *r
	c.Nodes = append([]Node(nil), r.Nodes...)
	c.Chains = make([]Chain, len(r.Chains))
	for i, ch := range r.Chains {
		c.Chains[i] = ch
		c.Chains[i].Targets = append([]ChainTarget(nil), ch.Targets...)
	}
	return &c
}

// ChunkHash mixes a chunk id (splitmix64 finalizer). A chunk's preferred
// replica for reads is Readable()[ChunkHash(id) % len(Readable())]: the
// client reads from it when it is not clearly busier or slower than the
// others, and it is the one replica whose storage service writes the
// chunk through its page cache (the others write around it).
func ChunkHash(id ChunkID) uint64 {
	x := id.Inode*0x9e3779b97f4a7c15 ^ id.Index
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// PreferredReader reports whether target t is chunk id's preferred
// replica for reads in this chain (see ChunkHash).
func (c *Chain) PreferredReader(id ChunkID, t TargetID) bool {
	rd := c.Readable()
	if len(rd) == 0 {
		return false
	}
	return rd[ChunkHash(id)%uint64(len(rd))].ID == t
}
