// Package fdbkv is the FoundationDB backend of the kv contract, as 3FS
// keeps its metadata: every Store transaction is one FoundationDB
// transaction, so reads with Get and Range add read-conflict ranges,
// SnapshotGet and SnapshotRange do not, a transaction reads its own writes,
// and FoundationDB's resolvers refuse a commit that read something a later
// commit changed (the same semantics the contract states, natively).
//
// It is compiled only with the "fdb" build tag, because the Go bindings
// link the FoundationDB client library (libfdb_c) through cgo:
//
//	go build -tags fdb ./cmd/ffkit
//
// UNVERIFIED HERE: the machines this was written on cannot install the
// FoundationDB client, so this backend has never been compiled or run by
// its authors. It is written against the bindings' documented API and the
// kv conformance suite (fdbkv_test.go runs kvtest.Run when
// FFKIT_FDB_CLUSTER_FILE names a cluster file). See docs/metadata.md
// for how to build and test it where FoundationDB runs.
//
// Without the tag this package holds only this comment, and kv.Open of an
// "fdb:" spec says how to get a binary with FoundationDB support.
package fdbkv
