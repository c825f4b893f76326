package fuse

import (
	"bytes"
	"testing"
	"unsafe"
)

// TestArena: buffers are aligned, keep their bytes while in use although
// their neighbours are given back to the kernel, and come back zeroed or
// intact (never shared) when reused.
func TestArena(t *testing.T) {
	const n = 3<<20 + 5 // not a multiple of the page size
	var bufs [][]byte
	for i := range 60 { // 180 MiB: more than arenaKeep
		b := getBlock(n)
		if len(b) != n || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%pageSize != 0 {
			t.Fatalf("block %d: %d bytes at %p, want %d at a page boundary", i, len(b), unsafe.SliceData(b), n)
		}
		for j := range b {
			b[j] = byte(i + j)
		}
		bufs = append(bufs, b)
	}
	// Return the even ones: past arenaKeep they are released.
	for i := 0; i < len(bufs); i += 2 {
		putBlock(bufs[i])
	}
	for i := 1; i < len(bufs); i += 2 {
		b := bufs[i]
		for j := range b {
			if b[j] != byte(i+j) {
				t.Fatalf("block %d in use lost its byte %d after its neighbours were returned", i, j)
			}
		}
	}
	// Reuse: distinct buffers, none overlapping one still in use.
	seen := map[uintptr]bool{}
	for i := 1; i < len(bufs); i += 2 {
		seen[uintptr(unsafe.Pointer(unsafe.SliceData(bufs[i])))] = true
	}
	for range 30 {
		b := getBlock(n)
		p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if seen[p] {
			t.Fatalf("getBlock returned a buffer twice (%#x)", p)
		}
		seen[p] = true
		copy(b, bytes.Repeat([]byte{0xee}, 4096))
	}
}
