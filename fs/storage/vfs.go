package storage

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// VFS is the little of a file system the chunk store uses, so tests can
// wrap it (a file system that loses unsynced writes on a crash, a full
// disk). OS is the real one.
type VFS interface {
	Create(name string) (File, error) // create or truncate, write-only
	Open(name string) (File, error)   // read-only
	Rename(oldname, newname string) error
	Remove(name string) error
	ReadDir(dir string) ([]string, error)
	MkdirAll(dir string) error
	SyncDir(dir string) error
}

// FSStat is the space of the file system holding a directory.
type FSStat struct {
	Capacity int64 // bytes in the file system
	Free     int64 // bytes an unprivileged writer may still use
	// Used is the bytes in use on the file system (statfs f_blocks -
	// f_bfree, as df(1) counts them: Capacity - Used - Free is reserved).
	Used int64
	ID   string // identifies the file system on this machine
}

// StatFSer is implemented by a VFS that can measure the file system under
// a directory (OS does, with statfs). A target on a VFS without it reports
// capacity 0 (unknown).
type StatFSer interface {
	StatFS(dir string) (FSStat, error)
}

// File is an open chunk file.
type File interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Truncate(size int64) error
	Close() error
}

// Modes of what a target holds: private to the service's user (another
// local user could otherwise read any file's bytes from its chunks).
const (
	dirMode  = 0o700
	fileMode = 0o600
)

// Tightener is implemented by a VFS that can set the modes of a target
// made by an older version (OS does): directories dirMode, files
// fileMode.
type Tightener interface {
	Tighten(dir string) error
}

// OS is the operating system's file system.
type OS struct{}

func (OS) Create(name string) (File, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, fileMode)
}

// Tighten walks dir and takes away group and other permissions.
func (OS) Tighten(dir string) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		want := os.FileMode(fileMode)
		if d.IsDir() {
			want = dirMode
		} else if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode().Perm() != want {
			return os.Chmod(p, want)
		}
		return nil
	})
}
func (OS) Open(name string) (File, error)       { return os.Open(name) }
func (OS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }
func (OS) Remove(name string) error             { return os.Remove(name) }
func (OS) MkdirAll(dir string) error            { return os.MkdirAll(dir, dirMode) }
func (OS) ReadDir(dir string) ([]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(es))
	for i, e := range es {
		names[i] = e.Name()
	}
	return names, nil
}

// StatFS measures the file system holding dir with statfs(2).
func (OS) StatFS(dir string) (FSStat, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return FSStat{}, fmt.Errorf("storage: statfs %s: %w", dir, err)
	}
	bs := int64(st.Bsize)
	if st.Frsize > 0 {
		bs = int64(st.Frsize)
	}
	return FSStat{
		Capacity: int64(st.Blocks) * bs,
		Free:     int64(st.Bavail) * bs,
		Used:     int64(st.Blocks-st.Bfree) * bs,
		ID:       fmt.Sprintf("%x:%x", uint32(st.Fsid.Val[0]), uint32(st.Fsid.Val[1])),
	}, nil
}

func (OS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// copyRange copies n bytes from src at soff to dst at doff, in the kernel
// (copy_file_range) when both are OS files.
func copyRange(dst File, doff int64, src File, soff int64, n int64) error {
	if n <= 0 {
		return nil
	}
	if df, ok := dst.(*os.File); ok {
		if sf, ok := src.(*os.File); ok {
			for n > 0 {
				so, do := soff, doff
				w, err := unix.CopyFileRange(int(sf.Fd()), &so, int(df.Fd()), &do, int(n), 0)
				if err != nil || w == 0 {
					break // fall back to a user-space copy
				}
				soff, doff, n = soff+int64(w), doff+int64(w), n-int64(w)
			}
			if n == 0 {
				return nil
			}
		}
	}
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := src.ReadAt(buf[:k], soff); err != nil {
			return err
		}
		if _, err := dst.WriteAt(buf[:k], doff); err != nil {
			return err
		}
		soff, doff, n = soff+k, doff+k, n-k
	}
	return nil
}

var _ = filepath.Join
