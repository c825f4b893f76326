package fs

import (
	"context"
	"io"
)

// Optional capabilities. An FS that can do more than publish whole files
// (Create + Commit) says so by implementing one of the small interfaces
// below; callers discover them with a type assertion, in the style of
// go-fuse's optional node interfaces:
//
//	if rw, ok := f.(fs.RandomAccessFS); ok { ... }
//
// The FUSE mount (package fs/fuse) needs RandomAccessFS to support writes
// at offsets, truncate, fsync and opening existing files for writing; over
// an FS without it the mount can still create new files written
// sequentially (published on close through Create + Commit).
//
// Implementations: fs/localfs implements both. The cluster file system
// (fs/clusterfs, over the chunk client's WriteChunk and TruncateChunk)
// should implement RandomAccessFS too, so that a mount of ffkit:// paths
// takes any POSIX write pattern, and StatFSer from its per-target capacity.

// Flags for OpenWrite, with the meaning of their os.O_* namesakes.
const (
	// OCreate creates the file if it does not exist.
	OCreate = 1 << iota
	// OExcl, with OCreate, fails with ErrExist if the file exists.
	OExcl
	// OTrunc truncates an existing file to zero length on open.
	OTrunc
)

// RandomAccessFS is an FS whose files can be opened for writing at any
// offset, like os.OpenFile with O_RDWR.
type RandomAccessFS interface {
	FS
	// OpenWrite opens name for reading and writing. flag is a combination
	// of OCreate, OExcl and OTrunc. The parent directory must exist.
	// A missing file without OCreate fails with ErrNotExist.
	OpenWrite(ctx context.Context, name string, flag int) (WriteFile, error)
	// Truncate sets the length of name, cutting or extending it with zeros.
	Truncate(ctx context.Context, name string, size int64) error
}

// WriteFile is a file open for reading and writing at any offset.
//
// Consistency contract (close-to-open): bytes written through a WriteFile
// are readable through the same WriteFile at once; they are visible to
// every other client (another process's Open, another mount, the CLI),
// with the file's new length, after Flush, Sync or Close returns without
// error, and durable after Sync returns. A writer that extends a file past another writer's end
// never shrinks it: the length is the largest end acknowledged.
//
// A WriteFile is safe for concurrent use (the FUSE kernel module issues
// writes and reads of one open file in parallel). A file removed while a
// WriteFile is open stays readable and writable through it (POSIX
// unlink-while-open); where the storage cannot keep an unlinked file's
// data, it documents so.
type WriteFile interface {
	File // ReadAt sees this handle's writes; Size is the current length
	io.WriterAt
	// Truncate sets the length, cutting or extending with zeros.
	Truncate(size int64) error
	// Flush makes the data written so far and the length visible to
	// other clients. The FUSE mount calls it on every close(2), so it
	// should cost little when nothing changed. It need not make data
	// durable beyond what the storage does on each write.
	Flush() error
	// Sync makes the data and the length durable and visible to others.
	Sync() error
}

// EmptyCreator is an FS that creates an empty file without opening it:
// the FUSE mount creates a file so and opens it for writing only when it
// is written, so open(O_CREAT) of a file closed unwritten costs the
// storage no write session.
type EmptyCreator interface {
	// CreateEmpty creates an empty file at name (with exclusive, an
	// existing one is ErrExist; without, it is left as it is), with the
	// owner in ctx (WithOwner) where the FS stores owners.
	CreateEmpty(ctx context.Context, name string, exclusive bool) error
}

// EmptyCreatorInfo is an EmptyCreator that also returns the file it
// created (or found, without exclusive) as Stat would right after, so a
// mount needs no Stat to learn its times.
type EmptyCreatorInfo interface {
	CreateEmptyInfo(ctx context.Context, name string, exclusive bool) (FileInfo, error)
}

// StatFSer is an FS that reports its capacity (for statfs(2), df).
type StatFSer interface {
	// StatFS reports the capacity of the storage holding name.
	StatFS(ctx context.Context, name string) (Usage, error)
}

// Usage is the capacity of a file system, in bytes.
type Usage struct {
	Total int64 `json:"total"`
	Free  int64 `json:"free"` // available to an unprivileged writer
	// Used is the bytes in use (statfs f_blocks - f_bfree, as df(1)
	// counts them); Total - Used - Free is reserved. 0: Total - Free.
	Used int64 `json:"used,omitempty"`
	// Files and FreeFiles count inodes; 0 means not limited or not known.
	Files     int64 `json:"files"`
	FreeFiles int64 `json:"free_files"`
}
