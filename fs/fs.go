// Package fs is the one storage interface of ffkit. Every package above it
// (ffrecord, loader, scan, bench) reads and writes through FS, so the same
// code runs on a local disk (package fs/localfs) and on the ffkit cluster
// (package fs/client, registered for the ffkit:// scheme).
//
// Paths inside an FS are slash-separated. Resolve turns a user's path, a
// local path or a URL such as ffkit://host:port/data/train, into an FS and
// a path inside it.
//
// Concurrency: every FS and File method is safe for concurrent use. A Writer
// belongs to one goroutine.
//
// Ownership: ReadBatch fills the caller's buffers and keeps no reference to
// them after it returns.
package fs

import (
	"context"
	"io"
	iofs "io/fs"
	"time"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Errors shared by every implementation. ErrNotExist and ErrExist are the
// standard library's, so os and io/fs checks work on every FS.
var (
	ErrNotExist = iofs.ErrNotExist
	ErrExist    = iofs.ErrExist
	// ErrUnavailable: the storage could not be reached (a dead server, a
	// cluster that is reconfiguring for longer than the retry budget).
	ErrUnavailable = errkind.New(errkind.Unavailable, "fs: storage unavailable")
	// ErrShortRead: a ranged read asked for bytes past the end of the file.
	ErrShortRead = errkind.New(errkind.Data, "fs: read past end of file")
	// ErrNoSpace: the storage is full; nothing was published.
	ErrNoSpace = errkind.New(errkind.Unavailable, "fs: no space left")
)

// FS is a file system that ffkit stores datasets on.
type FS interface {
	// Open opens a file for reading.
	Open(ctx context.Context, name string, opts OpenOptions) (File, error)
	// Create starts writing a file. Nothing is visible under name until
	// Writer.Commit; a Writer closed without Commit leaves no trace.
	// An existing file is replaced atomically on Commit.
	Create(ctx context.Context, name string) (Writer, error)
	// Stat describes a file or directory.
	Stat(ctx context.Context, name string) (FileInfo, error)
	// List lists a directory, sorted by name as plain byte strings.
	List(ctx context.Context, dir string) ([]FileInfo, error)
	// MkdirAll creates a directory and its missing parents.
	MkdirAll(ctx context.Context, dir string) error
	// Rename moves oldname to newname atomically, replacing a file there.
	Rename(ctx context.Context, oldname, newname string) error
	// Remove removes a file or an empty directory.
	Remove(ctx context.Context, name string) error
	// ReadBatch reads many byte ranges, possibly of many files, in one
	// call. Each request's Buf is filled completely; a range past the end
	// of its file fails with ErrShortRead. Implementations reorder, merge
	// and parallelise the reads as suits the storage (the cluster client
	// groups them per storage service), with bounded parallelism.
	ReadBatch(ctx context.Context, reqs []ReadRequest) error
	// String names the file system for messages ("local", "ffkit://h:p").
	String() string
}

// OpenOptions tune how a file is read.
type OpenOptions struct {
	// Direct bypasses the page cache (O_DIRECT) where the storage supports
	// it. Reads stay byte-addressed: alignment is handled inside. Default false.
	Direct bool
}

// File is an open file.
type File interface {
	io.ReaderAt
	io.Closer
	// Size is the file's length when it was opened.
	Size() int64
	// Name is the path the file was opened with.
	Name() string
}

// ReadRequest asks for len(Buf) bytes of File at Off.
type ReadRequest struct {
	File File
	Off  int64
	Buf  []byte
}

// Writer writes a new file. Writes are sequential.
type Writer interface {
	io.Writer
	// Commit flushes, makes the data durable and publishes the file under
	// its name atomically.
	Commit() error
	// Close abandons an uncommitted file; after Commit it is a no-op.
	Close() error
}

// FileInfo describes a file or directory.
type FileInfo struct {
	Name    string    `json:"name"` // base name
	Size    int64     `json:"size"`
	IsDir   bool      `json:"is_dir"`
	ModTime time.Time `json:"mod_time"`
	// Perm, Uid and Gid are the stored permission bits and owner, valid
	// when HasOwner; a backend that stores none leaves HasOwner false (a
	// mount then reports its own defaults).
	Perm     uint32 `json:"perm,omitempty"`
	Uid      uint32 `json:"uid,omitempty"`
	Gid      uint32 `json:"gid,omitempty"`
	HasOwner bool   `json:"has_owner,omitempty"`
	// The POSIX attributes of a backend that stores them (fs/posix.go):
	// the node's kind when not a plain file or directory, link count,
	// inode number, device number, access and change times (zero: unknown).
	Kind  Kind      `json:"kind,omitempty"`
	Nlink uint32    `json:"nlink,omitempty"`
	Ino   uint64    `json:"ino,omitempty"`
	Rdev  uint32    `json:"rdev,omitempty"`
	ATime time.Time `json:"atime,omitzero"`
	CTime time.Time `json:"ctime,omitzero"`
	// Sys is the backend's own description of the file, for InfoOpener
	// (nil when it has none).
	Sys any `json:"-"`
}

// InfoOpener is an FS that can open a file from what its Stat returned a
// moment ago, without asking its metadata again (on the cluster: one
// metadata round trip less per open, as the FUSE mount's OPEN follows the
// kernel's LOOKUP). The file opened is the one fi describes, as of that
// Stat; false if fi cannot be opened so (then call Open).
type InfoOpener interface {
	OpenInfo(name string, fi FileInfo, opts OpenOptions) (File, bool)
}

// InfoFile is a File that describes the file it opened, as of its open,
// with no round trip (the FUSE mount tells by it whether the kernel's
// cached pages are of the same version).
type InfoFile interface {
	File
	Info() FileInfo
}

// AttrChange changes a file's permission bits, owner and times; nil
// fields stay.
type AttrChange struct {
	Perm, Uid, Gid *uint32
	ATime, MTime   *time.Time
}

// AttrSetter is an FS that stores permission bits and owners (chmod,
// chown). The first change of a file that had none fills the others from
// defaults (0644 files, 0755 directories, owner 0).
type AttrSetter interface {
	SetAttr(ctx context.Context, name string, c AttrChange) (FileInfo, error)
}
