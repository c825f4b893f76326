package storage

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs/proto"
)

// residentPages counts the pages of [off, off+n) of the file p that are in
// the page cache.
func residentPages(t *testing.T, p string, off, n int64) int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (n+int64(os.Getpagesize())-1)/int64(os.Getpagesize()))
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	k := 0
	for _, v := range vec {
		k += int(v & 1)
	}
	return k
}

// TestDirectWrites: a new chunk's aligned blocks bypass the page cache
// (OS.WriteDirect), an unaligned tail and a payload at an unaligned
// memory address still land right, and the chunk reads back whole.
func TestDirectWrites(t *testing.T) {
	dir := t.TempDir()
	if f, err := os.OpenFile(dir+"/probe", os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o600); err != nil {
		t.Skipf("no O_DIRECT on %s: %v", dir, err)
	} else {
		f.Close()
	}
	tg, err := OpenTarget(OS{}, 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	raw := make([]byte, 1<<20+300+1)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	data := raw[1:] // not aligned in memory
	id := proto.ChunkID{Inode: 9, Index: 0}
	v := apply(t, tg, id, update{op: proto.OpWrite, off: 0, data: data})
	p := tg.path(id, v.ver, false)
	if k := residentPages(t, p, HeaderSize, 1<<20); k > 16 {
		t.Errorf("%d of 256 pages of the chunk's aligned blocks are in the page cache: written through it", k)
	}
	got, _, err := tg.readCommitted(id, 0, int64(len(data)), false)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("chunk read back differs from what was written")
	}
	// An overwrite of part of it (old bytes copied in: through the page
	// cache) reads back right too.
	patch := bytes.Repeat([]byte{0xab}, 5000)
	apply(t, tg, id, update{op: proto.OpWrite, off: 4000, data: patch})
	copy(data[4000:], patch)
	if got, _, err = tg.readCommitted(id, 0, int64(len(data)), false); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after an overwrite: equal %v, err %v", bytes.Equal(got, data), err)
	}
	// The chunk's preferred replica for reads writes through the page
	// cache.
	id2 := proto.ChunkID{Inode: 9, Index: 1}
	v2 := apply(t, tg, id2, update{op: proto.OpWrite, off: 0, data: data, cache: true})
	if k := residentPages(t, tg.path(id2, v2.ver, false), HeaderSize, 1<<20); k < 256 {
		t.Errorf("%d of 256 pages of a chunk written through the page cache are in it", k)
	}
	// Reopened (headers and block checksums from disk), the chunk verifies.
	tg2, err := OpenTarget(OS{}, 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err = tg2.readCommitted(id, 0, int64(len(data)), false); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after reopening: equal %v, err %v", bytes.Equal(got, data), err)
	}
}
