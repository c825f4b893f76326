package storage

import (
	"sync/atomic"
	"syscall"
)

// FaultVFS wraps a VFS and injects a full disk: while NoSpace is set,
// every write and create fails with ENOSPC, as a full file system does.
// For tests of the full-disk path through the real service.
type FaultVFS struct {
	VFS
	NoSpace atomic.Bool
}

// Create fails with ENOSPC while the disk is "full".
func (f *FaultVFS) Create(name string) (File, error) {
	if f.NoSpace.Load() {
		return nil, syscall.ENOSPC
	}
	fl, err := f.VFS.Create(name)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: fl, fs: f}, nil
}

type faultFile struct {
	File
	fs *FaultVFS
}

func (f *faultFile) WriteAt(b []byte, off int64) (int, error) {
	if f.fs.NoSpace.Load() {
		return 0, syscall.ENOSPC
	}
	return f.File.WriteAt(b, off)
}
