// Package localfs implements fs.FS on the local file system.
//
// ReadBatch serves what the page cache holds with preadv2(RWF_NOWAIT) on
// the calling goroutine (nowait.go), and submits the rest through io_uring
// (uring.go) where the kernel allows it, and otherwise runs parallel preads.
//
// Reads with OpenOptions.Direct use O_DIRECT: the page cache is bypassed and
// every pread is widened to 4 KiB alignment through a pooled bounce buffer,
// so callers keep byte-addressed reads. ReadBatch runs its reads on a
// bounded set of goroutines; because a goroutine blocked in pread holds an
// OS thread, the package raises GOMAXPROCS to at least MinProcs the first
// time a batch runs, so that enough reads stay in flight on small machines.
//
// Importing the package registers it as the FS for plain paths in fs.Resolve.
package localfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

func init() { fs.RegisterLocal(New()) }

// Align is the alignment O_DIRECT needs for offsets, lengths and buffers.
const Align = 4096

// MinProcs is the GOMAXPROCS floor set before parallel reads (see package doc).
const MinProcs = 8

// FS is the local file system.
type FS struct {
	// Parallelism bounds concurrent reads in ReadBatch. Default 64.
	Parallelism int
	// NoURing makes ReadBatch use parallel preads instead of io_uring
	// (also set for every FS by FFKIT_NO_IOURING=1), for comparisons.
	NoURing bool
	// NoNowait skips the page-cache probe (nowait.go) that serves cached
	// reads without io_uring (also set for every FS by FFKIT_NO_NOWAIT=1).
	NoNowait bool
	// Mmap serves cached pages by copies from a mapping of the file
	// (mmap.go; also set for every FS by FFKIT_MMAP=1). Default off.
	Mmap bool
	// noAtime opens files for reading with O_NOATIME where allowed (POSIX:
	// the mount's own reads, read-ahead among them, leave atime alone).
	noAtime bool
}

var noURingEnv = os.Getenv("FFKIT_NO_IOURING") == "1"

// uringEligible returns the local files of reqs if io_uring can serve them
// all: local files, and with O_DIRECT aligned offsets, lengths and buffers.
func uringEligible(reqs []fs.ReadRequest) ([]*File, bool) {
	files := make([]*File, len(reqs))
	for i := range reqs {
		q := &reqs[i]
		f, ok := q.File.(*File)
		if !ok {
			return nil, false
		}
		if f.direct && (q.Off%Align != 0 || len(q.Buf)%Align != 0 || !IsAligned(q.Buf)) {
			return nil, false
		}
		files[i] = f
	}
	return files, true
}

var _ fs.FS = (*FS)(nil)

// New returns a local FS with default settings.
func New() *FS { return &FS{Parallelism: 64} }

func (l *FS) String() string { return "local" }

var procsOnce sync.Once

// EnsureProcs raises GOMAXPROCS to MinProcs if it is lower. Blocking
// preads each hold a P until the runtime hands it off; with only 2 Ps a
// deep queue of reads starves and IOPS fall to a fraction of the device's.
func EnsureProcs() {
	procsOnce.Do(func() {
		if runtime.GOMAXPROCS(0) < MinProcs {
			runtime.GOMAXPROCS(MinProcs)
		}
	})
}

// File is an open local file.
type File struct {
	f      *os.File
	name   string
	size   int64
	direct bool
	m      mapping // buffered files: read-only map of cached pages (mmap.go)
	rc     syscall.RawConn
	// probeMu makes the file's page-cache probes take turns (nowait.go).
	probeMu sync.Mutex
}

var _ fs.File = (*File)(nil)

// Open opens name for reading.
func (l *FS) Open(ctx context.Context, name string, opts fs.OpenOptions) (fs.File, error) {
	flags := os.O_RDONLY
	if opts.Direct {
		flags |= unix.O_DIRECT
	}
	if l.noAtime {
		f, err := os.OpenFile(name, flags|unix.O_NOATIME, 0)
		if err == nil || !errors.Is(err, unix.EPERM) {
			return l.opened(name, f, err, opts)
		}
		// Only the owner (or root) may: open as usual.
	}
	f, err := os.OpenFile(name, flags, 0)
	return l.opened(name, f, err, opts)
}

// opened finishes Open of name (f, err: the first try).
func (l *FS) opened(name string, f *os.File, err error, opts fs.OpenOptions) (fs.File, error) {
	if err != nil && opts.Direct && errors.Is(err, unix.EINVAL) {
		// The file system does not support O_DIRECT (tmpfs): read through the cache.
		f, err = os.OpenFile(name, os.O_RDONLY, 0)
		opts.Direct = false
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.IsDir() {
		f.Close()
		return nil, fmt.Errorf("open %s: is a directory", name)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return &File{f: f, rc: rc, name: name, size: st.Size(), direct: opts.Direct}, nil
}

func (f *File) Size() int64  { return f.size }
func (f *File) Name() string { return f.name }
func (f *File) Close() error {
	f.m.unmap()
	return f.f.Close()
}

// Fd returns the file descriptor, for callers that submit their own I/O
// (io_uring). It stays valid until Close.
func (f *File) Fd() uintptr { return f.f.Fd() }

// Direct reports whether the file was opened with O_DIRECT.
func (f *File) Direct() bool { return f.direct }

// ReadAt reads len(p) bytes at off. With O_DIRECT, unaligned requests go
// through an aligned bounce buffer.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if !f.direct || (off%Align == 0 && len(p)%Align == 0 && IsAligned(p)) {
		return f.f.ReadAt(p, off)
	}
	start := off &^ (Align - 1)
	end := (off + int64(len(p)) + Align - 1) &^ (Align - 1)
	bb := getBounce(int(end - start))
	defer putBounce(bb)
	n, err := f.f.ReadAt(bb.buf[:end-start], start)
	skip := int(off - start)
	if n <= skip {
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	c := copy(p, bb.buf[skip:n])
	if c < len(p) {
		if err == nil {
			err = io.EOF
		}
		return c, err
	}
	return c, nil
}

// IsAligned reports whether b starts at an Align boundary.
func IsAligned(b []byte) bool {
	if cap(b) == 0 {
		return true
	}
	return uintptr(unsafePointer(b))%Align == 0
}

// AlignedBuffer returns a zeroed slice of n bytes that starts on an Align
// boundary, for O_DIRECT reads straight into caller memory.
func AlignedBuffer(n int) []byte {
	b := make([]byte, n+Align)
	o := int(uintptr(unsafePointer(b)) % Align)
	if o != 0 {
		o = Align - o
	}
	return b[o : o+n : o+n]
}

type bounce struct{ buf []byte }

var bouncePool sync.Pool // of *bounce

func getBounce(n int) *bounce {
	if b, ok := bouncePool.Get().(*bounce); ok && cap(b.buf) >= n {
		b.buf = b.buf[:cap(b.buf)]
		return b
	}
	size := 64 << 10
	for size < n {
		size <<= 1
	}
	return &bounce{buf: AlignedBuffer(size)}
}

func putBounce(b *bounce) { bouncePool.Put(b) }

// ReadBatch reads every request, in file-offset order, with at most
// Parallelism reads in flight.
func (l *FS) ReadBatch(ctx context.Context, reqs []fs.ReadRequest) error {
	return l.ReadBatchN(ctx, reqs, l.Parallelism)
}

// ReadBatchN is ReadBatch with at most par reads in flight (default 64).
func (l *FS) ReadBatchN(ctx context.Context, reqs []fs.ReadRequest, par int) error {
	return l.ReadBatchBudget(ctx, reqs, par, nil)
}

// ReadBatchBudget is ReadBatchN whose reads also hold budget's tokens while
// in flight, so that concurrent calls sharing budget keep at most its bound
// in flight in all (see fs.Budget). A nil budget bounds nothing.
// Reads served from the page cache (nowait.go) take no token: they are
// copies on the calling goroutine, never in the device's queue.
func (l *FS) ReadBatchBudget(ctx context.Context, reqs []fs.ReadRequest, par int, budget *fs.Budget) error {
	if len(reqs) == 0 {
		return nil
	}
	if par <= 0 {
		par = 64
	}
	reqs, bs := l.serveCached(reqs)
	if bs != nil {
		defer bs.release()
	}
	if len(reqs) == 0 {
		return nil
	}
	if !l.NoURing && uringOK() && !noURingEnv {
		if files, ok := uringEligible(reqs); ok {
			err := readURing(ctx, files, reqs, par, budget)
			if !errors.Is(err, errUringUnavailable) {
				return err
			}
		}
	}
	return readPreads(ctx, reqs, par, budget)
}

// readPreads reads reqs with parallel preads, at most par in flight.
func readPreads(ctx context.Context, reqs []fs.ReadRequest, par int, budget *fs.Budget) error {
	EnsureProcs()
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		ra, rb := &reqs[order[a]], &reqs[order[b]]
		if ra.File.Name() != rb.File.Name() {
			return ra.File.Name() < rb.File.Name()
		}
		return ra.Off < rb.Off
	})
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(par)
	for _, i := range order {
		r := reqs[i]
		if err := ctx.Err(); err != nil {
			break
		}
		g.Go(func() error {
			if _, err := budget.Take(ctx, 1); err != nil {
				return err
			}
			defer budget.Give(1)
			return ReadFull(r.File, r.Buf, r.Off)
		})
	}
	return g.Wait()
}

// ReadFull reads len(buf) bytes at off or fails with fs.ErrShortRead
// naming the file and range.
func ReadFull(f fs.File, buf []byte, off int64) error {
	if off < 0 || off+int64(len(buf)) > f.Size() {
		return fmt.Errorf("%s: bytes [%d, %d) past end of file (size %d): %w",
			f.Name(), off, off+int64(len(buf)), f.Size(), fs.ErrShortRead)
	}
	n, err := f.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: bytes [%d, %d): got %d bytes, file shrank: %w",
			f.Name(), off, off+int64(len(buf)), n, fs.ErrShortRead)
	}
	return fmt.Errorf("%s: read [%d, %d): %w", f.Name(), off, off+int64(len(buf)), err)
}

// Create starts a file that Commit publishes atomically. Parent
// directories are created as needed.
func (l *FS) Create(ctx context.Context, name string) (fs.Writer, error) {
	dir := filepath.Dir(name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp-*")
	if err != nil {
		return nil, err
	}
	// CreateTemp makes 0600 files; published files get the usual 0644.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, err
	}
	return newWriter(tmp, name), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// Stat describes name.
func (l *FS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	st, err := os.Stat(name)
	if err != nil {
		return fs.FileInfo{}, err
	}
	return info(st), nil
}

// info describes st with the mode bits, owner, link count and inode
// number the local file system keeps. (Access and change times are
// POSIX's: the mount's own reads, read-ahead among them, move atime.)
func info(st os.FileInfo) fs.FileInfo {
	fi := fs.FileInfo{Name: st.Name(), Size: st.Size(), IsDir: st.IsDir(), ModTime: st.ModTime()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fi.Perm, fi.Uid, fi.Gid, fi.HasOwner = sys.Mode&0o7777, sys.Uid, sys.Gid, true
		fi.Nlink, fi.Ino = uint32(sys.Nlink), sys.Ino
	}
	return fi
}

var _ fs.AttrSetter = (*FS)(nil)

// SetAttr changes name's permission bits, owner and times (chmod, chown,
// utimensat; the owner of a symbolic link itself, not of its target).
func (l *FS) SetAttr(ctx context.Context, name string, c fs.AttrChange) (fs.FileInfo, error) {
	if err := setAttr(name, c, false); err != nil {
		return fs.FileInfo{}, err
	}
	return l.Stat(ctx, name)
}

// setAttr applies c to name; with noFollow, to a symbolic link itself
// (its permission bits cannot change: Linux has no lchmod).
func setAttr(name string, c fs.AttrChange, noFollow bool) error {
	if c.Uid != nil || c.Gid != nil {
		uid, gid := -1, -1
		if c.Uid != nil {
			uid = int(*c.Uid)
		}
		if c.Gid != nil {
			gid = int(*c.Gid)
		}
		if err := os.Lchown(name, uid, gid); err != nil {
			return err
		}
	}
	if c.Perm != nil {
		link := false
		if noFollow {
			st, err := os.Lstat(name)
			if err != nil {
				return err
			}
			link = st.Mode()&os.ModeSymlink != 0
		}
		if !link {
			if err := os.Chmod(name, os.FileMode(*c.Perm&0o777)|unixModeBits(*c.Perm)); err != nil {
				return err
			}
		}
	}
	if c.ATime != nil || c.MTime != nil {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if c.ATime != nil {
			ts[0] = unix.NsecToTimespec(c.ATime.UnixNano())
		}
		if c.MTime != nil {
			ts[1] = unix.NsecToTimespec(c.MTime.UnixNano())
		}
		flags := 0
		if noFollow {
			flags = unix.AT_SYMLINK_NOFOLLOW
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, name, ts, flags); err != nil {
			return &os.PathError{Op: "utimensat", Path: name, Err: err}
		}
	}
	return nil
}

// unixModeBits maps the setuid, setgid and sticky bits of perm to
// os.FileMode's.
func unixModeBits(perm uint32) os.FileMode {
	var m os.FileMode
	if perm&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if perm&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if perm&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}

// List lists dir sorted by name.
func (l *FS) List(ctx context.Context, dir string) ([]fs.FileInfo, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]fs.FileInfo, 0, len(ents))
	for _, e := range ents {
		st, err := e.Info()
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // removed while listing
			}
			return nil, err
		}
		out = append(out, info(st))
	}
	return out, nil // os.ReadDir sorts by name
}

func (l *FS) MkdirAll(ctx context.Context, dir string) error { return os.MkdirAll(dir, 0o755) }

func (l *FS) Rename(ctx context.Context, oldname, newname string) error {
	return os.Rename(oldname, newname)
}

func (l *FS) Remove(ctx context.Context, name string) error { return os.Remove(name) }
