package meta

import "github.com/ffkit/ffkit/fs"

// Method numbers of the metadata service (mgmtd answers 1-15, storage
// 16-47, meta 48-79).
const (
	MStat uint16 = 48 + iota
	MStatInode
	MReaddir
	MMkdir
	MCreate
	MRemove
	MRename
	MBeginFile
	MCommitFile
	MAbandonFile
	MExtend
	MCloseSession
	MOpenWrite
	MTruncate
	MSetAttr
	MMknod
	MLink
	MXattr
)

// Request is the header of every metadata call; each method reads the
// fields it needs.
type Request struct {
	// ReqID makes create, mkdir, remove, rename and commit idempotent: a
	// retry with the same id returns the first outcome.
	ReqID    string `json:"req,omitempty"`
	Path     string `json:"path,omitempty"`
	Dst      string `json:"dst,omitempty"`
	Inode    uint64 `json:"inode,omitempty"`
	Session  string `json:"session,omitempty"`
	Client   string `json:"client,omitempty"`
	Size     int64  `json:"size,omitempty"`
	TruncVer uint64 `json:"truncver,omitempty"`
	// Parents (mkdir -p), Exclusive (O_EXCL), Create (O_CREAT).
	Parents   bool `json:"parents,omitempty"`
	Exclusive bool `json:"excl,omitempty"`
	Create    bool `json:"create,omitempty"`
	// Perm, Uid, Gid: SetAttr's changes (nil: unchanged).
	Perm *uint32 `json:"perm,omitempty"`
	Uid  *uint32 `json:"uid,omitempty"`
	Gid  *uint32 `json:"gid,omitempty"`
	// ATime, MTime: SetAttr's new times, unix ns (nil: unchanged).
	ATime *int64 `json:"atime,omitempty"`
	MTime *int64 `json:"mtime,omitempty"`
	// Owner: the mode and owner of a new node (nil: none stored).
	Owner *fs.Owner `json:"owner,omitempty"`
	// Flags: rename's (fs.RenameNoReplace, fs.RenameExchange) or
	// setxattr's (fs.XattrCreate, fs.XattrReplace).
	Flags uint32 `json:"flags,omitempty"`
	// Type, Target, Rdev: mknod's node type, symlink target, device number.
	Type   Type   `json:"type,omitempty"`
	Target string `json:"target,omitempty"`
	Rdev   uint32 `json:"rdev,omitempty"`
	// Op, Name, Value: an xattr change (XattrSet, XattrRemove).
	Op    int    `json:"op,omitempty"`
	Name  string `json:"name,omitempty"`
	Value []byte `json:"value,omitempty"`
}

// Response is the header of every metadata reply.
type Response struct {
	Inode   *Inode  `json:"inode,omitempty"`
	Session string  `json:"session,omitempty"`
	Entries []Entry `json:"entries,omitempty"`
}
