package proto

// Method numbers. mgmtd answers 1-15, storage 16-47.
const (
	MHeartbeat  uint16 = 1
	MGetRouting uint16 = 2
	MStatus     uint16 = 3 // routing plus every target's space (StatusResp)

	MWrite      uint16 = 16 // client -> head
	MUpdate     uint16 = 17 // hop -> hop (and resync transfers)
	MBatchRead  uint16 = 18
	MSyncStart  uint16 = 19
	MSyncDone   uint16 = 20
	MListChunks uint16 = 21
	MRemove     uint16 = 22 // client -> head: remove a range of chunks
)

// Op is the kind of a chunk update.
type Op uint8

// Update kinds: every one is versioned and replicated the same way.
const (
	OpWrite    Op = 0 // write Data at Off (zero-filling a gap)
	OpTruncate Op = 1 // set the length to Off (shrink, or extend with zeros)
	OpRemove   Op = 2 // remove the chunk
)

// Tag identifies a client request across retries so it is applied once.
type Tag struct {
	Client uint64 `json:"c"`
	Seq    uint64 `json:"s"`
}

// WriteReq is a client's update of one chunk, sent to the chain head.
// Data (frame data) holds the bytes for OpWrite.
type WriteReq struct {
	Tag      Tag     `json:"tag"`
	Chain    ChainID `json:"chain"`
	ChainVer uint64  `json:"cv"`
	Chunk    ChunkID `json:"chunk"`
	Op       Op      `json:"op,omitempty"`
	Off      int64   `json:"off"`
	CRC      uint32  `json:"crc"` // PayloadChecksum of Data
}

// UpdateReq is an update forwarded from a target to its successor, or a
// resync transfer. Data holds the write's bytes, or the whole chunk when
// FullReplace is set.
type UpdateReq struct {
	WriteReq
	Target      TargetID `json:"target"`         // the receiving target
	UpdateVer   uint64   `json:"uv"`             // the version the head assigned
	FullReplace bool     `json:"full,omitempty"` // Data is the whole chunk content
	// Commit: install UpdateVer as committed at once (resync transfers, and
	// removes of chunks the predecessor does not have).
	Commit bool `json:"commit,omitempty"`
	// Tags: with FullReplace, the client request tags of the version sent
	// (the latest ones in its history), so the receiver keeps answering
	// their retries without applying them again.
	Tags []Tag `json:"tags,omitempty"`
}

// WriteResp answers a write or update: the state of the chunk after commit.
type WriteResp struct {
	CommitVer uint64 `json:"v"`
	Checksum  uint32 `json:"sum"`
	Length    int64  `json:"len"`
	// Took is how long the answering target handled the update (ns), Down
	// how much of it went to waiting on its successors and on earlier
	// updates of the chunk: the sender tells the network from the node's
	// own work with them (HopLatency). 0 from older servers.
	Took int64 `json:"took,omitempty"`
	Down int64 `json:"down,omitempty"`
}

// ReadIO is one range read of one chunk replica.
type ReadIO struct {
	Chain    ChainID  `json:"chain"`
	ChainVer uint64   `json:"cv"`
	Target   TargetID `json:"target"`
	Chunk    ChunkID  `json:"chunk"`
	Off      int64    `json:"off"`
	Len      int64    `json:"len"`
	// Sums: the client verifies this read itself. A target that can (a
	// block-aligned range, ending on a block boundary or at the chunk's
	// end, in a file it can send from) then replies with the stored CRC32C
	// of every block ahead of the bytes (ReadResult.Sums) and sends the
	// bytes straight from its page cache without reading them; otherwise it
	// verifies them as always.
	Sums bool `json:"sums,omitempty"`
	// Local (with Sums, in a request whose Host is the target's): the
	// client reads the bytes itself from the committed chunk file, a
	// short-circuit read. A target that can answers with the file's path
	// (ReadResult.Path) and the block CRCs instead of the bytes.
	Local bool `json:"local,omitempty"`
}

// BatchReadReq reads many ranges from one storage service.
type BatchReadReq struct {
	IOs []ReadIO `json:"ios"`
	// Host is the client's HostID, set when some IO asks for a local
	// read: a target offers one only to a client on its own host.
	Host string `json:"host,omitempty"`
}

// ReadResult is one IO's outcome. Sums bytes of CRCs then N bytes of data
// (fewer than asked when the chunk is shorter) follow the previous
// results' bytes in the frame's data. Code is a wire error code ("" for success).
type ReadResult struct {
	N int64 `json:"n"`
	// Sums > 0: this many bytes of block CRCs (4 per BlockSize block of
	// the N bytes, big-endian, the last block possibly short) precede the N
	// bytes in the frame's data, and the bytes are not verified by the
	// target: the client must check them (ReadIO.Sums).
	Sums int64 `json:"sums,omitempty"`
	// Path (a local read, ReadIO.Local): the N bytes are not in the frame;
	// they are at FileOff in this committed chunk file, which never
	// changes (a new version is a new file). Only the Sums precede the
	// next result's bytes. The client checks the bytes against the Sums.
	Path    string `json:"path,omitempty"`
	FileOff int64  `json:"foff,omitempty"`
	// Cold (with Path): the bytes were not all in the target's page
	// cache; the client reads them with O_DIRECT.
	Cold bool   `json:"cold,omitempty"`
	Code string `json:"code,omitempty"`
	Msg  string `json:"msg,omitempty"`
}

// BatchReadResp answers BatchReadReq, one result per IO in order.
type BatchReadResp struct {
	Results []ReadResult `json:"results"`
}

// ChunkMeta describes one chunk replica.
type ChunkMeta struct {
	Chunk     ChunkID `json:"chunk"`
	CommitVer uint64  `json:"v"`
	UpdateVer uint64  `json:"u"`
	Length    int64   `json:"len"`
	Checksum  uint32  `json:"sum"`
	Corrupt   bool    `json:"corrupt,omitempty"`
}

// SyncReq starts or ends the resync of Target (the syncing successor).
type SyncReq struct {
	Chain    ChainID  `json:"chain"`
	ChainVer uint64   `json:"cv"`
	Target   TargetID `json:"target"`
}

// SyncStartResp lists the syncing target's chunks of the chain.
type SyncStartResp struct {
	Chunks []ChunkMeta `json:"chunks"`
}

// ListChunksReq lists the committed chunks of Inode on a chain (from any
// serving target).
type ListChunksReq struct {
	Chain    ChainID  `json:"chain"`
	ChainVer uint64   `json:"cv"`
	Target   TargetID `json:"target"`
	Inode    uint64   `json:"inode"`
}

// ListChunksResp answers ListChunksReq.
type ListChunksResp struct {
	Chunks []ChunkMeta `json:"chunks"`
}

// RemoveReq removes the chunks of Inode with Index >= FromIndex on a chain,
// sent to the head.
type RemoveReq struct {
	Tag       Tag     `json:"tag"`
	Chain     ChainID `json:"chain"`
	ChainVer  uint64  `json:"cv"`
	Inode     uint64  `json:"inode"`
	FromIndex uint64  `json:"from"`
}

// TargetReport is a target's local state in a heartbeat.
type TargetReport struct {
	ID    TargetID   `json:"id"`
	State LocalState `json:"state"`
	// Used is the bytes of committed chunk data the target holds.
	Used int64 `json:"used"`
	// Capacity and Free are the target's file system's size and the bytes
	// an unprivileged writer may still use there (statfs f_blocks and
	// f_bavail, times the block size); 0 when the service cannot measure
	// them. FS identifies that file system on its node (targets sharing a
	// disk report the same FS), so totals count each disk once.
	Capacity int64  `json:"capacity,omitempty"`
	Free     int64  `json:"free,omitempty"`
	FS       string `json:"fs,omitempty"`
	// FSUsed is the bytes in use on that file system (statfs f_blocks -
	// f_bfree, as df(1) counts them); 0 when not measured.
	FSUsed int64 `json:"fs_used,omitempty"`
	// Chain is the chain the target last served, 0 if it never joined one.
	Chain ChainID `json:"chain,omitempty"`
	// ChainVer (with State uptodate) is the chain version under which the
	// target became up to date: its resync ended, or mgmtd promoted it.
	// mgmtd promotes a syncing target only on a report from under the
	// chain version it routes now (chain.ResyncHolds).
	ChainVer uint64 `json:"cv,omitempty"`
}

// HeartbeatReq registers a storage service and reports its targets.
type HeartbeatReq struct {
	Node    NodeID         `json:"node"`
	Addr    string         `json:"addr"`
	Metrics string         `json:"metrics,omitempty"` // its Prometheus endpoint
	Version uint64         `json:"hbv"`               // increases with every heartbeat
	Targets []TargetReport `json:"targets"`
	Known   uint64         `json:"known"` // the routing version the node has
	// Hops: the node's forwards to its successors since its last
	// heartbeat (mgmtd's slow-node detection).
	Hops []HopLatency `json:"hops,omitempty"`
}

// RoutingReq is MGetRouting's request: empty, or a client's recent read
// latency of each storage node it read from (mgmtd's slow-node detection,
// fs/mgmtd/slow.go). Older clients send {}.
type RoutingReq struct {
	Client  uint64        `json:"client,omitempty"`
	Latency []NodeLatency `json:"latency,omitempty"`
	// Hops: the client's writes to chain heads since its last report.
	Hops []HopLatency `json:"hops,omitempty"`
}

// NodeLatency is a client's recent read round trip to one storage node
// (an average over its last requests, ns; 0 unknown), and how many reads
// it abandoned there for another replica (hedged) since its last report.
type NodeLatency struct {
	Node    NodeID `json:"node"`
	Latency int64  `json:"ns,omitempty"`
	Hedged  int    `json:"hedged,omitempty"`
}

// HeartbeatResp answers with the routing when the node's is out of date.
type HeartbeatResp struct {
	Routing *Routing `json:"routing,omitempty"`
}

// TargetUsage is a target's space as its storage service last reported it
// to mgmtd (kept in mgmtd's memory, refreshed by every heartbeat).
type TargetUsage struct {
	ID       TargetID `json:"id"`
	Node     NodeID   `json:"node"`
	Used     int64    `json:"used"`
	Capacity int64    `json:"capacity"`
	Free     int64    `json:"free"`
	FS       string   `json:"fs,omitempty"`
	FSUsed   int64    `json:"fs_used,omitempty"` // as TargetReport.FSUsed
	// Reported is when mgmtd received the report (unix nanoseconds).
	Reported int64 `json:"reported_ns"`
}

// StatusResp answers MStatus: the routing (as MGetRouting) and the latest
// space report of every target mgmtd has heard from since it started, by
// target id.
type StatusResp struct {
	Routing *Routing      `json:"routing"`
	Targets []TargetUsage `json:"targets"`
	// Ready: every target of the chain table serves and its service's
	// latest heartbeat reports it up to date (mgmtd.Server.Ready).
	Ready bool `json:"ready,omitempty"`
}
