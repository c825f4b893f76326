package meta

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"strings"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/internal/errkind"
)

// Type is an inode's type.
type Type uint8

// Inode types.
// Types 3-7 are metadata-only (no layout, no chunks); their numbers are
// fs.Kind's.
const (
	TypeFile    Type = 1
	TypeDir     Type = 2
	TypeSymlink Type = 3
	TypeFIFO    Type = 4
	TypeSocket  Type = 5
	TypeChar    Type = 6
	TypeBlock   Type = 7
)

// Layout says where a file's chunks live: chunk i is on Chains[i %
// len(Chains)], chosen when the file is created.
type Layout struct {
	ChunkSize int64           `json:"chunk_size"`
	Chains    []proto.ChainID `json:"chains"`
}

// Chain returns the chain holding chunk index.
func (l *Layout) Chain(index uint64) proto.ChainID {
	return l.Chains[index%uint64(len(l.Chains))]
}

// Inode is a file or directory.
type Inode struct {
	ID   uint64 `json:"id"`
	Type Type   `json:"type"`
	// Parent and Name are the name the inode was published under, updated
	// by rename. A file with hard links has other names too (Nlink counts
	// them): when this one is removed, Name becomes "" and Parent stays
	// (0 means a new file not yet published, or an unlinked one).
	Parent uint64 `json:"parent"`
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	MTime  int64  `json:"mtime"` // unix nanoseconds
	// ATime and CTime: access and change times, unix nanoseconds (0 for
	// inodes stored before they were kept: MTime is reported).
	ATime int64 `json:"atime,omitempty"`
	CTime int64 `json:"ctime,omitempty"`
	// Rdev is a device node's device number; Target a symlink's target.
	Rdev   uint32 `json:"rdev,omitempty"`
	Target string `json:"target,omitempty"`
	// Xattrs are the extended attributes (user.* names).
	Xattrs map[string][]byte `json:"xattrs,omitempty"`
	// TruncVer counts shrinking truncates (a length report made before one
	// is ignored).
	TruncVer uint64  `json:"truncver,omitempty"`
	Layout   *Layout `json:"layout,omitempty"`
	Nlink    int     `json:"nlink"`
	// Holes: the file was opened for writing at offsets, so ranges inside
	// its length may never have been written (they read as zeros).
	// Files written sequentially and published whole have no holes, and
	// a reader treats missing bytes in them as lost data.
	Holes bool `json:"holes,omitempty"`
	// Perm (permission bits), Uid and Gid are stored once set by SetAttr
	// (Owned); before that a mount reports its defaults.
	Perm  uint32 `json:"perm,omitempty"`
	Uid   uint32 `json:"uid,omitempty"`
	Gid   uint32 `json:"gid,omitempty"`
	Owned bool   `json:"owned,omitempty"`
}

// linkName reports whether (parent, name) is the name the inode keeps its
// dentry copies of size and time fresh under.
func (n *Inode) linked() bool { return n.Parent != 0 && n.Name != "" }

// IsDir reports whether the inode is a directory.
func (n *Inode) IsDir() bool { return n.Type == TypeDir }

// Dentry is a directory entry.
type Dentry struct {
	Inode uint64 `json:"inode"`
	IsDir bool   `json:"is_dir"`
	// Type is the inode's type (0 in entries stored before types 3-7:
	// a file or directory as IsDir says).
	Type  Type  `json:"type,omitempty"`
	Size  int64 `json:"size"`
	MTime int64 `json:"mtime"`
	// Owned: the inode stores permission bits and owner (Inode.Owned);
	// without, the entry has the defaults.
	Owned bool `json:"owned,omitempty"`
	// Shared: the file had more than one name when the entry was
	// written, so a change through another name may have left the
	// entry's copies stale: a listing reads the inode.
	Shared bool `json:"shared,omitempty"`
	// Perm, Uid and Gid are copies of the inode's, set when Owned (in
	// entries written before copies were kept, a listing reads them from
	// the inode: hasOwner is false).
	Perm     uint32 `json:"perm,omitempty"`
	Uid      uint32 `json:"uid,omitempty"`
	Gid      uint32 `json:"gid,omitempty"`
	hasOwner bool
}

// Entry is a listed directory entry. Perm, Uid and Gid (in Dentry) are
// the inode's, set when Owned.
type Entry struct {
	Name string `json:"name"`
	Dentry
	// Layout and Holes are a regular file's, set when the listing read
	// its inode (Options.ListLayouts): with them (and Size, then the
	// inode's) the file can be opened from the listing with no Stat (a
	// mount answering lookups from a listing opens its files without a
	// round trip).
	Layout *Layout `json:"layout,omitempty"`
	Holes  bool    `json:"holes,omitempty"`
}

type session struct {
	Client  string `json:"client"`
	Expires int64  `json:"expires"`
}

type idem struct {
	Result []byte `json:"result"`
	At     int64  `json:"at"`
}

type gcRecord struct {
	Inode     uint64 `json:"inode"`
	Layout    Layout `json:"layout"`
	FromIndex uint64 `json:"from"`
	// Delete: the inode goes too (removed file); otherwise a truncate.
	Delete bool `json:"delete"`
	// Size is the new length of a truncated file: its last chunk is cut there.
	Size   int64 `json:"size,omitempty"`
	Queued int64 `json:"queued"`
}

type serverRec struct {
	Addr    string `json:"addr"`
	Expires int64  `json:"expires"`
}

// Error is a metadata error that crosses the wire by code and unwraps to
// its sentinel (fs.ErrNotExist, fs.ErrExist, ErrNotEmpty...).
type Error struct {
	Code string
	Msg  string
	Base error
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Base }

// WireCode is the code the transport carries.
func (e *Error) WireCode() string { return e.Code }

// Sentinel errors (besides io/fs's ErrNotExist and ErrExist).
var (
	ErrNotEmpty = errkind.New(errkind.Usage, "meta: directory not empty")
	ErrNotDir   = errkind.New(errkind.Usage, "meta: not a directory")
	ErrIsDir    = errkind.New(errkind.Usage, "meta: is a directory")
	ErrInvalid  = errkind.New(errkind.Usage, "meta: invalid argument")
	ErrBusy     = errkind.New(errkind.Unavailable, "meta: file busy")
	ErrNoChains = errkind.New(errkind.Unavailable, "meta: the cluster has no chains yet")
	// ErrNameTooLong, ErrNoAttr and ErrNotPermitted are the fs package's,
	// so callers above fs/clusterfs test them without importing meta.
	ErrNameTooLong  = fs.ErrNameTooLong
	ErrNoAttr       = fs.ErrNoAttr
	ErrNotPermitted = fs.ErrNotPermitted
)

var codes = map[string]error{
	"meta/notexist": iofs.ErrNotExist,
	"meta/exist":    iofs.ErrExist,
	"meta/notempty": ErrNotEmpty,
	"meta/notdir":   ErrNotDir,
	"meta/isdir":    ErrIsDir,
	"meta/invalid":  ErrInvalid,
	"meta/busy":     ErrBusy,
	"meta/nochains": ErrNoChains,
	"meta/toolong":  ErrNameTooLong,
	"meta/noattr":   ErrNoAttr,
	"meta/perm":     ErrNotPermitted,
}

func init() {
	for c, e := range codes {
		transport.RegisterCode(c, e)
	}
}

func merr(base error, format string, args ...any) error {
	code := ""
	for c, e := range codes {
		if e == base {
			code = c
		}
	}
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...) + ": " + baseMsg(base), Base: base}
}

func baseMsg(e error) string {
	switch {
	case errors.Is(e, iofs.ErrNotExist):
		return "no such file or directory"
	case errors.Is(e, iofs.ErrExist):
		return "file exists"
	}
	return strings.TrimPrefix(e.Error(), "meta: ")
}

// splitPath checks an absolute slash path and returns its components.
func splitPath(p string) ([]string, error) {
	if !strings.HasPrefix(p, "/") {
		return nil, merr(ErrInvalid, "meta: path %q is not absolute", p)
	}
	var out []string
	for _, c := range strings.Split(p, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return nil, merr(ErrInvalid, "meta: path %q: \"..\" is not allowed", p)
		}
		if len(c) > fs.MaxNameLen {
			return nil, merr(ErrNameTooLong, "meta: path %q: name of %d bytes", p, len(c))
		}
		if strings.ContainsRune(c, 0) {
			return nil, merr(ErrInvalid, "meta: path %q: bad name %q", p, c)
		}
		out = append(out, c)
	}
	return out, nil
}

// Chunks is what the metadata service needs of the data plane: the chain
// table for new layouts, and chunk removal for garbage collection.
// *client.Client implements it.
type Chunks interface {
	Chains() []proto.ChainID
	ChunkSize() int64
	RemoveChunks(ctx context.Context, chain proto.ChainID, inode uint64, fromIndex uint64) error
	TruncateChunk(ctx context.Context, chain proto.ChainID, id proto.ChunkID, length int64) error
}

func nowNano() int64 { return time.Now().UnixNano() }
