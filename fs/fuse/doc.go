// Package fuse serves any fs.FS (local files, the ffkit cluster) as a FUSE
// file system, on github.com/hanwen/go-fuse/v2, so that every POSIX
// program (fio, dd, DuckDB, pyarrow, PyTorch, a shell) can use it.
//
// What it supports: regular files and directories; lookup, stat, readdir
// (READDIRPLUS answered from the listing, no stat per entry), create,
// mkdir, unlink, rmdir, rename (including over an existing file), truncate,
// fsync, statfs. Writes at any offset, truncate and opening an existing
// file for writing need the backend to implement fs.RandomAccessFS; over
// other backends a new file can still be written sequentially and is
// published when it is closed (fs.FS Create + Commit). Modes, owners and
// times cannot be set (chmod, chown and utimes succeed and change nothing):
// every file is 0644 and every directory 0755, owned by the mounting user.
//
// Consistency is close-to-open, as NFS: when close(2) returns, the data
// written through the mount is visible to every other client (FLUSH calls
// fs.WriteFile.Flush), and open(2) sees the latest committed state (entry
// and attribute timeouts default to 0, so the kernel revalidates the path on
// open, and an open drops the kernel's cached pages of the file unless they
// are of the very version it opens: kcache.go). Options.AttrTimeout trades this for fewer metadata round trips:
// names, attributes, missing names and listings are then cached for that
// long by the kernel and by the mount (metacache.go), this mount's own
// changes are seen at once and other clients' within AttrTimeout, and
// unlinks are pipelined (pending.go). `ffkit fs mount` uses 1s.
//
// The data path, and why it is fast:
//   - Requests are up to Options.MaxRequest (1 MiB, the kernel's 256-page
//     limit) and the reply is written from Go memory with writev: go-fuse's
//     splice path is never used, so the request size is not bounded by the
//     pipe size and fs.pipe-max-size need not be raised.
//   - Reads are asynchronous (CAP_ASYNC_READ) with up to
//     Options.MaxBackground requests in flight from the kernel.
//   - Concurrent reads are gathered into one fs.FS.ReadBatch call (the
//     cluster client turns a batch into a few merged requests per storage
//     service): each dispatcher takes whatever reads are queued, up to
//     Options.MaxBatch, without waiting for more.
//   - A handle read sequentially gets a read-ahead window of
//     Options.ReadAhead bytes, fetched as Options.ReadAheadBlock-sized
//     reads in parallel, so a single-threaded reader is served from memory
//     while the storage works on the next blocks. Its buffers sit on
//     transparent huge pages (arena.go) and replies are written from them.
//     O_DIRECT reads bypass the kernel's read-ahead: this one carries them.
//   - A small file opened for reading is fetched whole (Options.ReadWhole;
//     its chunks read with O_DIRECT, as it is cached once, here) and the
//     open returns at once (FOPEN_KEEP_CACHE): each piece is written into
//     the kernel's page cache as it arrives (FUSE_NOTIFY_STORE), and the
//     reads of pages not stored yet are served from the same fetch. The
//     next open of the unchanged file (inode, length, mtime and ctime) keeps
//     those pages and fetches nothing (kcache.go).
//   - Writes are gathered per open file into aligned 4 MiB windows
//     (Options.WriteBuffer) and stored in the background, a few at once
//     (Options.WriteBehind), in order; everything is stored before close,
//     fsync, truncate, a read through the handle or release returns, and a
//     failed background write is reported by the next write, close or fsync.
//
// Failure: every backend call runs under a deadline (Options.Timeout), so a
// mount whose storage disappeared returns errors (ETIMEDOUT, EIO) and never
// hangs its callers forever. Errors become errno values in one function,
// Errno.
//
// Concurrency: a Server serves requests on many goroutines; all of its
// methods are safe for concurrent use. The goroutines it starts
// (dispatchers, read-ahead fetches) are stopped by Unmount/Wait.
package fuse
