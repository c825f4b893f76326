package fs

import (
	"context"

	"github.com/ffkit/ffkit/internal/errkind"
)

// The POSIX side of a file system: node kinds other than files and
// directories, hard links, extended attributes, rename flags, and the
// owner new nodes get. Each is an optional interface (a backend that
// lacks one makes the FUSE mount answer ENOTSUP), as go-fuse's node
// capabilities are.

// Kind is the kind of a node that is neither a plain file nor a
// directory (FileInfo.Kind); 0 means a file or a directory (IsDir).
type Kind uint8

// Node kinds.
const (
	KindSymlink Kind = 3
	KindFIFO    Kind = 4
	KindSocket  Kind = 5
	KindChar    Kind = 6 // character device
	KindBlock   Kind = 7 // block device
)

// Errors of the POSIX operations.
var (
	// ErrNameTooLong: a path component is longer than 255 bytes.
	ErrNameTooLong = errkind.New(errkind.Usage, "fs: file name too long")
	// ErrNoAttr: the extended attribute does not exist (ENODATA).
	ErrNoAttr = errkind.New(errkind.Usage, "fs: no such attribute")
	// ErrNotPermitted: the operation is not allowed on this node (EPERM),
	// as a hard link to a directory.
	ErrNotPermitted = errkind.New(errkind.Usage, "fs: operation not permitted")
)

// MaxNameLen is the longest path component, in bytes.
const MaxNameLen = 255

// Owner is the mode and owner a new node gets.
type Owner struct {
	Perm uint32 // permission bits (& 07777)
	Uid  uint32
	Gid  uint32
}

type ownerKey struct{}

// WithOwner returns ctx carrying the owner that nodes created with it get
// (Create, OpenWrite with OCreate, MkdirAll's last directory, Symlink,
// Mknod) on a backend that stores owners; without one they get the
// backend's defaults.
func WithOwner(ctx context.Context, o Owner) context.Context {
	return context.WithValue(ctx, ownerKey{}, o)
}

// OwnerFrom returns the owner WithOwner put in ctx.
func OwnerFrom(ctx context.Context) (Owner, bool) {
	o, ok := ctx.Value(ownerKey{}).(Owner)
	return o, ok
}

// NodeMaker is an FS that stores symlinks, special files and hard links.
type NodeMaker interface {
	// Symlink creates name as a symbolic link to target.
	Symlink(ctx context.Context, target, name string) error
	// Readlink returns the target of the symbolic link name.
	Readlink(ctx context.Context, name string) (string, error)
	// Mknod creates a FIFO, socket or device node (rdev: the device number).
	Mknod(ctx context.Context, name string, kind Kind, rdev uint32) error
	// Link makes newname a second name of the file oldname.
	Link(ctx context.Context, oldname, newname string) error
}

// Rename flags (as renameat2(2)).
const (
	RenameNoReplace = 1 // fail with ErrExist if newname exists
	RenameExchange  = 2 // swap oldname and newname atomically
)

// RenameFlagger is an FS whose Rename takes renameat2's flags.
type RenameFlagger interface {
	RenameFlags(ctx context.Context, oldname, newname string, flags uint32) error
}

// Xattr flags (as setxattr(2)).
const (
	XattrCreate  = 1 // fail with ErrExist if the attribute exists
	XattrReplace = 2 // fail with ErrNoAttr if it does not
)

// Xattrer is an FS that stores extended attributes.
type Xattrer interface {
	GetXattr(ctx context.Context, name, attr string) ([]byte, error)
	ListXattr(ctx context.Context, name string) ([]string, error)
	SetXattr(ctx context.Context, name, attr string, value []byte, flags int) error
	RemoveXattr(ctx context.Context, name, attr string) error
}
