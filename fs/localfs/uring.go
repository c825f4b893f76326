package localfs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

// io_uring reads for ReadBatch.
//
// A batch of reads is submitted to an io_uring ring (IORING_OP_READ) by the
// calling goroutine, which keeps up to `depth` reads in flight and reaps
// completions itself: one thread and a few system calls per batch instead
// of one blocked thread and a wake-up per read. On a 2-core machine shared
// with other work, that is the difference between holding a device's queue
// full and not (measured with `ffkit bench read --direct`, see docs/perf/ffrecord.md).
//
// Rings are set up lazily and kept on a small free list; where io_uring is
// unavailable (old kernel, seccomp) ReadBatch falls back to parallel preads.

const (
	sysIOUringSetup    = 425
	sysIOUringEnter    = 426
	sysIOUringRegister = 427

	ioringRegisterIOWQMaxWorkers = 19

	ioringOffSQRing = 0
	ioringOffCQRing = 0x8000000
	ioringOffSQEs   = 0x10000000

	ioringFeatSingleMmap = 1 << 0
	ioringEnterGetevents = 1 << 0
	ioringOpRead         = 22

	sqeSize = 64
	cqeSize = 16
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// ring is one io_uring instance. It belongs to one goroutine at a time
// (taken from and returned to the free list).
type ring struct {
	fd      int
	entries uint32
	sqMem   []byte
	cqMem   []byte // == sqMem with IORING_FEAT_SINGLE_MMAP
	sqes    []byte

	sqHead, sqTail, sqMask *uint32
	sqArray                unsafe.Pointer
	cqHead, cqTail, cqMask *uint32
	cqes                   unsafe.Pointer
}

func newRing(entries uint32) (*ring, error) {
	var p uringParams
	fd, _, errno := syscall.Syscall(sysIOUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ring{fd: int(fd), entries: p.sqEntries}
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*cqeSize)
	single := p.features&ioringFeatSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqMem, err = unix.Mmap(r.fd, ioringOffSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap sq: %w", err)
	}
	if single {
		r.cqMem = r.sqMem
	} else if r.cqMem, err = unix.Mmap(r.fd, ioringOffCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap cq: %w", err)
	}
	if r.sqes, err = unix.Mmap(r.fd, ioringOffSQEs, int(p.sqEntries*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap sqes: %w", err)
	}
	sq := unsafe.Pointer(&r.sqMem[0])
	cq := unsafe.Pointer(&r.cqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.sqOff.tail))
	r.sqMask = (*uint32)(unsafe.Add(sq, p.sqOff.ringMask))
	r.sqArray = unsafe.Add(sq, p.sqOff.array)
	r.cqHead = (*uint32)(unsafe.Add(cq, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.cqOff.tail))
	r.cqMask = (*uint32)(unsafe.Add(cq, p.cqOff.ringMask))
	r.cqes = unsafe.Add(cq, p.cqOff.cqes)
	// Buffered reads that miss the page cache run on the ring's "bounded"
	// io-wq workers, by default 4 per CPU: 8 on a 2-core machine, far too
	// few to keep a disk busy. Allow one per ring entry (best effort: old
	// kernels lack this and keep their default).
	workers := [2]uint32{r.entries, 0}
	syscall.Syscall6(sysIOUringRegister, uintptr(r.fd), ioringRegisterIOWQMaxWorkers, uintptr(unsafe.Pointer(&workers[0])), 2, 0, 0)
	return r, nil
}

func (r *ring) close() {
	if r.sqes != nil {
		unix.Munmap(r.sqes)
	}
	if r.cqMem != nil && len(r.sqMem) > 0 && &r.cqMem[0] != &r.sqMem[0] {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	unix.Close(r.fd)
}

// push queues one read; the caller has checked there is room.
func (r *ring) push(fd int, buf []byte, off int64, userData uint64) {
	tail := atomic.LoadUint32(r.sqTail)
	idx := tail & *r.sqMask
	sqe := unsafe.Pointer(&r.sqes[idx*sqeSize])
	clear(unsafe.Slice((*byte)(sqe), sqeSize))
	*(*uint8)(sqe) = ioringOpRead
	*(*int32)(unsafe.Add(sqe, 4)) = int32(fd)
	*(*uint64)(unsafe.Add(sqe, 8)) = uint64(off)
	*(*uint64)(unsafe.Add(sqe, 16)) = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	*(*uint32)(unsafe.Add(sqe, 24)) = uint32(len(buf))
	*(*uint64)(unsafe.Add(sqe, 32)) = userData
	*(*uint32)(unsafe.Add(r.sqArray, idx*4)) = idx
	atomic.StoreUint32(r.sqTail, tail+1) // publishes the SQE to the kernel
}

// enter submits toSubmit queued SQEs and waits for at least minComplete
// completions.
func (r *ring) enter(toSubmit, minComplete uint32) error {
	for {
		flags := uintptr(0)
		if minComplete > 0 {
			flags = ioringEnterGetevents
		}
		_, _, errno := syscall.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), flags, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
		return nil
	}
}

// reap calls fn for each completion ready and returns how many there were.
func (r *ring) reap(fn func(userData uint64, res int32)) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		cqe := unsafe.Add(r.cqes, (head&*r.cqMask)*cqeSize)
		fn(*(*uint64)(cqe), *(*int32)(unsafe.Add(cqe, 8)))
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

// The free list of rings, by size.
var (
	ringsMu   sync.Mutex
	freeRings = map[uint32][]*ring{} // guarded by ringsMu
	uringOff  atomic.Bool            // set once io_uring turned out unavailable
)

const maxFreeRings = 8

func getRing(depth uint32) (*ring, error) {
	ringsMu.Lock()
	if l := freeRings[depth]; len(l) > 0 {
		r := l[len(l)-1]
		freeRings[depth] = l[:len(l)-1]
		ringsMu.Unlock()
		return r, nil
	}
	ringsMu.Unlock()
	return newRing(depth)
}

func putRing(depth uint32, r *ring) {
	ringsMu.Lock()
	defer ringsMu.Unlock()
	if len(freeRings[depth]) < maxFreeRings {
		freeRings[depth] = append(freeRings[depth], r)
		return
	}
	r.close()
}

// uringOK reports whether io_uring can be used (checked once).
func uringOK() bool { return !uringOff.Load() }

// readURing reads every request through one ring with up to depth reads in
// flight. Requests the ring does not complete in full (short reads, errors
// the kernel reports for a request) are finished with ReadFull, so the
// result is the same as with preads. It returns errUringUnavailable, having
// left nothing in flight, if the ring cannot be used; the caller then reads
// everything another way.
//
// With a budget, every read in flight holds one of its tokens: the ring
// takes what is free before submitting (waiting only when it has nothing in
// flight) and gives each token back as its read completes, so concurrent
// batches share the budget's depth without dividing it.
//
// Every file's descriptor is held open from the first submission to the
// last completion (hold.go): the kernel may look the number up only when
// a worker thread starts the read, after io_uring_enter has returned, so
// a Close meanwhile must not free the number for another open.
func readURing(ctx context.Context, files []*File, reqs []fs.ReadRequest, depth int, budget *fs.Budget) error {
	return withFDs(files, func(fds []int) error { return readURingFDs(ctx, fds, reqs, depth, budget) })
}

// readURingFDs is readURing with each request's held descriptor.
func readURingFDs(ctx context.Context, fds []int, reqs []fs.ReadRequest, depth int, budget *fs.Budget) error {
	d := uint32(1)
	for d < uint32(depth) && d < 4096 {
		d <<= 1
	}
	r, err := getRing(d)
	if err != nil {
		uringOff.Store(true)
		return fmt.Errorf("%w: %w", errUringUnavailable, err)
	}
	var redo []int // requests to finish with ReadFull
	next, inflight := 0, uint32(0)
	held := 0 // budget tokens held: one per read pushed and not yet reaped
	defer func() { budget.Give(held) }()
	failures := 0
	for {
		if ctx.Err() != nil {
			next = len(reqs) // submit nothing more; drain what is in flight
		}
		for next < len(reqs) && len(reqs[next].Buf) == 0 {
			next++
		}
		head, tail := atomic.LoadUint32(r.sqHead), atomic.LoadUint32(r.sqTail)
		if room := int(r.entries - inflight - (tail - head)); next < len(reqs) && room > 0 {
			want := min(room, len(reqs)-next)
			got := budget.TryTake(want)
			if got == 0 && inflight == 0 && tail == head {
				// Nothing of ours in flight: wait for another batch's reads.
				var err error
				if got, err = budget.Take(ctx, want); err != nil {
					next = len(reqs)
				}
			}
			held += got
			for ; next < len(reqs) && got > 0; next++ {
				if q := &reqs[next]; len(q.Buf) > 0 {
					r.push(fds[next], q.Buf, q.Off, uint64(next))
					tail++
					got--
				}
			}
			budget.Give(got) // taken for reads that turned out empty
			held -= got
		}
		pending := tail - head
		if pending == 0 && inflight == 0 {
			if next < len(reqs) {
				continue
			}
			break
		}
		// Submit in chunks (see submitChunk), then wait for a completion
		// unless one is already there.
		var err error
		for err == nil && pending > 0 {
			h0 := atomic.LoadUint32(r.sqHead)
			err = r.enter(min(pending, submitChunk), 0)
			took := atomic.LoadUint32(r.sqHead) - h0
			if took == 0 {
				break
			}
			pending -= took
		}
		if err == nil && atomic.LoadUint32(r.cqHead) == atomic.LoadUint32(r.cqTail) {
			err = r.enter(pending, 1)
		}
		inflight += atomic.LoadUint32(r.sqHead) - head // what the kernel took
		reaped := r.reap(func(ud uint64, res int32) {
			if i := int(ud); res < 0 || int(res) < len(reqs[i].Buf) {
				redo = append(redo, i) // an error or a short read: ReadFull decides
			}
		})
		inflight -= uint32(reaped)
		budget.Give(reaped)
		held -= reaped
		if err == nil {
			failures = 0
			continue
		}
		if errno, ok := errors.AsType[syscall.Errno](err); ok && (errno == syscall.EAGAIN || errno == syscall.EBUSY) {
			continue // the kernel is short of resources for a moment
		}
		if inflight == 0 {
			// Nothing in flight: drop this ring (and any SQEs it did not
			// take) and let the caller read everything another way.
			r.close()
			uringOff.Store(true)
			return fmt.Errorf("%w: %w", errUringUnavailable, err)
		}
		// Reads are in flight into the caller's buffers: keep waiting.
		next = len(reqs)
		if failures++; failures > 1000 {
			r.close()
			return fmt.Errorf("localfs: io_uring failed with reads in flight: %w", err)
		}
	}
	putRing(d, r)
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, i := range redo {
		if err := ReadFull(reqs[i].File, reqs[i].Buf, reqs[i].Off); err != nil {
			return err
		}
	}
	return nil
}

// submitChunk is how many queued reads one io_uring_enter submits. The
// kernel plugs the block queue while it submits more than two SQEs in one
// call, so the first read of a long run reaches the device only when the
// last is queued: the device's queue empties in bursts and refills in
// bursts. Two per call skips the plug and, like fio (one per call by
// default), keeps the device's queue full. Measured: bench read --direct on
// 4 KiB samples went from 0.84x to 0.88-0.91x of fio's IOPS (alternating
// runs), and a bare ring loop from 0.93x to 1.04x.
const submitChunk = 2

var errUringUnavailable = fmt.Errorf("localfs: io_uring unavailable")
