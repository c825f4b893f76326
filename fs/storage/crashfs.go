package storage

import (
	"io"
	"os"
	"path"
	"sort"
	"sync"
	"syscall"
)

// CrashFS is an in-memory VFS that models what survives a power loss:
// file contents only as of their last Sync, directory entries (creates,
// renames, removes) only as of the directory's last SyncDir. Crash throws
// away everything else. A test helper (fault injection by wrapping the
// file system): the durability tests of the store and the power-loss tests
// of whole clusters run on it. Safe for concurrent use.
type CrashFS struct {
	mu       sync.Mutex
	names    map[string]*memFile // current directory entries
	durable  map[string]*memFile // entries as of the last SyncDir
	capacity int                 // > 0: writes beyond this many bytes in all files fail with ENOSPC
}

type memFile struct {
	mu     sync.Mutex
	data   []byte
	synced []byte
}

// NewCrashFS returns an empty CrashFS.
func NewCrashFS() *CrashFS {
	return &CrashFS{names: map[string]*memFile{}, durable: map[string]*memFile{}}
}

func (c *CrashFS) used() int {
	n := 0
	for _, f := range c.names {
		n += len(f.data)
	}
	return n
}

func (c *CrashFS) Create(name string) (File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := &memFile{}
	c.names[name] = f
	return &memHandle{f: f, fs: c}, nil
}

func (c *CrashFS) Open(name string) (File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.names[name]
	if !ok {
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
	}
	return &memHandle{f: f, fs: c}, nil
}

func (c *CrashFS) Rename(o, n string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.names[o]
	if !ok {
		return os.ErrNotExist
	}
	delete(c.names, o)
	c.names[n] = f
	return nil
}

func (c *CrashFS) Remove(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.names, name)
	return nil
}

func (c *CrashFS) ReadDir(dir string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.names {
		if path.Dir(n) == dir {
			out = append(out, path.Base(n))
		}
	}
	sort.Strings(out)
	return out, nil
}

func (c *CrashFS) MkdirAll(string) error { return nil }

// SyncDir makes the directory's current entries durable.
func (c *CrashFS) SyncDir(dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n := range c.durable {
		if path.Dir(n) == dir {
			delete(c.durable, n)
		}
	}
	for n, f := range c.names {
		if path.Dir(n) == dir {
			c.durable[n] = f
		}
	}
	return nil
}

// SetCapacity makes writes fail with ENOSPC beyond n bytes in all files
// (0: no limit).
func (c *CrashFS) SetCapacity(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capacity = n
}

// Used is the bytes held by all files.
func (c *CrashFS) Used() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used()
}

// Crash keeps only what was synced.
func (c *CrashFS) Crash() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names = map[string]*memFile{}
	for n, f := range c.durable {
		f.mu.Lock()
		f.data = append([]byte(nil), f.synced...)
		f.mu.Unlock()
		c.names[n] = f
	}
}

type memHandle struct {
	f  *memFile
	fs *CrashFS
}

func (h *memHandle) ReadAt(b []byte, off int64) (int, error) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if off >= int64(len(h.f.data)) {
		return 0, io.EOF
	}
	n := copy(b, h.f.data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (h *memHandle) grow(n int64) error {
	if n <= int64(len(h.f.data)) {
		return nil
	}
	h.fs.mu.Lock()
	full := h.fs.capacity > 0 && h.fs.used()+int(n)-len(h.f.data) > h.fs.capacity
	h.fs.mu.Unlock()
	if full {
		return syscall.ENOSPC
	}
	h.f.data = append(h.f.data, make([]byte, n-int64(len(h.f.data)))...)
	return nil
}

func (h *memHandle) WriteAt(b []byte, off int64) (int, error) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if err := h.grow(off + int64(len(b))); err != nil {
		return 0, err
	}
	return copy(h.f.data[off:], b), nil
}

func (h *memHandle) Truncate(n int64) error {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if n < int64(len(h.f.data)) {
		h.f.data = h.f.data[:n]
		return nil
	}
	return h.grow(n)
}

func (h *memHandle) Sync() error {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	h.f.synced = append([]byte(nil), h.f.data...)
	return nil
}

func (h *memHandle) Close() error { return nil }
