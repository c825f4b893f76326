package engine

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// segment is a memfd mapped into the engine.
type segment struct {
	fd  int
	mem []byte
}

// newSegment creates a memfd of size bytes and maps it. Size 0 gives a
// segment with no descriptor and no memory.
func newSegment(name string, size int64) (*segment, error) {
	return mapSegment(name, size, unix.MAP_POPULATE)
}

// newSparseSegment is newSegment without pre-faulting: pages take memory
// only when first written.
func newSparseSegment(name string, size int64) (*segment, error) {
	return mapSegment(name, size, 0)
}

func mapSegment(name string, size int64, extra int) (*segment, error) {
	if size == 0 {
		return &segment{fd: -1}, nil
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("engine: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("engine: size shared memory to %d bytes: %w", size, err)
	}
	// MAP_POPULATE faults every page in one call instead of one trap per
	// 4 KiB page while the reads fill it.
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|extra)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("engine: map %d bytes of shared memory: %w", size, err)
	}
	return &segment{fd: fd, mem: mem}, nil
}

// unmap releases the engine's mapping; the descriptor stays open.
func (s *segment) unmap() {
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
}

// close releases the mapping and the descriptor.
func (s *segment) close() {
	s.unmap()
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}
