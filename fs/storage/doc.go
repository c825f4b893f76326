// Package storage is the storage service of the ffkit cluster: it holds
// several targets (directories on local disks), each the replica of one
// chain, and replicates updates along the chains with CRAQ as 3FS does.
//
// # Chunk store (one per target)
//
// A chunk (ChunkID) has a committed version and at most one pending
// version, each in its own file: <chunk id>.<version> when committed,
// <chunk id>.<version>.p while pending (copy on write: an update copies
// the committed file, in the kernel, and applies itself). A file is a
// header (version, chain version, length, flags, a CRC32C per 4 KiB
// block, the client request tags of the latest versions) followed, at HeaderSize, by the chunk's bytes; a read checks the
// CRC of every block it touches, so a 4 KiB read is verified without
// reading the chunk. On start a target keeps, per chunk, the newest
// committed file and a pending file of a newer version whose header
// verifies; everything else is a leftover and is removed.
//
// # Reads
//
// Reads of 64 KiB or more come from a shared read-only mapping of the
// committed file (immutable: a new version is a new file) and go out with
// sendfile(2), so the reply's bytes are never copied in this process. A
// read is verified against the block CRCs here, unless the client asks to
// verify it itself (proto.ReadIO.Sums) and it is block-aligned: then the
// target sends the stored block CRCs ahead of the bytes and does not read
// them at all, and the client checks each block as it arrives (while the
// bytes are in its cache). A client whose check fails reads the range
// again from the same target without Sums, so the target finds the
// corrupt chunk and leaves its chain for repair (see below), and the read
// fails over. Either way no caller ever gets bytes that fail their CRC.
//
// A client on the same host (equal proto.HostID: boot and mount namespace)
// may ask for a short-circuit read (proto.ReadIO.Local): the target then
// answers with the committed file's path, the bytes' offset in it and the
// block CRCs, and sends no bytes. The file never changes, so the client
// reads exactly the version the target answered for, or finds the file
// gone and reads again over the connection. The target tells whether the
// bytes are in its page cache (mincore on its mapping): if not, it does
// not read them in, and the client reads them with O_DIRECT.
// Config.NoLocalReads turns this off.
//
// # Durability model
//
// An update's pending file and its directory entry are fsynced before
// the update is acknowledged to anyone (the fsync runs while the update
// travels down the chain; directory fsyncs of concurrent updates are
// shared). Committing is a rename that is not fsynced: if a power loss
// undoes it, the version comes back pending, and recovery commits it (a
// head re-drives its pending versions; any other replica is resynced on
// restart). So an acknowledged write survives kill -9 and power loss of
// any replica, and is never rolled back. A write that does not fit fails
// with ErrNoSpace ("no space left on target N"), leaving nothing pending.
// CrashFS models a file system that loses everything not synced; the
// durability tests run on it.
//
// # Chain replication
//
// The client writes to the chain head. The head takes the chunk's write
// slot (one update of a chunk at a time per hop, in arrival order, until
// its local commit; a state, not a lock held across the network: a waiter
// whose caller gave up leaves the queue), finishes any pending version left over
// from a crashed writer, assigns version = committed + 1, writes it
// pending and forwards it to its successor, which does the same; the tail
// commits first and the commits flow back, each hop checking that its
// successor's version and whole-chunk checksum equal its own (and sending
// the whole chunk when they differ: the predecessor's data wins). Every
// hop rejects a request routed with another chain version. A syncing
// successor always receives whole chunks. Client request ids are
// remembered by every hop (the last 32 of a chunk, in each version's file
// header, carried by whole-content updates and resync transfers), so a
// retry is applied once even when it reaches a new head, one that
// restarted or one that was resynced since. Reads go to any serving target; a chunk with a pending
// version answers ErrNotCommitted.
//
// # Life cycle of a target
//
// A target starts in the restarting phase: it reports itself offline to
// mgmtd until mgmtd's routing shows it is not serving, then reports
// online; mgmtd makes it syncing and its predecessor resyncs it (every
// chunk where the two disagree in any way is sent whole and committed;
// chunks only the successor has are removed; a pending version the
// predecessor holds, such as an acknowledged write whose commit rename a
// power loss undid on a returning last serving target, is first finished
// by the head, never replaced by the older committed one), then it
// reports up to date and mgmtd makes it serving. A service that has not reached mgmtd for
// half the fail timeout (counted from when its last answered heartbeat
// was sent, which mgmtd cannot have heard earlier, however late the
// answer is processed) refuses every request and puts its targets back in
// the restarting phase, so a partitioned replica never serves stale data.
// A target whose disk fails an fsync, or that finds a corrupt chunk while
// another replica serves, leaves its chain the same way and is repaired
// by resync.
//
// Concurrency: a Service serves requests concurrently; per-chunk write
// slots order updates (independent chunks proceed in parallel), target mutexes guard the chunk maps. Close stops every
// goroutine it started.
package storage
