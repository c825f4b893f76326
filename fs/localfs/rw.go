package localfs

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

var (
	_ fs.RandomAccessFS = (*FS)(nil)
	_ fs.StatFSer       = (*FS)(nil)
	_ fs.WriteFile      = (*WriteFile)(nil)
)

// OpenWrite opens name for reading and writing at any offset (os.OpenFile
// with O_RDWR). New files get mode 0644.
func (l *FS) OpenWrite(ctx context.Context, name string, flag int) (fs.WriteFile, error) {
	of := os.O_RDWR
	if flag&fs.OCreate != 0 {
		of |= os.O_CREATE
	}
	if flag&fs.OExcl != 0 {
		of |= os.O_EXCL
	}
	if flag&fs.OTrunc != 0 {
		of |= os.O_TRUNC
	}
	f, err := os.OpenFile(name, of, 0o644)
	if err != nil {
		return nil, wrapSpace(err)
	}
	return &WriteFile{f: f, name: name}, nil
}

// Truncate sets the length of name.
func (l *FS) Truncate(ctx context.Context, name string, size int64) error {
	return wrapSpace(os.Truncate(name, size))
}

// StatFS reports the capacity of the file system holding name.
func (l *FS) StatFS(ctx context.Context, name string) (fs.Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(name, &st); err != nil {
		return fs.Usage{}, fmt.Errorf("statfs %s: %w", name, err)
	}
	bs := int64(st.Bsize)
	return fs.Usage{
		Total:     int64(st.Blocks) * bs,
		Free:      int64(st.Bavail) * bs,
		Used:      int64(st.Blocks-st.Bfree) * bs,
		Files:     int64(st.Files),
		FreeFiles: int64(st.Ffree),
	}, nil
}

// WriteFile is a local file open for reading and writing. Its methods are
// the os.File ones, so it is safe for concurrent use and keeps working
// after the file is removed (the descriptor holds the data).
type WriteFile struct {
	f    *os.File
	name string
}

func (w *WriteFile) Name() string { return w.name }

// Fd returns the file descriptor (valid until Close).
func (w *WriteFile) Fd() uintptr { return w.f.Fd() }

// Size is the current length (fstat), including other writers' extensions.
func (w *WriteFile) Size() int64 {
	st, err := w.f.Stat()
	if err != nil {
		return 0
	}
	return st.Size()
}

func (w *WriteFile) ReadAt(p []byte, off int64) (int, error) { return w.f.ReadAt(p, off) }

func (w *WriteFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := w.f.WriteAt(p, off)
	return n, wrapSpace(err)
}

func (w *WriteFile) Truncate(size int64) error { return wrapSpace(w.f.Truncate(size)) }

// Flush does nothing: a local write is visible to every process at once.
func (w *WriteFile) Flush() error { return nil }

// Sync flushes the file to stable storage (fdatasync would skip the
// length when the file grew, so this is a full fsync).
func (w *WriteFile) Sync() error { return wrapSpace(w.f.Sync()) }

func (w *WriteFile) Close() error { return w.f.Close() }
