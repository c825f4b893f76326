// Package meta is the metadata service of the ffkit file system: inodes,
// directory entries, file layouts (chunk size and the chains a file's
// chunks rotate over), file length (the largest acknowledged end, under
// concurrent writers), write sessions, and garbage collection of the
// chunks of deleted and truncated files.
//
// Service holds the logic, written once over the kv contract (package
// fs/kv), so it runs unchanged on the embedded etcd, an etcd cluster,
// FoundationDB or the in-memory store. The key schema is in keys.go and
// docs/meta-schema.md. Server serves a Service over the cluster transport
// and registers itself in the store (LiveServers lists the registered
// servers; mgmtd hands the list to clients); Client calls servers and
// fails over to another when one dies.
//
// Metadata servers are stateless: all state is in the store, every
// operation is one serializable transaction, and the operations a retry
// could apply twice (create, mkdir, remove, rename, commit) carry a
// request id whose result is stored in the same transaction, so a client
// that retries on another server gets the first outcome.
//
// Paths are absolute, slash-separated; "." and empty components are
// ignored, ".." is refused. There are no hard links or symlinks.
//
// Concurrency: Service, Server and Client are safe for concurrent use.
// Returned inodes and entries belong to the caller.
package meta
