package localfs

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

// Reads served straight from the page cache.
//
// A read whose bytes are in the page cache costs one copy; sending it
// through io_uring or the pread goroutines costs a submission, a completion
// and a wake-up on top, which on a warm dataset is most of the time spent
// (bench read --warm measured ReadBatch at 0.61x of one plain pread per
// sample before this). So ReadBatch first tries each buffered read with
// preadv2(RWF_NOWAIT) on the calling goroutine: the kernel copies what is
// cached and answers EAGAIN instead of waiting for the device. What it
// does not serve in full goes on to io_uring or the preads as before.
//
// A file's probes run one at a time (File.probeMu), batches taking turns
// sample by sample. Measured with bench read --warm on one file (4 batches
// in flight, medians of 5 alternating runs at load 37-62): 1.31x of the
// pread loop with the probes serialised, 0.56x with them concurrent, CPU
// per sample about the same. The probes were serialised before by
// accident (RawConn.Read's read lock, per sample: 1.02x in the same runs)
// and that was kept on purpose when the descriptors came to be held per
// batch (hold.go). Why concurrent probes of one file on two shared vCPUs
// lose this much is not established (the page cache's LRU lock, taken to
// mark pages accessed, spinning on a preempted holder, is a guess).
//
// On a cold dataset every probe is a wasted system call (about a
// microsecond, against a device read of 50-100), so a batch stops probing
// once its misses outnumber its hits by probeGiveUp: a cold batch wastes
// at most that many probes.
//
// FFKIT_NO_NOWAIT=1 (or FS.NoNowait) turns the probe off, for comparisons.

// probeGiveUp: a batch stops probing when misses exceed hits by this many.
const probeGiveUp = 4

var (
	noNowaitEnv = os.Getenv("FFKIT_NO_NOWAIT") == "1"
	nowaitOff   atomic.Bool // set once the kernel refused RWF_NOWAIT on buffered reads

	// Counters of the probe, for benchmarks and tests (see ReadCounts).
	cachedReads, cachedBytes, probeMisses atomic.Int64
)

// ReadCounts reports, since the process started, how many ReadBatch reads
// (and bytes) the page-cache probe served, and how many probes missed
// (the read then went to io_uring or a pread).
func ReadCounts() (cached, cachedBytesN, misses int64) {
	return cachedReads.Load(), cachedBytes.Load(), probeMisses.Load()
}

// MappedReads reports how many of ReadCounts' cached reads were copies
// from a mapping (mmap.go) rather than preadv2 calls.
func MappedReads() int64 { return mappedReads.Load() }

// preadNowait reads into buf at off only from the page cache. It returns
// the bytes read (possibly fewer than len(buf): the rest is not cached, or
// the file ends) and the error; EAGAIN means nothing was cached.
func preadNowait(fd int, buf []byte, off int64) (int, syscall.Errno) {
	iov := unix.Iovec{Base: unsafe.SliceData(buf)}
	iov.SetLen(len(buf))
	n, _, errno := syscall.Syscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(&iov)), 1,
		uintptr(off), 0, unix.RWF_NOWAIT)
	if errno != 0 {
		return 0, errno
	}
	return int(n), 0
}

// batchState is one ReadBatch's scratch space, pooled: the requests'
// files, the held descriptors (holder), and the requests left for io_uring
// or the preads. A warm batch allocates nothing in this package.
type batchState struct {
	h             holder
	files         []*File
	reqs, rest    []fs.ReadRequest
	probe, mapped bool
	serve         func([]int) error // bs.serveFDs, bound once
}

var batchPool = sync.Pool{New: func() any {
	bs := new(batchState)
	bs.h.step = bs.h.control
	bs.serve = bs.serveFDs
	return bs
}}

// release returns bs to the pool, keeping no request reachable.
func (bs *batchState) release() {
	clear(bs.files)
	clear(bs.rest[:cap(bs.rest)])
	bs.reqs, bs.rest = nil, bs.rest[:0]
	batchPool.Put(bs)
}

// serveCached serves what it can of reqs from the page cache, by a copy
// from the file's mapping (mmap.go, when on), the preadv2 probe or a plain
// pread (below), and returns the rest (the unread tails of requests read
// in part). It returns reqs itself when it served nothing, and an empty
// slice when it served everything. The caller's slice is not modified.
// The reads go through descriptors held open for the batch (hold.go). The
// returned slice may live in bs (nil when nothing was tried), valid until
// bs.release.
func (l *FS) serveCached(reqs []fs.ReadRequest) (rest []fs.ReadRequest, bs *batchState) {
	probe := !l.NoNowait && !noNowaitEnv && !nowaitOff.Load()
	mapped := l.Mmap || mmapEnv
	if !probe && !mapped {
		return reqs, nil
	}
	EnsureProcs()
	bs = batchPool.Get().(*batchState)
	bs.files = grow(bs.files, len(reqs))
	for i := range reqs {
		q := &reqs[i]
		bs.files[i] = nil
		if f, ok := q.File.(*File); ok && !f.direct && len(q.Buf) > 0 && q.Off >= 0 && q.Off+int64(len(q.Buf)) <= f.size {
			bs.files[i] = f // else not probed: ReadFull names a range past the end
		}
	}
	bs.reqs, bs.rest, bs.probe, bs.mapped = reqs, bs.rest[:0], probe, mapped
	if err := bs.h.with(bs.files, bs.serve); err != nil {
		return reqs, bs // a closed file: the other paths report it
	}
	return bs.rest, bs
}

// Plain preads. preadv2 costs more than pread (about 0.17 us of 1.2 per
// warm 4 KiB read here: the iovec's import), and on a warm dataset every
// probe hits. So once plainAfter probes of a batch have hit in a row, the
// batch's further reads are plain preads on the calling goroutine, each
// timed: a read that takes longer than a copy from memory could (slowRead,
// plus a nanosecond a byte) has probably waited for the device, and the
// batch goes back to probing for good. A batch that meets pages the cache
// lost meanwhile thus waits for at most one device read on its own
// goroutine (about 100 us, against the batch's hundreds of reads), and a
// cold batch, whose probes miss, never reads plainly. A preempted read
// also looks slow; it only costs the batch its plain reads.
const (
	plainAfter = 8
	slowRead   = 50 * time.Microsecond
)

var (
	noPlainEnv = os.Getenv("FFKIT_NO_PLAIN_PREAD") == "1"
	noTurnsEnv = os.Getenv("FFKIT_PROBE_TURNS") == "0"
	plainReads atomic.Int64 // ReadCounts' cached reads that were plain preads
)

// PlainReads reports how many of ReadCounts' cached reads were plain
// preads after a run of probe hits, not preadv2 probes.
func PlainReads() int64 { return plainReads.Load() }

// serveFDs is serveCached with each probed request's held descriptor; it
// appends what it does not serve to bs.rest.
func (bs *batchState) serveFDs(fds []int) error {
	reqs, files, probe, mapped := bs.reqs, bs.files, bs.probe, bs.mapped
	var now int64
	if mapped {
		now = time.Now().UnixNano()
	}
	rest := bs.rest
	hits, misses, streak, plain := 0, 0, 0, 0
	plainOK := !noPlainEnv
	turns := !noTurnsEnv
	var hitBytes int64
	for i := range reqs {
		q := reqs[i]
		f := files[i]
		if f == nil {
			rest = append(rest, q)
			continue
		}
		if mapped {
			f.m.init(f, fds[i])
			f.m.look(now)
			if f.m.cached(q.Off, len(q.Buf)) && f.m.copyAt(q.Buf, q.Off) {
				hits++
				hitBytes += int64(len(q.Buf))
				mappedReads.Add(1)
				continue
			}
		}
		if !probe || misses-hits >= probeGiveUp || nowaitOff.Load() {
			rest = append(rest, q)
			continue
		}
		var n int
		var errno syscall.Errno
		if plainOK && streak >= plainAfter {
			if turns {
				f.probeMu.Lock()
			}
			t0 := time.Now()
			n, errno = pread(fds[i], q.Buf, q.Off)
			took := time.Since(t0)
			if turns {
				f.probeMu.Unlock()
			}
			if errno != 0 || n < len(q.Buf) || took > slowRead+time.Duration(len(q.Buf)) {
				plainOK = false // probe again, for the rest of the batch
			}
			if errno != 0 {
				n = 0
			}
			if n == len(q.Buf) {
				plain++
			}
		} else {
			if turns {
				f.probeMu.Lock()
			}
			n, errno = preadNowait(fds[i], q.Buf, q.Off)
			if turns {
				f.probeMu.Unlock()
			}
			switch errno {
			case 0, syscall.EAGAIN:
			case syscall.EOPNOTSUPP, syscall.EINVAL, syscall.ENOSYS:
				nowaitOff.Store(true) // this kernel cannot: stop probing for good
			}
		}
		if n == len(q.Buf) {
			hits++
			streak++
			hitBytes += int64(n)
			continue
		}
		misses++
		streak = 0
		if n > 0 {
			hitBytes += int64(n)
			q.Off += int64(n)
			q.Buf = q.Buf[n:]
		}
		rest = append(rest, q)
	}
	cachedReads.Add(int64(hits))
	cachedBytes.Add(hitBytes)
	probeMisses.Add(int64(misses))
	plainReads.Add(int64(plain))
	if hits == 0 && misses == 0 {
		rest = append(rest[:0], reqs...) // nothing tried: all of reqs is left
	}
	bs.rest = rest
	return nil
}

// pread is a plain pread of buf at off, without os.File's locks.
func pread(fd int, buf []byte, off int64) (int, syscall.Errno) {
	n, _, errno := syscall.Syscall6(syscall.SYS_PREAD64, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(buf))),
		uintptr(len(buf)), uintptr(off), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), 0
}

// residencyWindow is how much of a file CachedBytes maps at a time.
const residencyWindow = 1 << 30

// CachedBytes reports how many bytes of the local file name are in the
// page cache (mincore over a read-only mapping, a window at a time), and
// the file's size.
func (l *FS) CachedBytes(ctx context.Context, name string) (cached, size int64, err error) {
	f, err := os.Open(name)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size = st.Size()
	page := int64(os.Getpagesize())
	var vec []byte
	for off := int64(0); off < size; off += residencyWindow {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		n := min(residencyWindow, size-off)
		m, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return 0, 0, fmt.Errorf("localfs: map %s to see what is cached: %w", name, err)
		}
		pages := (n + page - 1) / page
		if int64(cap(vec)) < pages {
			vec = make([]byte, pages)
		}
		vec = vec[:pages]
		_, _, errno := syscall.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(m))), uintptr(len(m)),
			uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
		unix.Munmap(m)
		if errno != 0 {
			err = errno
			return 0, 0, fmt.Errorf("localfs: mincore %s: %w", name, err)
		}
		for i, v := range vec {
			if v&1 != 0 {
				cached += min(page, n-int64(i)*page)
			}
		}
	}
	return cached, size, nil
}
