package fuse

import (
	"bytes"
	"context"
	"strings"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ffkit/ffkit/fs"
)

// The POSIX node operations: symlinks, special files, hard links,
// extended attributes and RENAME_EXCHANGE, on a backend that stores them
// (fs.NodeMaker, fs.Xattrer, fs.RenameFlagger); elsewhere they answer
// ENOTSUP (ENOSYS for xattrs, so the kernel stops asking).

var (
	_ gofs.NodeSymlinker     = (*node)(nil)
	_ gofs.NodeReadlinker    = (*node)(nil)
	_ gofs.NodeLinker        = (*node)(nil)
	_ gofs.NodeMknoder       = (*node)(nil)
	_ gofs.NodeGetxattrer    = (*node)(nil)
	_ gofs.NodeSetxattrer    = (*node)(nil)
	_ gofs.NodeListxattrer   = (*node)(nil)
	_ gofs.NodeRemovexattrer = (*node)(nil)
)

// autoIno: inode numbers above it are the mount's own (for backends
// without inode numbers, and new files not yet stored); below it they
// are the backend's (fs.FileInfo.Ino).
const autoIno = 1 << 56

// modeOf is the S_IFMT bits of a backend entry.
func modeOf(st fs.FileInfo) uint32 {
	switch st.Kind {
	case fs.KindSymlink:
		return syscall.S_IFLNK
	case fs.KindFIFO:
		return syscall.S_IFIFO
	case fs.KindSocket:
		return syscall.S_IFSOCK
	case fs.KindChar:
		return syscall.S_IFCHR
	case fs.KindBlock:
		return syscall.S_IFBLK
	}
	if st.IsDir {
		return syscall.S_IFDIR
	}
	return syscall.S_IFREG
}

// ownerContext is ctx carrying the owner a node created by the caller of
// fctx gets: the caller's uid and gid (the mounting user's if unknown)
// and the permission bits of mode (the kernel has applied the umask).
func (s *Server) ownerContext(ctx, fctx context.Context, mode uint32) context.Context {
	o := fs.Owner{Perm: mode & 0o7777, Uid: s.uid, Gid: s.gid}
	if c, ok := gofuse.FromContext(fctx); ok {
		o.Uid, o.Gid = c.Uid, c.Gid
	}
	return fs.WithOwner(ctx, o)
}

func (n *node) nodeMaker() (fs.NodeMaker, syscall.Errno) {
	if n.srv.opts.ReadOnly {
		return nil, syscall.EROFS
	}
	nm, ok := n.srv.backend.(fs.NodeMaker)
	if !ok {
		return nil, syscall.ENOTSUP
	}
	return nm, 0
}

// made answers a call that created the child name: its inode and attributes.
func (n *node) made(ctx context.Context, name, p string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := n.srv.backend.Stat(ctx, p)
	if err != nil {
		n.srv.mc.changed(p)
		return nil, n.srv.errno(err)
	}
	n.srv.mc.created(p, &st)
	n.srv.fillAttr(st, &out.Attr)
	return n.newChildOf(ctx, name, st), 0
}

func (n *node) Symlink(fctx context.Context, target, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	nm, errno := n.nodeMaker()
	if errno != 0 {
		return nil, errno
	}
	p, errno := n.childPath(name)
	if errno != 0 {
		return nil, errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	n.srv.pend.wait(ctx, p)
	err := nm.Symlink(n.srv.ownerContext(ctx, fctx, 0o777), target, p)
	if err != nil {
		n.srv.mc.changed(p)
		return nil, n.srv.errno(err)
	}
	return n.made(ctx, name, p, out)
}

func (n *node) Readlink(context.Context) ([]byte, syscall.Errno) {
	nm, ok := n.srv.backend.(fs.NodeMaker)
	if !ok {
		return nil, syscall.EINVAL
	}
	p, errno := n.path()
	if errno != 0 {
		return nil, errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	t, err := nm.Readlink(ctx, p)
	if err != nil {
		return nil, n.srv.errno(err)
	}
	return []byte(t), 0
}

func (n *node) Mknod(fctx context.Context, name string, mode, dev uint32, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	nm, errno := n.nodeMaker()
	if errno != 0 {
		return nil, errno
	}
	var kind fs.Kind
	switch mode & syscall.S_IFMT {
	case syscall.S_IFIFO:
		kind = fs.KindFIFO
	case syscall.S_IFSOCK:
		kind = fs.KindSocket
	case syscall.S_IFCHR:
		kind = fs.KindChar
	case syscall.S_IFBLK:
		kind = fs.KindBlock
	default:
		// Regular files come through Create; anything else is unknown.
		return nil, syscall.EPERM
	}
	p, errno := n.childPath(name)
	if errno != 0 {
		return nil, errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	n.srv.pend.wait(ctx, p)
	err := nm.Mknod(n.srv.ownerContext(ctx, fctx, mode), p, kind, dev)
	if err != nil {
		n.srv.mc.changed(p)
		return nil, n.srv.errno(err)
	}
	return n.made(ctx, name, p, out)
}

func (n *node) Link(_ context.Context, target gofs.InodeEmbedder, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	nm, errno := n.nodeMaker()
	if errno != 0 {
		return nil, errno
	}
	tn, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	src, errno := tn.path()
	if errno != 0 {
		return nil, errno
	}
	p, errno := n.childPath(name)
	if errno != 0 {
		return nil, errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	n.srv.pend.wait(ctx, p)
	err := nm.Link(ctx, src, p)
	n.srv.mc.created(p, nil) // a new name: the parent's times change too
	n.srv.mc.changed(src)    // its link count
	if err != nil {
		return nil, n.srv.errno(err)
	}
	st, err := tn.describe(ctx, p)
	if err != nil {
		return nil, n.srv.errno(err)
	}
	n.srv.fillAttr(st, &out.Attr)
	// The new name is the same inode (the kernel expects it back).
	return tn.EmbeddedInode(), 0
}

// exchange is rename(2) with RENAME_EXCHANGE.
func (n *node) exchange(rf fs.RenameFlagger, name string, newParent gofs.InodeEmbedder, newName string) syscall.Errno {
	np, oldp, newp, errno := n.renamePaths(name, newParent, newName)
	if errno != 0 {
		return errno
	}
	if beingWritten(n.GetChild(name)) || beingWritten(np.GetChild(newName)) {
		return syscall.EBUSY
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	n.srv.pend.waitUnder(ctx, "")
	err := rf.RenameFlags(ctx, oldp, newp, fs.RenameExchange)
	for _, p := range []string{oldp, newp} { // each name is now the other node (and its subtree)
		n.srv.mc.removed(p, true)
		n.srv.mc.changed(p)
	}
	if err != nil {
		return n.srv.errno(err)
	}
	return 0
}

// Only user.* attributes are stored. The kernel asks for security.* ones
// (security.capability before every write): those are answered here,
// without a storage round trip.
const userXattr = "user."

func (n *node) xattrer() (fs.Xattrer, string, syscall.Errno) {
	x, ok := n.srv.backend.(fs.Xattrer)
	if !ok {
		return nil, "", syscall.ENOSYS
	}
	p, errno := n.path()
	return x, p, errno
}

func (n *node) Getxattr(_ context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if !strings.HasPrefix(attr, userXattr) {
		if _, ok := n.srv.backend.(fs.Xattrer); !ok {
			return 0, syscall.ENOSYS
		}
		return 0, syscall.ENODATA
	}
	x, p, errno := n.xattrer()
	if errno != 0 {
		return 0, errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	v, err := x.GetXattr(ctx, p, attr)
	if err != nil {
		return 0, n.srv.errno(err)
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

// xattrChanger is the prelude of a change to the attribute attr: EROFS on a
// read-only mount, then as xattrer, then notUser for a name outside
// user.*.
func (n *node) xattrChanger(attr string, notUser syscall.Errno) (fs.Xattrer, string, syscall.Errno) {
	if n.srv.opts.ReadOnly {
		return nil, "", syscall.EROFS
	}
	x, p, errno := n.xattrer()
	if errno != 0 {
		return nil, "", errno
	}
	if !strings.HasPrefix(attr, userXattr) {
		return nil, "", notUser
	}
	return x, p, 0
}

func (n *node) Setxattr(_ context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	x, p, errno := n.xattrChanger(attr, syscall.ENOTSUP)
	if errno != 0 {
		return errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	var f int
	if flags&0x1 != 0 { // XATTR_CREATE
		f |= fs.XattrCreate
	}
	if flags&0x2 != 0 { // XATTR_REPLACE
		f |= fs.XattrReplace
	}
	return n.srv.errno(x.SetXattr(ctx, p, attr, data, f))
}

func (n *node) Listxattr(_ context.Context, dest []byte) (uint32, syscall.Errno) {
	x, p, errno := n.xattrer()
	if errno != 0 {
		return 0, errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	names, err := x.ListXattr(ctx, p)
	if err != nil {
		return 0, n.srv.errno(err)
	}
	var b bytes.Buffer
	for _, a := range names {
		b.WriteString(a)
		b.WriteByte(0)
	}
	if len(dest) < b.Len() {
		return uint32(b.Len()), syscall.ERANGE
	}
	return uint32(copy(dest, b.Bytes())), 0
}

func (n *node) Removexattr(_ context.Context, attr string) syscall.Errno {
	x, p, errno := n.xattrChanger(attr, syscall.ENODATA)
	if errno != 0 {
		return errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	return n.srv.errno(x.RemoveXattr(ctx, p, attr))
}

// newFileInfo describes a file just created with ctx (from
// ownerContext): on a backend that stores owners, with the mode and
// owner it was created with.
func (s *Server) newFileInfo(ctx context.Context, name string) fs.FileInfo {
	st := fs.FileInfo{Name: name}
	if _, ok := s.backend.(fs.AttrSetter); ok {
		if o, ok := fs.OwnerFrom(ctx); ok {
			st.Perm, st.Uid, st.Gid, st.HasOwner = o.Perm, o.Uid, o.Gid, true
		}
	}
	return st
}

var _ gofs.NodeAllocater = (*node)(nil)

// Allocate is fallocate(2) modes 0 and FALLOC_FL_KEEP_SIZE. Mode 0 extends
// the file to off+size when it is shorter (the new bytes read as zeros,
// as a truncate that grows); the storage reserves no space ahead, so a
// later write can still fail with ENOSPC. KEEP_SIZE has nothing to do.
// Other modes (punching holes, zeroing, collapsing ranges) answer
// EOPNOTSUPP, as on file systems that lack them.
func (n *node) Allocate(_ context.Context, fh gofs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	const keepSize = 1 // FALLOC_FL_KEEP_SIZE
	if mode&^keepSize != 0 {
		return syscall.EOPNOTSUPP
	}
	if n.srv.opts.ReadOnly {
		return syscall.EROFS
	}
	end := off + size
	if end < off || end > 1<<62 {
		return syscall.EFBIG
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	st, errno := n.stat(ctx, fh)
	if errno != 0 {
		return errno
	}
	if st.IsDir || st.Kind != 0 {
		return syscall.ENODEV // as Linux answers for anything but a regular file
	}
	if mode&keepSize != 0 || int64(end) <= st.Size {
		return 0
	}
	if errno := n.truncate(ctx, int64(end)); errno != 0 {
		return errno
	}
	n.invalidate()
	return 0
}
