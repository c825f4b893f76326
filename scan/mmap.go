package scan

import (
	"fmt"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// Local input files are memory-mapped for the flat decoder (read-only,
// once per File): the decompressor then reads the page cache in place
// instead of a pread copy of every column chunk. A file that shrinks under
// the mapping faults; readers set debug.SetPanicOnFault so that the fault
// becomes a panic, which decodeFlat turns into ErrCorrupt naming the file.

type fdFile interface{ Fd() uintptr }

// mapped returns the mapping of the whole file, or nil when the file is not
// local (or mapping fails: the caller reads instead).
func (pf *File) mapped() []byte {
	pf.mapOnce.Do(func() {
		fd, ok := pf.f.(fdFile)
		if !ok || pf.coalesce || pf.Size <= 0 || pf.Size != int64(int(pf.Size)) {
			return
		}
		if d, ok := pf.f.(interface{ Direct() bool }); ok && d.Direct() {
			return
		}
		b, err := unix.Mmap(int(fd.Fd()), 0, int(pf.Size), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return
		}
		pf.mapping = b
	})
	return pf.mapping
}

// chunkBytes returns bytes [start, end) of the file: a slice of the
// mapping, or read into buf.
func (pf *File) chunkBytes(start, end int64, buf *[]byte) ([]byte, error) {
	if start < 0 || end > pf.Size || end < start {
		return nil, fmt.Errorf("bytes [%d, %d) outside a %d-byte file", start, end, pf.Size)
	}
	pf.bytesRead.Add(end - start)
	if m := pf.mapped(); m != nil {
		return m[start:end:end], nil
	}
	*buf = grow(*buf, int(end-start))
	if _, err := pf.f.ReadAt(*buf, start); err != nil {
		return nil, fmt.Errorf("read %d bytes at %d: %w", end-start, start, err)
	}
	return *buf, nil
}

func (pf *File) unmap() {
	if pf.mapping != nil {
		unix.Munmap(pf.mapping)
		pf.mapping = nil
	}
}

// faultPanics makes a fault on a mapping a recoverable panic for the
// calling goroutine; the returned func restores the setting.
func faultPanics() func() {
	old := debug.SetPanicOnFault(true)
	return func() { debug.SetPanicOnFault(old) }
}

// dropChunk tells the kernel the mapping's pages of bytes [start, end) are
// done with (MADV_DONTNEED): the page cache keeps them, but they leave the
// process's resident set, so that a scan of a file larger than memory does
// not show the whole file as resident. A later read of them faults them
// back in from the page cache.
func (pf *File) dropChunk(start, end int64) {
	m := pf.mapping
	if m == nil || start >= end {
		return
	}
	ps := int64(unix.Getpagesize())
	lo, hi := start/ps*ps, min((end+ps-1)/ps*ps, int64(len(m)))
	if lo < hi {
		unix.Madvise(m[lo:hi], unix.MADV_DONTNEED)
	}
}
