// Package mgmtd is the cluster manager of the ffkit file system: storage
// services register and heartbeat to it; it owns the chain table, every
// target's public state and the routing version, detects failures, moves a
// failed target to its chain's end, and drives the resync of a returning
// target (by making it syncing, which its predecessor acts on).
//
// The decisions are pure functions (NextChain, Decide, LocalStates,
// Placement, and for slow nodes Votes, SlowNodes, NextExclusions in
// slow.go) of (current routing, reported local states, heartbeat times,
// now), tested with tables; the Server around them only gathers
// heartbeats, runs the decisions on a ticker, persists, and answers.
//
// Persistence: the routing (chain table, states, nodes, versions) is one
// JSON value under key "mgmtd/routing" in a kv.Store, written in an
// Update transaction before it is published, so a restarted mgmtd resumes
// it. Heartbeat times and local states live in memory only; after a start
// mgmtd waits Options.Freeze before deciding anything, so heartbeats can
// come back first. Options.Fence is called inside every write transaction:
// the seam for a lease-holding primary (a standby's writes fail there).
//
// Timers (Options): heartbeats every HeartbeatInterval, a node silent for
// FailTimeout is dead, decisions every UpdateInterval. A storage service
// that cannot reach mgmtd for FailTimeout/2 stops serving by itself (see
// package storage), so by the time mgmtd acts on a silent node, that node
// no longer serves stale data.
package mgmtd
