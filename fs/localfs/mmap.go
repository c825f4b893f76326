package localfs

import (
	"math/bits"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cached reads by copying from a mapping.
//
// Even served by the page cache, a pread is a system call: on a warm
// dataset of 4 KiB samples that call is 80% of ReadBatch's time, and
// preadv2(RWF_NOWAIT) alone left ReadBatch at 0.6-0.8x of a plain pread
// loop (which checks no CRC and plans nothing). A buffered file is
// therefore also mapped (read-only, shared), and a read whose pages the
// page cache holds is a plain copy from the mapping: no system call.
//
// Which pages are cached is learned with mincore over the whole file,
// again when the last look is older than refreshEvery (or 100 times what
// the look cost, for a file so large that looking is expensive: at most 1%
// of the time goes to it). A read of a page the look did not see cached
// takes the preadv2 probe and then io_uring, so a cold file never blocks a
// goroutine on a page fault. A page evicted since the last look costs one
// blocking fault (the copy still returns the right bytes). A file cut
// shorter than its mapping raises SIGBUS on the copy; the copy turns it
// into a failed read (debug.SetPanicOnFault) and the read takes the other
// path, which reports the short file.
//
// Off by default (FS.Mmap or FFKIT_MMAP=1 turn it on): pages a process has
// mapped and touched are skipped by posix_fadvise(DONTNEED) and
// drop_caches, so while a reader holds its files open, another process
// cannot make them cold (the benchmarks' cold phases could not), and
// measured on this 2-core machine under load the copies cost less CPU per
// sample (1.3 us against 1.7 for a plain pread loop and 1.9-3.3 for the
// preadv2 probe) but did not turn that into more samples/s: ReadBatch's
// few goroutines got less of the shared CPU than the baseline's 64 (see
// docs/perf/loader.md, "Warm reads").

const (
	refreshEvery = time.Second
	// maxMapped: larger files are not mapped (the bitmap and the look
	// would cost more than they save).
	maxMapped = 1 << 40
)

var mmapEnv = os.Getenv("FFKIT_MMAP") == "1"

var mappedReads atomic.Int64 // reads served by a copy from a mapping

// mapping is a buffered file's read-only map and what is known of its
// cached pages.
type mapping struct {
	once sync.Once
	// mu guards data: copies hold it shared, unmap holds it exclusive, so
	// Close never unmaps under a copy.
	mu   sync.RWMutex
	data []byte // nil: not mapped (failed, too large, or closed)

	lookMu   sync.Mutex               // one look at a time; others use the last one
	resident atomic.Pointer[[]uint64] // bit per page: cached at the last look
	next     atomic.Int64             // unix nanoseconds of the next look
}

// init maps f, whose descriptor fd the caller holds open (once). A
// failure leaves data nil: reads take the other paths.
func (m *mapping) init(f *File, fd int) {
	m.once.Do(func() {
		if f.size == 0 || f.size > maxMapped {
			return
		}
		b, err := unix.Mmap(fd, 0, int(f.size), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return
		}
		m.mu.Lock()
		m.data = b
		m.mu.Unlock()
	})
}

// look refreshes the bitmap of cached pages if it is due.
func (m *mapping) look(now int64) {
	if m.next.Load() > now || !m.lookMu.TryLock() {
		return
	}
	defer m.lookMu.Unlock()
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.data == nil {
		m.next.Store(now + int64(time.Hour))
		return
	}
	start := time.Now()
	page := os.Getpagesize()
	pages := (len(m.data) + page - 1) / page
	vec := make([]byte, pages)
	_, _, errno := syscall.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(m.data))),
		uintptr(len(m.data)), uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
	bm := make([]uint64, (pages+63)/64)
	if errno == 0 {
		for i, v := range vec {
			if v&1 != 0 {
				bm[i/64] |= 1 << (i % 64)
			}
		}
	}
	m.resident.Store(&bm)
	m.next.Store(now + max(int64(refreshEvery), 100*int64(time.Since(start))))
}

// cached reports whether the last look saw every page of [off, off+n) cached.
func (m *mapping) cached(off int64, n int) bool {
	p := m.resident.Load()
	if p == nil || n == 0 {
		return false
	}
	bm := *p
	shift := uint(bits.TrailingZeros(uint(os.Getpagesize())))
	first, last := uint64(off)>>shift, uint64(off+int64(n)-1)>>shift
	for pg := first; pg <= last; pg++ {
		w := pg / 64
		if w >= uint64(len(bm)) {
			return false
		}
		if pg%64 == 0 && pg+63 <= last {
			if bm[w] != ^uint64(0) {
				return false
			}
			pg += 63
			continue
		}
		if bm[w]&(1<<(pg%64)) == 0 {
			return false
		}
	}
	return true
}

// copyAt copies [off, off+len(dst)) from the mapping into dst. It returns
// false if the file is not mapped or the copy faulted (file cut shorter).
func (m *mapping) copyAt(dst []byte, off int64) (ok bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.data == nil || off < 0 || off+int64(len(dst)) > int64(len(m.data)) {
		return false
	}
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if recover() != nil {
			ok = false
		}
	}()
	copy(dst, m.data[off:])
	return true
}

// unmap drops the mapping (File.Close).
func (m *mapping) unmap() {
	m.once.Do(func() {}) // a later init must not map a closed file
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.data != nil {
		unix.Munmap(m.data)
		m.data = nil
	}
}
