// Package chain is the replication protocol of the storage service (CRAQ
// as in 3FS) as a pure state machine, after etcd/raft's RawNode: a
// Replica holds one target's replication state per chunk (committed and
// pending versions, queued writes, the one in-flight update per chunk,
// request-id dedup, the target's phase under the routing it holds, the
// self-fence, the resync plan of its successor). Messages and clock ticks
// go in through Step; Ready returns what to persist (a pending version,
// synced; a commit, a rename) and what to send. There are no goroutines,
// clocks, sockets or locks here (TestPackageIsPure checks), so a
// simulator (package sim) can drive many replicas through any schedule,
// deterministically.
//
// The write path: the head assigns version committed+1, persists it
// pending and sends it to its successor as an update (a delta, or the
// whole content when the successor is syncing or disagrees); each hop
// checks the chain version, that the sender is its predecessor, and that
// the update follows its committed version; the tail commits first and
// acknowledgements flow back, each hop comparing the acknowledged version
// and content with its own before committing. The head answers the
// client after its own commit. Independent chunks are pipelined; one
// chunk has one update in flight per hop, the next writes wait at the
// head.
//
// NextPhase is the rejoin rule, shared with fs/storage.Service; so are
// the write path's per-chunk transitions (hop.go: CheckWrite at the
// head, CheckUpdate at every hop, Forward from a pending version's first
// send to its commit), which Replica takes too, a content being opaque
// to them (a version and its checksum).
//
// A Replica is not safe for concurrent use; its owner serialises Step and
// Ready. Slices in messages are owned by the receiver once sent.
package chain
