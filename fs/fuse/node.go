package fuse

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ffkit/ffkit/fs"
)

// node is a file or directory of the mount. It holds no path: its path is
// found from go-fuse's tree on every call, so a rename anywhere above it
// is seen at once.
type node struct {
	gofs.Inode
	srv *Server

	mu sync.Mutex
	// wf is the one backend write file shared by every write handle of
	// this node, so that reads, stats and truncates of the node see all
	// of their writes. Opened by the first write open, closed by the last
	// release (wfRefs counts them). Guarded by mu.
	wf     fs.WriteFile
	wfRefs int
	// wb gathers the writes of wf (nil when write-behind is off). Set and
	// cleared with wf; guarded by mu.
	wb *writeBuffer
	// closing is closed when the last write file released (and being
	// closed) is closed: until then its write session holds the file, so
	// a truncate or a new write open waits for it. Guarded by mu.
	closing chan struct{}
	// seq is a new file written sequentially over a backend without
	// fs.RandomAccessFS, published on flush. Guarded by mu.
	seq *seqHandle
	// Times. The storage keeps its own modification times, which differ
	// from the times of this mount's writes (a write is stored later, in
	// the background, or on close). So that a file reports one time
	// consistently, before and after its last writer closes it and after
	// it is unlinked while open:
	//
	// mtime is the time of the last write through this mount while a
	// write file (or seq) is open; zero if none. Guarded by mu.
	mtime time.Time
	// kept pairs the storage's time read right after this mount's last
	// writer closed the file (keptStorage) with the time of that writer's
	// last write (keptMount): while the storage still reports keptStorage
	// the file has not changed since, and keptMount is reported. Guarded
	// by mu.
	keptStorage, keptMount time.Time
	// last is the description last reported to the kernel (lastOK once
	// set): a node unlinked while open keeps reporting it. Guarded by mu.
	last   fs.FileInfo
	lastOK bool
	// epoch counts the starts and ends of releases of the write file (see
	// describe). Guarded by mu.
	epoch uint64
	// looked is what the backend said of the node at its last LOOKUP
	// (at lookedAt, in epoch lookedEpoch), for the OPEN that follows it
	// (see openLooked); a change through this mount (touch, a release)
	// voids it. Guarded by mu.
	looked      fs.FileInfo
	lookedAt    time.Time
	lookedEpoch uint64
	// landing is closed when this mount's create of the file, answered
	// before it reached the storage, has reached it (see createAsync);
	// nil when none is in flight. Guarded by mu.
	landing chan struct{}
	// kc tracks the node's pages in the kernel's cache (kcache.go).
	kc kernelCache
}

var (
	_ gofs.NodeLookuper       = (*node)(nil)
	_ gofs.NodeGetattrer      = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRmdirer        = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeStatfser       = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
)

// relPath is the node's path relative to the mount root; ok is false for
// a node no longer in the tree (unlinked while open).
func (n *node) relPath() (string, bool) {
	root := n.Root()
	var segs []string
	p := n.EmbeddedInode()
	for p != root {
		name, parent := p.Parent()
		if parent == nil || len(segs) > maxDepth {
			// Unlinked, or a cycle in the kernel's view of the tree (a
			// directory seen under two parents while renames land):
			// never loop.
			return "", false
		}
		segs = append(segs, name)
		p = parent
	}
	slices.Reverse(segs)
	return strings.Join(segs, "/"), true
}

// maxDepth bounds the depth of a path (PATH_MAX allows 2048 levels of
// one-byte names).
const maxDepth = 4096

// path is the node's backend path.
func (n *node) path() (string, syscall.Errno) {
	n.waitLanded() // an operation on the file finds it in the storage
	rel, ok := n.relPath()
	if !ok {
		return "", syscall.ENOENT
	}
	return n.srv.backendPath(rel), 0
}

func (n *node) childPath(name string) (string, syscall.Errno) {
	p, errno := n.path()
	if errno != 0 {
		return "", errno
	}
	if strings.HasSuffix(p, "/") {
		// The root of a mount of "/": "/d", as the child's own path()
		// spells it (not "//d": the pending unlinks and the cache are
		// keyed by path, and rmdir waited for none under "//d").
		return p + name, 0
	}
	return p + "/" + name, 0
}

// fillAttr describes a backend file or directory.
func (s *Server) fillAttr(st fs.FileInfo, a *gofuse.Attr) {
	mode := uint32(syscall.S_IFREG | 0o644)
	nlink := uint32(1)
	if st.IsDir {
		mode = syscall.S_IFDIR | 0o755
		nlink = 2
	}
	if st.Kind != 0 {
		mode = modeOf(st) | 0o644
	}
	if st.Nlink > 0 {
		nlink = st.Nlink
	}
	if s.opts.ReadOnly {
		mode &^= 0o222
	}
	a.Mode = mode
	a.Nlink = nlink
	a.Size = uint64(max(st.Size, 0))
	a.Blocks = (a.Size + 511) / 512
	a.Blksize = uint32(s.opts.MaxRequest) // cp and stdio size their buffers by it
	a.Owner = gofuse.Owner{Uid: s.uid, Gid: s.gid}
	if st.HasOwner {
		a.Mode = mode&syscall.S_IFMT | st.Perm&0o7777
		if s.opts.ReadOnly {
			a.Mode &^= 0o222
		}
		a.Owner = gofuse.Owner{Uid: st.Uid, Gid: st.Gid}
	}
	if st.Kind == fs.KindSymlink {
		a.Mode = syscall.S_IFLNK | 0o777 // as Linux reports every symlink
	}
	a.Rdev = st.Rdev
	t := st.ModTime
	if t.IsZero() {
		t = time.Unix(0, 0)
	}
	at, ct := st.ATime, st.CTime
	if at.IsZero() {
		at = t
	}
	if ct.IsZero() {
		ct = t
	}
	a.SetTimes(&at, &t, &ct)
}

// stat describes the node: from the open write file if any (it has the
// newest length), else from the backend; a node unlinked while open keeps
// what it reported last. See node.report for the times.
func (n *node) stat(ctx context.Context, fh gofs.FileHandle) (fs.FileInfo, syscall.Errno) {
	// A release closing the write file changes the storage's length and
	// time: answer after it, not in the middle.
	n.waitClosed(ctx)
	n.mu.Lock()
	open := n.wf != nil || n.seq != nil
	written := open && !n.mtime.IsZero()
	n.mu.Unlock()
	p, errno := n.path()
	if errno != 0 {
		// Unlinked while open: what it had, with this mount's writes.
		n.mu.Lock()
		st, ok := n.last, n.lastOK
		n.mu.Unlock()
		if !ok && !open {
			h, isRead := fh.(*readHandle)
			if !isRead {
				return fs.FileInfo{}, errno
			}
			st = fs.FileInfo{Name: path.Base(h.f.Name()), Size: h.f.Size()}
		}
		return n.report(st), 0
	}
	if written {
		// Length and time come from this mount: no storage round trip;
		// mode, owner and the rest are what was last reported (or set).
		n.mu.Lock()
		st, ok := n.last, n.lastOK
		n.mu.Unlock()
		if !ok {
			st = fs.FileInfo{Name: path.Base(p)}
		}
		return n.report(st), 0
	}
	st, err := n.describe(ctx, p)
	if err != nil {
		if !open {
			return fs.FileInfo{}, n.srv.errno(err)
		}
		// A file being written that the storage does not show yet (a
		// new file over a sequential-only backend): this mount's view.
		n.mu.Lock()
		st = n.last
		n.mu.Unlock()
		st = n.report(st)
	}
	return st, 0
}

// describe stats p, the node's path, in the storage and reports it. The
// storage's answer must not straddle a release of the node's write file
// (it could then show the file as it was before the close, while the
// report takes the node's state after it): when one started or ended
// meanwhile, it asks again.
func (n *node) describe(ctx context.Context, p string) (fs.FileInfo, error) {
	n.waitLanded()
	for {
		n.waitClosed(ctx)
		n.mu.Lock()
		e := n.epoch
		n.mu.Unlock()
		st, err := n.statStorage(ctx, p)
		if err != nil {
			return fs.FileInfo{}, err
		}
		if r, ok := n.reportAt(st, e, true); ok || ctx.Err() != nil {
			if !ok {
				r = n.report(st)
			}
			return r, nil
		}
	}
}

// report is what the kernel is told about the node, given st from the
// storage (or the last report): the open write file's length and the
// time of this mount's last write while it is open; after this mount's
// last writer closed it, the time of that writer's last write for as
// long as the storage shows the file as that close left it; else the
// storage's. It is remembered for a node unlinked while open.
func (n *node) report(st fs.FileInfo) fs.FileInfo {
	r, _ := n.reportAt(st, 0, false)
	return r
}

// reportAt is report, refused (false) if check and the node's epoch is no
// longer e.
func (n *node) reportAt(st fs.FileInfo, e uint64, check bool) (fs.FileInfo, bool) {
	if !st.IsDir {
		if size, ok := n.openSize(); ok {
			st.Size = size
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if check && n.epoch != e {
		return fs.FileInfo{}, false
	}
	switch {
	case st.IsDir:
	case (n.wf != nil || n.seq != nil) && !n.mtime.IsZero():
		st.ModTime = n.mtime
	case !n.keptStorage.IsZero() && st.ModTime.Equal(n.keptStorage):
		st.ModTime = n.keptMount
	}
	n.last, n.lastOK = st, true
	return st, true
}

// keepTimes runs when this mount's last writer of the node has closed it
// (and the close has reached the storage): wrote is the time of its last
// write (zero if it wrote nothing). It reads the storage's time now, so
// that report keeps showing wrote while the file stays as it is. known,
// if not zero, is the storage's time already (a file created and not
// written since): no Stat then.
func (n *node) keepTimes(wrote, known time.Time) {
	if wrote.IsZero() {
		return
	}
	storage := known
	if p, errno := n.path(); errno == 0 && storage.IsZero() {
		ctx, cancel := n.srv.opContext()
		if st, err := n.srv.backend.Stat(ctx, p); err == nil {
			storage = st.ModTime
		}
		cancel()
	}
	n.mu.Lock()
	n.keptStorage, n.keptMount = storage, wrote
	if storage.IsZero() {
		n.keptMount = time.Time{}
	}
	if n.lastOK && !n.last.IsDir {
		n.last.ModTime = wrote // an unlinked node keeps its last write's time
	}
	n.mu.Unlock()
}

// closed ends a release: the write file is closed in the storage.
func (n *node) closed() {
	n.mu.Lock()
	n.epoch++
	n.mu.Unlock()
	n.invalidate()
}

func (n *node) Getattr(_ context.Context, fh gofs.FileHandle, out *gofuse.AttrOut) syscall.Errno {
	ctx, cancel := n.srv.opContext()
	defer cancel()
	st, errno := n.stat(ctx, fh)
	if errno != 0 {
		return errno
	}
	n.srv.fillAttr(st, &out.Attr)
	if n.IsDir() {
		out.Mode = syscall.S_IFDIR | (out.Mode & 0o7777)
	}
	if _, ok := n.relPath(); !ok {
		out.Nlink = 0 // unlinked while open
	}
	return 0
}

// newChild returns the inode for a backend entry: the one the kernel
// already knows under that name if it is still the same kind of file, so
// that an inode number stays the same while it is cached.
func (n *node) newChild(ctx context.Context, name string, isDir bool) *gofs.Inode {
	return n.newChildOf(ctx, name, fs.FileInfo{IsDir: isDir})
}

// newChildOf is newChild for a backend entry st: its inode number is the
// backend's (st.Ino) when it has one, so every hard link of a file is one
// inode, and a name now naming another file gets a new inode.
func (n *node) newChildOf(ctx context.Context, name string, st fs.FileInfo) *gofs.Inode {
	mode := modeOf(st)
	if c := n.GetChild(name); c != nil && c.Mode()&syscall.S_IFMT == mode {
		if ino := c.StableAttr().Ino; st.Ino == 0 || ino == st.Ino || ino > autoIno {
			return c
		}
	}
	ino := st.Ino
	if ino == 0 || ino > autoIno {
		ino = n.srv.nextIno.Add(1)
	}
	return n.NewInode(ctx, &node{srv: n.srv}, gofs.StableAttr{Mode: mode, Ino: ino})
}

func (n *node) Lookup(_ context.Context, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if len(name) > fs.MaxNameLen {
		return nil, syscall.ENAMETOOLONG // not "no such file" from a cached listing
	}
	p, errno := n.childPath(name)
	if errno != 0 {
		return nil, errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	var st fs.FileInfo
	var err error
	known, _ := n.childNode(name)
	if known != nil {
		st, err = known.describe(ctx, p)
	} else {
		st, err = n.srv.statCached(ctx, p)
	}
	if err != nil {
		return nil, n.srv.errno(err)
	}
	child := n.newChildOf(ctx, name, st)
	if cn, ok := child.Operations().(*node); ok && !st.IsDir && st.Kind == 0 {
		cn.lookedUp(st)
	}
	if cn, ok := child.Operations().(*node); ok && cn != known {
		// A file this mount is writing: its open handle has the length.
		st = cn.report(st)
	}
	n.srv.fillAttr(st, &out.Attr)
	return child, 0
}

// childNode is the node of the child called name that the kernel knows,
// if any.
func (n *node) childNode(name string) (*node, bool) {
	if c := n.GetChild(name); c != nil {
		if cn, ok := c.Operations().(*node); ok {
			return cn, true
		}
	}
	return nil, false
}

// openSize is the length of the file as this mount's open write handle
// sees it; ok is false when no write handle is open.
func (n *node) openSize() (int64, bool) {
	n.mu.Lock()
	wf, wb, seq := n.wf, n.wb, n.seq
	n.mu.Unlock()
	switch {
	case wf != nil && wb != nil:
		return max(wf.Size(), wb.length()), true
	case wf != nil:
		return wf.Size(), true
	case seq != nil:
		return seq.size(), true
	}
	return 0, false
}

func (n *node) Setattr(fctx context.Context, fh gofs.FileHandle, in *gofuse.SetAttrIn, out *gofuse.AttrOut) syscall.Errno {
	ctx, cancel := n.srv.opContext()
	defer cancel()
	if size, ok := in.GetSize(); ok {
		if n.srv.opts.ReadOnly {
			return syscall.EROFS
		}
		if errno := n.truncate(ctx, int64(size)); errno != 0 {
			return errno
		}
	}
	// Modes, owners and times are stored where the backend can (the
	// kernel has checked, with default_permissions, that the caller may);
	// elsewhere times are accepted and ignored (see doc).
	var c fs.AttrChange
	if t, ok := in.GetATime(); ok {
		c.ATime = &t
	}
	if t, ok := in.GetMTime(); ok {
		c.MTime = &t
	}
	if m, ok := in.GetMode(); ok {
		c.Perm = &m
	}
	if u, ok := in.GetUID(); ok {
		c.Uid = &u
	}
	if g, ok := in.GetGID(); ok {
		c.Gid = &g
	}
	if as, ok := n.srv.backend.(fs.AttrSetter); ok && (c.Perm != nil || c.Uid != nil || c.Gid != nil || c.ATime != nil || c.MTime != nil) {
		if n.srv.opts.ReadOnly {
			return syscall.EROFS
		}
		p, errno := n.path()
		if errno != 0 {
			return errno
		}
		if !n.srv.opts.AllowOther && (c.Uid != nil || c.Gid != nil) {
			// Without default_permissions nobody checked the caller.
			if caller, ok := gofuse.FromContext(fctx); !ok || caller.Uid != 0 {
				return syscall.EPERM
			}
		}
		if c.MTime != nil {
			// Writes gathered or in flight would set the time again when
			// they land (cp -a sets times before it closes): store them first.
			if err := n.storeWrites(); err != nil {
				return n.srv.errno(err)
			}
		}
		fi, err := as.SetAttr(ctx, p, c)
		if err != nil {
			return n.srv.errno(err)
		}
		n.mu.Lock()
		n.last, n.lastOK = fi, true // for a file being written (see stat)
		if c.MTime != nil {
			// The time set is the file's until the next write.
			n.mtime, n.keptStorage, n.keptMount = time.Time{}, time.Time{}, time.Time{}
		}
		n.mu.Unlock()
	}
	n.invalidate()
	st, errno := n.stat(ctx, fh)
	if errno != 0 {
		return errno
	}
	n.srv.fillAttr(st, &out.Attr)
	return 0
}

// storeWrites makes the writes of the node's open write file, if any,
// reach the storage with their length (as a close(2) does).
func (n *node) storeWrites() error {
	n.mu.Lock()
	wf, wb := n.wf, n.wb
	n.mu.Unlock()
	if wf == nil {
		return nil
	}
	return n.srv.bounded(func() error {
		if wb != nil {
			if err := wb.flush(); err != nil {
				return err
			}
		}
		return wf.Flush()
	})
}

func (n *node) truncate(ctx context.Context, size int64) syscall.Errno {
	n.stopStores(ctx)
	n.waitClosed(ctx)
	n.mu.Lock()
	wf, wb, seq := n.wf, n.wb, n.seq
	if wf != nil {
		// Hold the write file: the RELEASE of a close(2) that returned
		// before this call may arrive meanwhile and must not close it
		// under the truncate; the last reference closes it.
		n.wfRefs++
	}
	n.mu.Unlock()
	switch {
	case wf != nil:
		err := n.srv.bounded(func() error {
			if wb != nil {
				if err := wb.flush(); err != nil {
					return err
				}
				defer wb.truncated(size)
			}
			return wf.Truncate(size)
		})
		cerrno := n.releaseWrite()
		if err != nil {
			return n.srv.errno(err)
		}
		if cerrno != 0 {
			return cerrno
		}
	case seq != nil:
		if errno := seq.truncate(size); errno != 0 {
			return errno
		}
	default:
		if n.srv.rw == nil {
			return syscall.ENOTSUP
		}
		p, errno := n.path()
		if errno != 0 {
			return errno
		}
		if err := n.srv.rw.Truncate(ctx, p, size); err != nil {
			return n.srv.errno(err)
		}
	}
	n.touch()
	return 0
}

// waitClosed waits until a write file being closed by a release is
// closed (the kernel sends RELEASE after close(2) has returned, so the
// next call of the same program can overtake it).
func (n *node) waitClosed(ctx context.Context) {
	n.mu.Lock()
	ch := n.closing
	n.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// touch records a change made through an open write file (the storage's
// own time is reported for changes made without one).
func (n *node) touch() {
	n.mu.Lock()
	n.lookedAt = time.Time{} // a LOOKUP's answer from before is stale
	if n.wf != nil || n.seq != nil {
		n.mtime = time.Now()
	}
	n.mu.Unlock()
}

// busy: this mount has the node open for writing or is closing it, or
// reports the time of its own writes for it.
func (n *node) busy() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.wf != nil || n.seq != nil || n.closing != nil || !n.keptStorage.IsZero()
}

func (n *node) Mkdir(fctx context.Context, name string, mode uint32, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.srv.opts.ReadOnly {
		return nil, syscall.EROFS
	}
	p, errno := n.childPath(name)
	if errno != 0 {
		return nil, errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	if _, err := n.srv.statCached(ctx, p); err == nil {
		return nil, syscall.EEXIST
	}
	n.srv.pend.wait(ctx, p)
	err := n.srv.backend.MkdirAll(n.srv.ownerContext(ctx, fctx, mode), p)
	if err != nil {
		n.srv.mc.changed(p)
		return nil, n.srv.errno(err)
	}
	st, err := n.srv.backend.Stat(ctx, p)
	if err != nil {
		n.srv.mc.changed(p)
		return nil, n.srv.errno(err)
	}
	n.srv.mc.created(p, &st)
	n.srv.fillAttr(st, &out.Attr)
	return n.newChildOf(ctx, name, st), 0
}

func (n *node) Unlink(_ context.Context, name string) syscall.Errno {
	return n.remove(name, false)
}

func (n *node) Rmdir(_ context.Context, name string) syscall.Errno {
	return n.remove(name, true)
}

func (n *node) remove(name string, dir bool) syscall.Errno {
	if n.srv.opts.ReadOnly {
		return syscall.EROFS
	}
	p, errno := n.childPath(name)
	if errno != 0 {
		return errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	var st fs.FileInfo
	var err error
	if cn, ok := n.childNode(name); ok && !dir {
		// Still open somewhere, it keeps reporting what it had.
		cn.keepOpenForUnlink()
		st, err = cn.describe(ctx, p)
	} else {
		st, err = n.srv.statCached(ctx, p)
	}
	if err != nil {
		return n.srv.errno(err)
	}
	switch {
	case dir && !st.IsDir:
		return syscall.ENOTDIR
	case !dir && st.IsDir:
		return syscall.EISDIR
	case dir:
		// fs.FS.Remove removes an empty directory; check so that every
		// backend answers ENOTEMPTY the same way.
		n.srv.pend.waitUnder(ctx, p)
		ents, err := n.srv.backend.List(ctx, p)
		if err != nil {
			return n.srv.errno(err)
		}
		if len(ents) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	if !dir && n.unlinkPipelined(name, p) {
		return 0
	}
	err = n.srv.backend.Remove(ctx, p)
	if err != nil {
		n.srv.mc.changed(p) // the cache may be what was wrong
		return n.srv.errno(err)
	}
	n.srv.mc.removed(p, st.IsDir)
	return 0
}

// Rename moves a file or directory. flags: RENAME_NOREPLACE is honoured;
// RENAME_EXCHANGE where the backend takes rename flags (fs.RenameFlagger).
// beingWritten reports whether c is a file this mount is writing
// sequentially: it is not in the backend yet, so it cannot be renamed.
func beingWritten(c *gofs.Inode) bool {
	if c == nil {
		return false
	}
	cn, ok := c.Operations().(*node)
	if !ok {
		return false
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.seq != nil
}

// renamePaths: the paths of a rename's two names, and the new parent
// (EXDEV when it is not a node of this mount).
func (n *node) renamePaths(name string, newParent gofs.InodeEmbedder, newName string) (np *node, oldp, newp string, errno syscall.Errno) {
	np, ok := newParent.(*node)
	if !ok {
		return nil, "", "", syscall.EXDEV
	}
	if oldp, errno = n.childPath(name); errno != 0 {
		return nil, "", "", errno
	}
	if newp, errno = np.childPath(newName); errno != 0 {
		return nil, "", "", errno
	}
	return np, oldp, newp, 0
}

func (n *node) Rename(_ context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.srv.opts.ReadOnly {
		return syscall.EROFS
	}
	const renameNoReplace, renameExchange = fs.RenameNoReplace, fs.RenameExchange
	rf, hasFlags := n.srv.backend.(fs.RenameFlagger)
	if flags&renameExchange != 0 {
		if !hasFlags {
			return syscall.EINVAL
		}
		return n.exchange(rf, name, newParent, newName)
	}
	_, oldp, newp, errno := n.renamePaths(name, newParent, newName)
	if errno != 0 {
		return errno
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	n.srv.pend.waitUnder(ctx, "")
	src, err := n.srv.statCached(ctx, oldp)
	if err != nil {
		return n.srv.errno(err)
	}
	dstIsEmptyDir := false
	if dst, err := n.srv.statCached(ctx, newp); err == nil {
		switch {
		case flags&renameNoReplace != 0:
			return syscall.EEXIST
		case src.IsDir && !dst.IsDir:
			return syscall.ENOTDIR
		case !src.IsDir && dst.IsDir:
			return syscall.EISDIR
		case dst.IsDir:
			ents, err := n.srv.backend.List(ctx, newp)
			if err != nil {
				return n.srv.errno(err)
			}
			if len(ents) > 0 {
				return syscall.ENOTEMPTY
			}
			dstIsEmptyDir = true
		}
	}
	if src.IsDir && strings.HasPrefix(newp+"/", oldp+"/") {
		return syscall.EINVAL // into itself
	}
	if beingWritten(n.GetChild(name)) {
		return syscall.EBUSY
	}
	if dstIsEmptyDir {
		// fs.FS.Rename replaces files only (as os.Rename): make room.
		err := n.srv.backend.Remove(ctx, newp)
		n.srv.mc.changed(newp)
		if err != nil {
			return n.srv.errno(err)
		}
	}
	if flags&renameNoReplace != 0 && hasFlags {
		// Checked above, and again atomically by the backend.
		err := rf.RenameFlags(ctx, oldp, newp, flags)
		n.srv.mc.renamed(oldp, newp, src.IsDir, err == nil)
		if err != nil {
			return n.srv.errno(err)
		}
		return 0
	}
	err = n.srv.backend.Rename(ctx, oldp, newp)
	n.srv.mc.renamed(oldp, newp, src.IsDir, err == nil)
	if err != nil {
		return n.srv.errno(err)
	}
	return 0
}

func (n *node) Statfs(_ context.Context, out *gofuse.StatfsOut) syscall.Errno {
	const bsize = 4096
	out.Bsize = bsize
	out.Frsize = bsize
	out.NameLen = 255
	sf, ok := n.srv.backend.(fs.StatFSer)
	if !ok {
		// Unknown capacity: report a large, mostly free file system
		// rather than a full one, which would stop writers.
		out.Blocks = 1 << 40 / bsize
		out.Bfree = out.Blocks
		out.Bavail = out.Blocks
		return 0
	}
	ctx, cancel := n.srv.opContext()
	defer cancel()
	u, err := sf.StatFS(ctx, n.srv.root)
	if err != nil {
		return n.srv.errno(err)
	}
	// df(1) shows used = blocks - bfree and avail = bavail: the same
	// figures as 'ffkit fs df'.
	used := u.Used
	if used <= 0 {
		used = u.Total - u.Free
	}
	out.Blocks = uint64(u.Total / bsize)
	out.Bfree = uint64(max(u.Total-used, 0) / bsize)
	out.Bavail = uint64(u.Free / bsize)
	out.Files = uint64(u.Files)
	out.Ffree = uint64(u.FreeFiles)
	return 0
}

// OpendirHandle lists the directory once; READDIRPLUS then answers from
// the listing instead of a stat per entry.
func (n *node) OpendirHandle(_ context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	p, errno := n.path()
	if errno != 0 {
		return nil, 0, errno
	}
	return &dirHandle{n: n, path: p}, 0, 0
}

// dirHandle is an open directory. The listing is taken at the first read
// after open or rewind, so a listing reflects the directory at that time.
type dirHandle struct {
	n    *node
	path string

	mu      sync.Mutex
	ents    []fs.FileInfo // guarded by mu; nil until listed
	listed  bool          // guarded by mu
	idx     int           // next entry to return; guarded by mu
	lastErr error
}

var (
	_ gofs.FileReaddirenter = (*dirHandle)(nil)
	_ gofs.FileSeekdirer    = (*dirHandle)(nil)
	_ gofs.FileLookuper     = (*dirHandle)(nil)
	_ gofs.FileReleasedirer = (*dirHandle)(nil)
)

func (d *dirHandle) list() syscall.Errno {
	if d.listed {
		return 0
	}
	ctx, cancel := d.n.srv.opContext()
	defer cancel()
	ents, err := d.n.srv.listCached(ctx, d.path)
	if err != nil {
		return d.n.srv.errno(fmt.Errorf("list %s: %w", d.path, err))
	}
	d.ents, d.listed = ents, true
	return 0
}

// Readdirent returns ".", "..", then the listing. Offsets are positions
// in that sequence, so Seekdir can return to any of them.
func (d *dirHandle) Readdirent(_ context.Context) (*gofuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if errno := d.list(); errno != 0 {
		return nil, errno
	}
	i := d.idx
	if i >= len(d.ents)+2 {
		return nil, 0
	}
	d.idx++
	de := &gofuse.DirEntry{Mode: syscall.S_IFDIR, Off: uint64(d.idx)}
	switch i {
	case 0:
		de.Name, de.Ino = ".", d.n.StableAttr().Ino
	case 1:
		de.Name, de.Ino = "..", 1
		if _, p := d.n.Parent(); p != nil {
			de.Ino = p.StableAttr().Ino
		}
	default:
		e := d.ents[i-2]
		de.Name = e.Name
		de.Mode = modeOf(e)
		if c := d.n.GetChild(e.Name); c != nil {
			de.Ino = c.StableAttr().Ino
		}
	}
	return de, 0
}

func (d *dirHandle) Seekdir(_ context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off == 0 {
		d.listed, d.ents = false, nil // rewinddir: list again
	}
	d.idx = int(off)
	return 0
}

// Lookup answers READDIRPLUS for the entry just returned by Readdirent.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	d.mu.Lock()
	var st fs.FileInfo
	found := false
	if i := d.idx - 3; i >= 0 && i < len(d.ents) && d.ents[i].Name == name {
		st, found = d.ents[i], true
	}
	d.mu.Unlock()
	if !found {
		return d.n.Lookup(ctx, name, out)
	}
	if cn, ok := d.n.childNode(name); ok {
		if cn.busyFor(d.n.srv.mc) {
			// Being written or closed by this mount: the listing may
			// predate that; describe it as Lookup and Getattr do.
			return d.n.Lookup(ctx, name, out)
		}
	}
	if st.Kind != 0 || st.Nlink > 1 {
		// The listing's copies of size and time may be stale for a hard
		// link; a special node has nothing to copy: stat it.
		return d.n.Lookup(ctx, name, out)
	}
	child := d.n.newChildOf(ctx, name, st)
	if cn, ok := child.Operations().(*node); ok {
		st = cn.report(st)
	}
	d.n.srv.fillAttr(st, &out.Attr)
	return child, 0
}

func (d *dirHandle) Releasedir(context.Context, uint32) {}
