package localfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

// POSIX is the local file system as a FUSE mount of a local directory
// serves it: paths of any length are taken (a path near PATH_MAX inside
// the mount is longer than PATH_MAX as the directory's absolute path; see
// shortPath), nodes are described without following symbolic links, and
// symlinks, FIFOs, sockets, device nodes, hard links, extended attributes
// and rename flags pass through to the directory's file system. A node
// created with an owner in its context (fs.WithOwner: the FUSE caller's
// uid, gid and mode) gets that mode, and that owner when the process may
// give it (root); otherwise it belongs to the process.
//
// FS (plain paths everywhere else) keeps following symbolic links.
type POSIX struct{ *FS }

// NewPOSIX returns the local file system with POSIX node semantics. Files
// are opened for reading with O_NOATIME where the process may (it owns
// them, or is root), so that the mount's reads, read-ahead and whole-file
// prefetch among them, leave access times as they were (a noatime mount,
// as JuiceFS's default).
func NewPOSIX() *POSIX {
	l := New()
	l.noAtime = true
	return &POSIX{l}
}

var (
	_ fs.NodeMaker      = (*POSIX)(nil)
	_ fs.Xattrer        = (*POSIX)(nil)
	_ fs.RenameFlagger  = (*POSIX)(nil)
	_ fs.AttrSetter     = (*POSIX)(nil)
	_ fs.RandomAccessFS = (*POSIX)(nil)
)

// posixInfo is info with the node's kind.
func posixInfo(st os.FileInfo) fs.FileInfo {
	fi := info(st)
	switch m := st.Mode(); {
	case m&os.ModeSymlink != 0:
		fi.Kind = fs.KindSymlink
	case m&os.ModeNamedPipe != 0:
		fi.Kind = fs.KindFIFO
	case m&os.ModeSocket != 0:
		fi.Kind = fs.KindSocket
	case m&os.ModeCharDevice != 0:
		fi.Kind = fs.KindChar
	case m&os.ModeDevice != 0:
		fi.Kind = fs.KindBlock
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fi.ATime = time.Unix(sys.Atim.Sec, sys.Atim.Nsec)
		fi.CTime = time.Unix(sys.Ctim.Sec, sys.Ctim.Nsec)
		if fi.Kind >= fs.KindChar {
			fi.Rdev = uint32(sys.Rdev)
		}
	}
	return fi
}

// Stat describes name itself (a symbolic link, not its target).
func (p *POSIX) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	name, release, err := shortPath(name)
	if err != nil {
		return fs.FileInfo{}, err
	}
	defer release()
	st, err := os.Lstat(name)
	if err != nil {
		return fs.FileInfo{}, err
	}
	return posixInfo(st), nil
}

// List lists dir sorted by name, symbolic links as themselves.
func (p *POSIX) List(ctx context.Context, dir string) ([]fs.FileInfo, error) {
	dir, release, err := shortPath(dir)
	if err != nil {
		return nil, err
	}
	defer release()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]fs.FileInfo, 0, len(ents))
	for _, e := range ents {
		st, err := e.Info() // lstat
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // removed while listing
			}
			return nil, err
		}
		out = append(out, posixInfo(st))
	}
	return out, nil
}

// SetAttr changes name's permission bits, owner and times, of a symbolic
// link itself (not its target; a link's permission bits stay).
func (p *POSIX) SetAttr(ctx context.Context, name string, c fs.AttrChange) (fs.FileInfo, error) {
	name, release, err := shortPath(name)
	if err != nil {
		return fs.FileInfo{}, err
	}
	defer release()
	if err := setAttr(name, c, true); err != nil {
		return fs.FileInfo{}, err
	}
	return p.Stat(ctx, name)
}

// own gives the new node name the mode and owner in ctx, if any.
func own(ctx context.Context, name string, isLink bool) error {
	o, ok := fs.OwnerFrom(ctx)
	if !ok {
		return nil
	}
	if !isLink {
		if err := os.Chmod(name, os.FileMode(o.Perm&0o777)|unixModeBits(o.Perm)); err != nil {
			return err
		}
	}
	if os.Geteuid() == 0 {
		return os.Lchown(name, int(o.Uid), int(o.Gid))
	}
	return nil
}

// OpenWrite is FS.OpenWrite; a file it creates gets the owner in ctx.
func (p *POSIX) OpenWrite(ctx context.Context, name string, flag int) (fs.WriteFile, error) {
	short, release, err := shortPath(name)
	if err != nil {
		return nil, err
	}
	defer release()
	w, err := p.openWrite(ctx, short, flag)
	if lw, ok := w.(*WriteFile); ok {
		lw.name = name
	}
	return w, err
}

func (p *POSIX) openWrite(ctx context.Context, name string, flag int) (fs.WriteFile, error) {
	if _, ok := fs.OwnerFrom(ctx); !ok || flag&fs.OCreate == 0 {
		return p.FS.OpenWrite(ctx, name, flag)
	}
	// Create exclusively first, to know whether this call made the file.
	w, err := p.FS.OpenWrite(ctx, name, flag|fs.OExcl)
	if errors.Is(err, os.ErrExist) && flag&fs.OExcl == 0 {
		return p.FS.OpenWrite(ctx, name, flag&^fs.OCreate)
	}
	if err != nil {
		return nil, err
	}
	if err := own(ctx, name, false); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// Open is FS.Open, for paths of any length.
func (p *POSIX) Open(ctx context.Context, name string, opts fs.OpenOptions) (fs.File, error) {
	short, release, err := shortPath(name)
	if err != nil {
		return nil, err
	}
	defer release()
	f, err := p.FS.Open(ctx, short, opts)
	if lf, ok := f.(*File); ok {
		lf.name = name
	}
	return f, err
}

// Rename is FS.Rename, for paths of any length.
func (p *POSIX) Rename(ctx context.Context, oldname, newname string) error {
	oldname, newname, release, err := shortPaths(oldname, newname)
	if err != nil {
		return err
	}
	defer release()
	return p.FS.Rename(ctx, oldname, newname)
}

// Remove is FS.Remove, for paths of any length.
func (p *POSIX) Remove(ctx context.Context, name string) error {
	name, release, err := shortPath(name)
	if err != nil {
		return err
	}
	defer release()
	return p.FS.Remove(ctx, name)
}

// Truncate is FS.Truncate, for paths of any length.
func (p *POSIX) Truncate(ctx context.Context, name string, size int64) error {
	name, release, err := shortPath(name)
	if err != nil {
		return err
	}
	defer release()
	return p.FS.Truncate(ctx, name, size)
}

// StatFS is FS.StatFS, for paths of any length.
func (p *POSIX) StatFS(ctx context.Context, name string) (fs.Usage, error) {
	name, release, err := shortPath(name)
	if err != nil {
		return fs.Usage{}, err
	}
	defer release()
	return p.FS.StatFS(ctx, name)
}

// MkdirAll is FS.MkdirAll; the last directory, if it makes it, gets the
// owner in ctx.
func (p *POSIX) MkdirAll(ctx context.Context, dir string) error {
	dir, release, err := shortPath(dir)
	if err != nil {
		return err
	}
	defer release()
	if _, ok := fs.OwnerFrom(ctx); !ok {
		return p.FS.MkdirAll(ctx, dir)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if st, serr := os.Stat(dir); errors.Is(err, os.ErrExist) && serr == nil && st.IsDir() {
			return nil
		}
		return err
	}
	return own(ctx, dir, false)
}

// Symlink creates name as a symbolic link to target.
func (p *POSIX) Symlink(ctx context.Context, target, name string) error {
	name, release, err := shortPath(name)
	if err != nil {
		return err
	}
	defer release()
	if err := os.Symlink(target, name); err != nil {
		return err
	}
	return own(ctx, name, true)
}

// Readlink returns the target of the symbolic link name.
func (p *POSIX) Readlink(ctx context.Context, name string) (string, error) {
	name, release, err := shortPath(name)
	if err != nil {
		return "", err
	}
	defer release()
	return os.Readlink(name)
}

// Mknod creates a FIFO, socket or device node.
func (p *POSIX) Mknod(ctx context.Context, name string, kind fs.Kind, rdev uint32) error {
	name, release, err := shortPath(name)
	if err != nil {
		return err
	}
	defer release()
	mode := map[fs.Kind]uint32{fs.KindFIFO: unix.S_IFIFO, fs.KindSocket: unix.S_IFSOCK, fs.KindChar: unix.S_IFCHR, fs.KindBlock: unix.S_IFBLK}[kind]
	if mode == 0 {
		return &os.PathError{Op: "mknod", Path: name, Err: unix.EINVAL}
	}
	if err := unix.Mknod(name, mode|0o600, int(rdev)); err != nil {
		return &os.PathError{Op: "mknod", Path: name, Err: err}
	}
	return own(ctx, name, false)
}

// Link makes newname a second name of oldname.
func (p *POSIX) Link(ctx context.Context, oldname, newname string) error {
	oldname, newname, release, err := shortPaths(oldname, newname)
	if err != nil {
		return err
	}
	defer release()
	return os.Link(oldname, newname)
}

// RenameFlags is renameat2(2).
func (p *POSIX) RenameFlags(ctx context.Context, oldname, newname string, flags uint32) error {
	oldname, newname, release, err := shortPaths(oldname, newname)
	if err != nil {
		return err
	}
	defer release()
	var f uint
	if flags&fs.RenameNoReplace != 0 {
		f |= unix.RENAME_NOREPLACE
	}
	if flags&fs.RenameExchange != 0 {
		f |= unix.RENAME_EXCHANGE
	}
	if err := unix.Renameat2(unix.AT_FDCWD, oldname, unix.AT_FDCWD, newname, f); err != nil {
		return &os.LinkError{Op: "renameat2", Old: oldname, New: newname, Err: err}
	}
	return nil
}

// GetXattr returns extended attribute attr of name (not following links).
func (p *POSIX) GetXattr(ctx context.Context, name, attr string) ([]byte, error) {
	name, release, err := shortPath(name)
	if err != nil {
		return nil, err
	}
	defer release()
	for size := 256; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Lgetxattr(name, attr, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if err != nil {
			return nil, xattrErr("getxattr", name, err)
		}
		return buf[:n], nil
	}
}

// ListXattr lists the extended attributes of name.
func (p *POSIX) ListXattr(ctx context.Context, name string) ([]string, error) {
	name, release, err := shortPath(name)
	if err != nil {
		return nil, err
	}
	defer release()
	for size := 1024; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Llistxattr(name, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if err != nil {
			return nil, xattrErr("listxattr", name, err)
		}
		var out []string
		start := 0
		for i := 0; i < n; i++ {
			if buf[i] == 0 {
				if i > start {
					out = append(out, string(buf[start:i]))
				}
				start = i + 1
			}
		}
		return out, nil
	}
}

// SetXattr sets extended attribute attr of name.
func (p *POSIX) SetXattr(ctx context.Context, name, attr string, value []byte, flags int) error {
	name, release, err := shortPath(name)
	if err != nil {
		return err
	}
	defer release()
	var f int
	if flags&fs.XattrCreate != 0 {
		f |= unix.XATTR_CREATE
	}
	if flags&fs.XattrReplace != 0 {
		f |= unix.XATTR_REPLACE
	}
	return xattrErr("setxattr", name, unix.Lsetxattr(name, attr, value, f))
}

// RemoveXattr removes extended attribute attr of name.
func (p *POSIX) RemoveXattr(ctx context.Context, name, attr string) error {
	name, release, err := shortPath(name)
	if err != nil {
		return err
	}
	defer release()
	return xattrErr("removexattr", name, unix.Lremovexattr(name, attr))
}

func xattrErr(op, name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENODATA):
		return &os.PathError{Op: op, Path: name, Err: fs.ErrNoAttr}
	}
	return &os.PathError{Op: op, Path: name, Err: err}
}
