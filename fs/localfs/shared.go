package localfs

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/ffkit/ffkit/fs"
)

// A shared ring serves every concurrent ReadBatch of a process that uses the
// same in-flight budget (FS.Parallelism). Each call queues its reads as one
// job; a driver goroutine keeps up to budget reads in flight, taking reads
// from the oldest job first and from later jobs as soon as slots free up.
// So when one batch's tail drains, the next batch's reads fill the device
// queue: the queue depth stays at the budget across batches, instead of
// each call running its own ring whose depth falls to zero at its tail.
//
// The driver runs only while there is work: it starts when a job is queued
// to an idle ring and returns when no job is queued and nothing is in
// flight. The ring itself is kept for the next job.

// job is one ReadBatch call's reads on a shared ring.
type job struct {
	ctx      context.Context
	files    []*File
	reqs     []fs.ReadRequest
	next     int   // next request to submit
	inflight int   // requests submitted, not completed
	redo     []int // requests to finish with ReadFull (short reads, errors, unsubmitted after a ring failure)
	done     chan struct{}
}

// finished reports whether nothing more will be submitted for j and
// nothing of it is in flight.
func (j *job) finished() bool { return j.next >= len(j.reqs) && j.inflight == 0 }

type slot struct {
	j *job
	i int
}

type sharedRing struct {
	key    int // FS.Parallelism it serves
	budget int
	r      *ring

	mu      sync.Mutex
	queue   []*job // guarded by mu: jobs not yet fully submitted, or in flight
	running bool   // guarded by mu: a driver goroutine is running
	dead    bool   // guarded by mu: the ring failed; callers read another way
}

var (
	sharedMu    sync.Mutex
	sharedRings = map[int]*sharedRing{} // by budget, guarded by sharedMu
)

// getShared returns the shared ring for budget, setting it up on first use.
func getShared(budget int) (*sharedRing, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s := sharedRings[budget]; s != nil {
		return s, nil
	}
	d := uint32(1)
	for d < uint32(budget) && d < 4096 {
		d <<= 1
	}
	r, err := newRing(d)
	if err != nil {
		return nil, err
	}
	s := &sharedRing{key: budget, budget: min(budget, int(r.entries)), r: r}
	sharedRings[budget] = s
	return s, nil
}

// read queues the requests as one job and waits for it. It returns
// errUringUnavailable, with nothing read through the ring, if the ring
// cannot be used.
func (s *sharedRing) read(ctx context.Context, files []*File, reqs []fs.ReadRequest) error {
	j := &job{ctx: ctx, files: files, reqs: reqs, done: make(chan struct{})}
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return errUringUnavailable
	}
	s.queue = append(s.queue, j)
	if !s.running {
		s.running = true
		go s.drive()
	}
	s.mu.Unlock()
	<-j.done // the driver always closes done, also on cancellation or failure
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, i := range j.redo {
		if err := ReadFull(reqs[i].File, reqs[i].Buf, reqs[i].Off); err != nil {
			return err
		}
	}
	return nil
}

// drive submits and reaps until no job is left.
func (s *sharedRing) drive() {
	r := s.r
	slots := make([]slot, s.budget)
	free := make([]int, s.budget)
	for i := range free {
		free[i] = s.budget - 1 - i
	}
	inflight := uint32(0)
	failures := 0
	var queue []*job
	for {
		// Take new jobs; finish the ones that are done.
		s.mu.Lock()
		queue = append(queue[:0], s.queue...)
		if len(queue) == 0 && inflight == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()

		// Fill free slots, oldest job first.
		head, tail := atomic.LoadUint32(r.sqHead), atomic.LoadUint32(r.sqTail)
		for _, j := range queue {
			if j.ctx.Err() != nil {
				j.next = len(j.reqs) // submit nothing more of it
			}
			for j.next < len(j.reqs) && len(free) > 0 && inflight+(tail-head) < r.entries {
				i := j.next
				j.next++
				q := &j.reqs[i]
				if len(q.Buf) == 0 {
					continue
				}
				sl := free[len(free)-1]
				free = free[:len(free)-1]
				slots[sl] = slot{j, i}
				j.inflight++
				r.push(int(j.files[i].f.Fd()), q.Buf, q.Off, uint64(sl))
				tail++
			}
		}
		s.complete()
		pending := tail - head
		if pending == 0 && inflight == 0 {
			continue // every queued job finished (empty or cancelled)
		}
		err := r.enter(pending, 1)
		inflight += atomic.LoadUint32(r.sqHead) - head
		ringStats.enters.Add(1)
		ringStats.depthSum.Add(int64(inflight))
		inflight -= uint32(r.reap(func(ud uint64, res int32) {
			sl := slots[ud]
			slots[ud] = slot{}
			free = append(free, int(ud))
			if res < 0 || int(res) < len(sl.j.reqs[sl.i].Buf) {
				sl.j.redo = append(sl.j.redo, sl.i) // an error or a short read: ReadFull decides
			}
			sl.j.inflight--
		}))
		s.complete()
		if err == nil {
			failures = 0
			continue
		}
		if errno, ok := errors.AsType[syscall.Errno](err); ok && (errno == syscall.EAGAIN || errno == syscall.EBUSY) {
			continue // the kernel is short of resources for a moment
		}
		if failures++; inflight > 0 && failures <= 1000 {
			continue // reads are in flight into callers' buffers: keep waiting
		}
		s.fail(slots, inflight)
		return
	}
}

// complete removes finished jobs from the queue and wakes their callers.
func (s *sharedRing) complete() {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := 0
	for _, j := range s.queue {
		if j.finished() {
			close(j.done)
			continue
		}
		s.queue[k] = j
		k++
	}
	clear(s.queue[k:])
	s.queue = s.queue[:k]
}

// fail gives the ring up after a persistent error: every queued job's
// unsubmitted reads, and any still in flight, are left to its caller's
// ReadFull. With reads still in flight (the kernel kept failing for a long
// time) the ring is leaked rather than closed, as the kernel may still
// write into the callers' buffers.
func (s *sharedRing) fail(slots []slot, inflight uint32) {
	uringOff.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead, s.running = true, false
	for _, sl := range slots {
		if sl.j != nil {
			sl.j.redo = append(sl.j.redo, sl.i)
		}
	}
	for _, j := range s.queue {
		for ; j.next < len(j.reqs); j.next++ {
			j.redo = append(j.redo, j.next)
		}
		close(j.done)
	}
	s.queue = nil
	if inflight == 0 {
		s.r.close()
	}
	sharedMu.Lock()
	if sharedRings[s.key] == s {
		delete(sharedRings, s.key)
	}
	sharedMu.Unlock()
}

// ringStats counts shared-ring waits and the reads in flight at each, for
// RingStats.
var ringStats struct{ enters, depthSum atomic.Int64 }

// RingStats returns how many times the shared rings waited for completions
// and the mean number of reads in flight when they did (the queue depth the
// device saw), since the process started.
func RingStats() (waits int64, meanDepth float64) {
	w := ringStats.enters.Load()
	if w == 0 {
		return 0, 0
	}
	return w, float64(ringStats.depthSum.Load()) / float64(w)
}
