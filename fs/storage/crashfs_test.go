package storage

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ffkit/ffkit/fs/proto"
)

// crashFS is an in-memory VFS that models what survives a power loss:
// file contents only as of their last Sync, directory entries (creates,
// renames, removes) only as of the directory's last SyncDir. Crash throws
// away everything else. Capacity, if set, makes writes fail with ENOSPC.
type crashFS struct {
	mu       sync.Mutex
	names    map[string]*memFile // current directory entries
	durable  map[string]*memFile // entries as of the last SyncDir
	capacity int
}

type memFile struct {
	mu     sync.Mutex
	data   []byte
	synced []byte
}

func newCrashFS() *crashFS {
	return &crashFS{names: map[string]*memFile{}, durable: map[string]*memFile{}}
}

func (c *crashFS) used() int {
	n := 0
	for _, f := range c.names {
		n += len(f.data)
	}
	return n
}

func (c *crashFS) Create(name string) (File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := &memFile{}
	c.names[name] = f
	return &memHandle{f: f, fs: c}, nil
}

func (c *crashFS) Open(name string) (File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.names[name]
	if !ok {
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
	}
	return &memHandle{f: f, fs: c}, nil
}

func (c *crashFS) Rename(o, n string) error {
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

func (c *crashFS) Remove(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.names, name)
	return nil
}

func (c *crashFS) ReadDir(dir string) ([]string, error) {
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

func (c *crashFS) MkdirAll(string) error { return nil }

// SyncDir makes the directory's current entries durable.
func (c *crashFS) SyncDir(dir string) error {
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

// Crash keeps only what was synced.
func (c *crashFS) Crash() {
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
	fs *crashFS
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

// TestDurabilityModel crashes the store (dropping everything not synced)
// at random points of the update protocol. What recovery will make
// committed (the pending version if one survived, which the head re-drives
// or resync replaces, else the committed one) is always the acknowledged
// content, or, for an update interrupted before it was acknowledged, that
// update's content.
func TestDurabilityModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := 0; round < 300; round++ {
		vfs := newCrashFS()
		tg, err := OpenTarget(vfs, 1, "/t")
		if err != nil {
			t.Fatal(err)
		}
		id := proto.ChunkID{Inode: 1, Index: uint64(round)}
		var acked []byte
		steps := rng.IntN(6) + 1
		for s := 0; s < steps; s++ {
			off := rng.IntN(20000)
			data := make([]byte, rng.IntN(20000)+1)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			next := append([]byte(nil), acked...)
			if len(next) < off+len(data) {
				next = append(next, make([]byte, off+len(data)-len(next))...)
			}
			copy(next[off:], data)
			c := tg.get(id)
			ver := c.commitVer() + 1
			_, durable, err := tg.prepareAsync(id, c, update{op: proto.OpWrite, off: int64(off), data: data, ver: ver})
			if err != nil {
				t.Fatal(err)
			}
			last := s == steps-1
			crashAt := -1 // 0: before the fsyncs, 1: before the commit
			if last {
				crashAt = rng.IntN(3) - 1
			}
			if crashAt != 0 {
				if err := durable(); err != nil {
					t.Fatal(err)
				}
			}
			if crashAt == -1 {
				if _, err := tg.commit(id, c); err != nil {
					t.Fatal(err)
				}
				acked = next
			}
			if !last {
				continue
			}
			vfs.Crash()
			tg2, err := OpenTarget(vfs, 1, "/t")
			if err != nil {
				t.Fatal(err)
			}
			final, _, err := tg2.readCommitted(id, 0, proto.MaxChunkSize, true)
			if err != nil {
				t.Fatalf("round %d: read after crash: %v", round, err)
			}
			tg2.mu.Lock()
			p := tg2.chunks[id]
			var pend *version
			if p != nil {
				pend = p.pending
			}
			tg2.mu.Unlock()
			if pend != nil {
				if final, err = tg2.readVersion(id, pend, true); err != nil {
					t.Fatalf("round %d: pending version unreadable: %v", round, err)
				}
			}
			if !bytes.Equal(final, acked) && !(crashAt >= 0 && bytes.Equal(final, next)) {
				t.Fatalf("round %d (crash point %d): recovery would commit %d bytes, not the acknowledged %d", round, crashAt, len(final), len(acked))
			}
		}
	}
}

// TestFullDisk: a write that does not fit fails with ErrNoSpace, leaves no
// pending version or file behind, and the committed data stays intact.
func TestFullDisk(t *testing.T) {
	vfs := newCrashFS()
	tg, err := OpenTarget(vfs, 1, "/t")
	if err != nil {
		t.Fatal(err)
	}
	id := proto.ChunkID{Inode: 2}
	apply(t, tg, id, update{op: proto.OpWrite, data: bytes.Repeat([]byte("a"), 10000)})
	vfs.capacity = vfs.used() + 5000
	c := tg.get(id)
	_, err = tg.prepare(id, c, update{op: proto.OpWrite, off: 5000, data: bytes.Repeat([]byte("b"), 20000), ver: 2})
	if !errors.Is(err, proto.ErrNoSpace) {
		t.Fatalf("want ErrNoSpace, got %v", err)
	}
	if !strings.Contains(err.Error(), "target 1") {
		t.Fatalf("error does not name the target: %v", err)
	}
	if m := tg.Meta(id); m.UpdateVer != 1 || m.CommitVer != 1 {
		t.Fatalf("state after failed write: %+v", m)
	}
	names, _ := vfs.ReadDir("/t/chunks")
	if len(names) != 1 {
		t.Fatalf("files left behind: %v", names)
	}
	got, _, err := tg.readCommitted(id, 0, 20000, false)
	if err != nil || !bytes.Equal(got, bytes.Repeat([]byte("a"), 10000)) {
		t.Fatalf("committed data damaged: %v", err)
	}
	vfs.capacity = 0
	apply(t, tg, id, update{op: proto.OpWrite, off: 5000, data: bytes.Repeat([]byte("b"), 20000)})
}
