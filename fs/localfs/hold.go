package localfs

import (
	"fmt"
	"sync"
)

// Descriptors held open for the length of a batch.
//
// Reads that bypass os.File (the preadv2 probe, io_uring) name the file by
// its descriptor number. A File closed meanwhile (a mount's release while
// a read-ahead runs) would close that number, and the kernel could hand
// it to the next open: the read would then land in another file. So a
// batch takes one reference on each of its files' descriptors through the
// raw connection (RawConn.Control: os.File.Close then only marks the file
// closed, and the descriptor is closed when the last reference is
// dropped) and keeps it until its last read has completed, ring
// completions included. Control takes no lock shared with other readers,
// unlike RawConn.Read (whose read lock serialised every batch's probes of
// a file: one core of two busy with four batches in flight).
//
// The bookkeeping (distinct files, descriptors, the nested Control calls)
// lives in a pooled holder, so that a warm batch allocates nothing here.

// holder holds a batch's descriptors; see withFDs.
type holder struct {
	distinct []*File
	slot     []int // files[i] is distinct[slot[i]], -1 for nil
	dfd      []int // the held descriptor of distinct[k]
	fds      []int // fn's argument
	index    map[*File]int
	k        int               // distinct files held so far
	fn       func([]int) error // called with every descriptor held
	err      error             // what the innermost call returned
	step     func(uintptr)     // h.control, bound once per holder
}

var holderPool = sync.Pool{New: func() any {
	h := new(holder)
	h.step = h.control
	return h
}}

// withFDs calls fn with the descriptor of each files[i] (-1 where
// files[i] is nil), every one held open until fn returns. It fails,
// without calling fn, if a file is already closed.
func withFDs(files []*File, fn func(fds []int) error) error {
	h := holderPool.Get().(*holder)
	defer holderPool.Put(h)
	return h.with(files, fn)
}

// with is withFDs on h's scratch space.
func (h *holder) with(files []*File, fn func(fds []int) error) error {
	h.distinct = h.distinct[:0]
	h.slot = grow(h.slot, len(files))
	useIndex := false
	for i, f := range files {
		h.slot[i] = -1
		if f == nil {
			continue
		}
		if useIndex {
			if k, ok := h.index[f]; ok {
				h.slot[i] = k
			}
		} else {
			for k, g := range h.distinct { // batches name few files: a scan beats a map
				if g == f {
					h.slot[i] = k
					break
				}
			}
		}
		if h.slot[i] < 0 {
			h.slot[i] = len(h.distinct)
			h.distinct = append(h.distinct, f)
			if !useIndex && len(h.distinct) > 16 {
				useIndex = true
				if h.index == nil {
					h.index = make(map[*File]int, 2*len(h.distinct))
				}
				clear(h.index)
				for k, g := range h.distinct {
					h.index[g] = k
				}
			} else if useIndex {
				h.index[f] = h.slot[i]
			}
		}
	}
	h.dfd = grow(h.dfd, len(h.distinct))
	h.fds = grow(h.fds, len(files))
	h.fn, h.k, h.err = fn, 0, nil
	err := h.next()
	clear(h.distinct) // no File stays reachable from the pool
	if useIndex {
		clear(h.index)
	}
	h.fn, h.err = nil, nil
	return err
}

// next holds distinct[k:] one by one, each inside the previous one's
// Control call, and then calls fn.
func (h *holder) next() error {
	if h.k == len(h.distinct) {
		for i, s := range h.slot {
			h.fds[i] = -1
			if s >= 0 {
				h.fds[i] = h.dfd[s]
			}
		}
		return h.fn(h.fds)
	}
	f := h.distinct[h.k]
	if err := f.rc.Control(h.step); err != nil {
		return fmt.Errorf("localfs: read %s: %w", f.name, err)
	}
	return h.err
}

// control is next's Control callback: distinct[k] is held as fd.
func (h *holder) control(fd uintptr) {
	h.dfd[h.k] = int(fd)
	h.k++
	h.err = h.next()
}

// grow returns s with length n, reusing its array when large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
