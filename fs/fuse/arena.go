package fuse

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read-ahead buffers come from anonymous mappings advised for transparent
// huge pages (MADV_HUGEPAGE), not from the Go heap. Every byte read
// through the mount crosses them twice: the socket copies the storage's
// reply into them, and the kernel copies the FUSE reply out of them after
// pinning their pages (get_user_pages on every write to /dev/fuse). On 2
// MiB pages the pinning takes one page-table entry per 2 MiB instead of
// 512, both copies miss the TLB far less, and a buffer once faulted in
// stays resident (the Go heap may return freed spans to the OS, and a
// sync.Pool is emptied by every other GC, so fresh 1 MiB buffers page
// fault on every use).
//
// Buffers are carved from slabs of arenaSlab bytes, kept in a free list
// per buffer size and reused. The address space is never unmapped (it is
// the peak in use, bounded by Options.ReadAheadMemory of the mounts of
// the process), but the memory of free buffers beyond arenaKeep bytes is
// given back to the kernel (MADV_DONTNEED) and faulted in again on reuse.
// If mmap fails, buffers come from the Go heap.

const (
	hugePage  = 2 << 20
	arenaSlab = 8 << 20
	arenaKeep = 64 << 20
	pageSize  = 4096
)

var arena struct {
	mu       sync.Mutex
	free     map[int][][]byte // resident, by buffer length; guarded by mu
	released map[int][][]byte // given back to the kernel; guarded by mu
	freeSize int              // bytes in free; guarded by mu
	slabs    [][]byte         // every mapping; guarded by mu
}

// getBlock returns an n-byte buffer, 4 KiB aligned (a backend reading with
// O_DIRECT fills it without a bounce copy).
func getBlock(n int) []byte {
	arena.mu.Lock()
	defer arena.mu.Unlock()
	if fl := arena.free[n]; len(fl) > 0 {
		b := fl[len(fl)-1]
		arena.free[n] = fl[:len(fl)-1]
		arena.freeSize -= n
		return b
	}
	if fl := arena.released[n]; len(fl) > 0 {
		b := fl[len(fl)-1]
		arena.released[n] = fl[:len(fl)-1]
		return b
	}
	slab := mapHuge(max(arenaSlab, (n+hugePage-1)/hugePage*hugePage))
	if slab == nil {
		return alignedBuffer(n)
	}
	if arena.released == nil {
		arena.released = map[int][][]byte{}
	}
	arena.slabs = append(arena.slabs, slab)
	// The slab's first buffer is returned, the others kept for later
	// (not faulted in yet: as good as released). Each starts at a page
	// boundary, so that releasing one never touches its neighbours.
	stride := (n + pageSize - 1) &^ (pageSize - 1)
	for o := stride; o+n <= len(slab); o += stride {
		arena.released[n] = append(arena.released[n], slab[o:o+n:o+n])
	}
	return slab[:n:n]
}

// inSlab: b was carved from a slab (not the Go heap).
func inSlab(b []byte) bool {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, s := range arena.slabs {
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
		if p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(s)) {
			return true
		}
	}
	return false
}

// putBlock returns a buffer from getBlock for reuse.
func putBlock(b []byte) {
	b = b[:cap(b)]
	arena.mu.Lock()
	defer arena.mu.Unlock()
	if arena.free == nil {
		arena.free = map[int][][]byte{}
		arena.released = map[int][][]byte{}
	}
	if !inSlab(b) {
		return // from the Go heap (mmap failed): the GC has it
	}
	if arena.freeSize+len(b) > arenaKeep {
		unix.Madvise(b, unix.MADV_DONTNEED) // only drops the pages; the range stays mapped
		arena.released[len(b)] = append(arena.released[len(b)], b)
		return
	}
	arena.free[len(b)] = append(arena.free[len(b)], b)
	arena.freeSize += len(b)
}

// mapHuge maps n bytes (a multiple of hugePage) at a hugePage boundary and
// advises huge pages for them; nil if the mapping fails.
func mapHuge(n int) []byte {
	m, err := unix.Mmap(-1, 0, n+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	o := 0
	if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(m))) % hugePage); r != 0 {
		o = hugePage - r
	}
	b := m[o : o+n : o+n]
	// Trim the unaligned ends (unix.Munmap only takes whole mappings).
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	if o > 0 {
		unix.Syscall(unix.SYS_MUNMAP, base, uintptr(o), 0)
	}
	if tail := len(m) - o - n; tail > 0 {
		unix.Syscall(unix.SYS_MUNMAP, base+uintptr(o+n), uintptr(tail), 0)
	}
	unix.Madvise(b, unix.MADV_HUGEPAGE) // advice only: without it, 4 KiB pages
	return b
}
