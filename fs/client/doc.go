// Package client is the chunk-level client of the ffkit cluster: it talks to
// mgmtd for routing and to the storage services for chunk data. The file
// layer (package fs/clusterfs: inodes, directories, layouts, file length)
// is built on it; this package knows nothing of files.
//
// # Model
//
// Data lives in chunks. A chunk is named by ChunkID{Inode, Index} and lives
// on one chain (ChainID); the file layer decides which chain holds which
// chunk (its layout). A chain is an ordered list of storage targets that
// hold identical replicas; writes enter at the head and are replicated hop
// by hop (CRAQ); reads go to any serving replica. A chunk holds at most
// MaxChunkSize bytes; a never-written chunk reads as zeros.
//
// # API (stable; the file layer codes against it)
//
//	c, err := client.Dial(ctx, []string{"127.0.0.1:7000"}, client.Options{Token: tok})
//	defer c.Close()
//	chains := c.Chains()          // []ChainID of the chain table, in table order
//	size := c.ChunkSize()         // the cluster's default chunk size (bytes)
//
//	// Write data at off inside one chunk (off+len(data) <= MaxChunkSize).
//	// Bytes between the chunk's old end and off read as zeros. Returns once
//	// every replica in the chain has the write durably (fsync) and committed.
//	err = c.WriteChunk(ctx, chain, client.ChunkID{Inode: 7, Index: 0}, off, data)
//
//	// Batched reads: any number of ranges of any chunks. Each Buf is filled
//	// completely; bytes past a chunk's stored length are zero and N reports
//	// how many bytes came from stored data. Requests are grouped per storage
//	// service, neighbouring ranges of one chunk merged into one read, with
//	// bounded requests in flight per service, and fail over to another replica
//	// (a service that failed is avoided for a growing interval, a dial that
//	// takes over 300 ms sends the read elsewhere, and clearly slower replicas
//	// are passed over: failover.go). Reply data is received
//	// straight into the callers' buffers. Block-aligned reads of 64 KiB or
//	// more are checksummed here (CRC32C per 4 KiB block, sent by the
//	// target with the bytes, which it sends from its page cache unread) as
//	// they arrive; on a mismatch the target re-reads and verifies the range
//	// (finding and repairing a corrupt replica) and the read fails over.
//	// Such a read from a storage service on this host is a short-circuit
//	// read (unless Options.NoLocalReads): the service answers with the
//	// committed chunk file's path and the CRCs, and the client reads the
//	// file itself, with O_DIRECT when the bytes are not in the page cache
//	// (local.go). If the file is gone (a newer version replaced it) or
//	// unreadable here, the range is read over the connection instead.
//	reads := []client.ChunkRead{{Chain: chain, Chunk: id, Off: 0, Buf: buf}}
//	err = c.ReadChunks(ctx, reads)   // reads[i].N set on return
//
//	// Shrink or extend (with zeros) one chunk to length bytes.
//	err = c.TruncateChunk(ctx, chain, id, length)
//	// Remove the chunks of inode with Index >= fromIndex on one chain
//	// (fromIndex 0: all of them). Idempotent.
//	err = c.RemoveChunks(ctx, chain, inode, fromIndex)
//	// List the chunks of inode stored on one chain (index and length), for
//	// file length queries and garbage collection.
//	infos, err := c.ListChunks(ctx, chain, inode)
//
//	st := c.Routing()             // the current routing snapshot (for status)
//	sp, err := c.Status(ctx)      // routing + per-target capacity/free/used (df)
//
//	// Consistency checks (fsck, tests): one replica's chunk list, or bytes,
//	// without failover.
//	metas, err := c.ReplicaChunks(ctx, chain, targetID, inode)
//	b, err := c.ReadReplica(ctx, chain, targetID, id, off, n)
//
// Errors: every method retries through reconfiguration (a dead or
// restarting storage service, a routing change, a chain head this client
// cannot reach) for Options.RetryTimeout (default FFKIT_RETRY_WINDOW, else
// 60 s) and then fails with an error that errors.Is
// fs.ErrUnavailable. A full target fails writes with fs.ErrNoSpace. Bad
// arguments (a range past MaxChunkSize, an unknown chain) fail at once with
// ErrBadRequest (errkind.Usage).
//
// Tokens: every connection proves it holds the cluster's secret token
// (without sending it) to a server that proved the same first, over TLS
// verified against the cluster CA off loopback (see fs/transport).
// LookupCluster finds the token and CA for a cluster address (FFKIT_TOKEN
// and FFKIT_TLS_DIR, then the user's ~/.config/ffkit/tokens.json written
// by `ffkit fs up` / `ffkit fs mgmtd`, keyed by the CA's fingerprint);
// RecordToken writes that file (mode 0600).
//
// # Concurrency and ownership
//
// A Client is safe for concurrent use by many goroutines; Close stops its
// background routing refresh and closes its connections. WriteChunk does not
// keep data after it returns. ReadChunks fills the caller's buffers and keeps
// no reference to them after it returns.
package client
