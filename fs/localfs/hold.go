package localfs

import (
	"fmt"
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

// withFDs calls fn with the descriptor of each files[i] (-1 where
// files[i] is nil), every one held open until fn returns. It fails,
// without calling fn, if a file is already closed.
func withFDs(files []*File, fn func(fds []int) error) error {
	var distinct []*File
	var index map[*File]int         // once there are many distinct files
	slot := make([]int, len(files)) // files[i] is distinct[slot[i]]
	for i, f := range files {
		slot[i] = -1
		if f == nil {
			continue
		}
		if index != nil {
			if k, ok := index[f]; ok {
				slot[i] = k
			}
		} else {
			for k, g := range distinct { // batches name few files: a scan beats a map
				if g == f {
					slot[i] = k
					break
				}
			}
		}
		if slot[i] < 0 {
			slot[i] = len(distinct)
			distinct = append(distinct, f)
			if index == nil && len(distinct) > 16 {
				index = make(map[*File]int, 2*len(distinct))
				for k, g := range distinct {
					index[g] = k
				}
			} else if index != nil {
				index[f] = slot[i]
			}
		}
	}
	dfd := make([]int, len(distinct))
	var hold func(k int) error
	hold = func(k int) error {
		if k == len(distinct) {
			fds := make([]int, len(files))
			for i, s := range slot {
				fds[i] = -1
				if s >= 0 {
					fds[i] = dfd[s]
				}
			}
			return fn(fds)
		}
		f := distinct[k]
		rc, err := f.f.SyscallConn()
		if err != nil {
			return fmt.Errorf("localfs: read %s: %w", f.name, err)
		}
		var ferr error
		if err := rc.Control(func(fd uintptr) {
			dfd[k] = int(fd)
			ferr = hold(k + 1)
		}); err != nil {
			return fmt.Errorf("localfs: read %s: %w", f.name, err)
		}
		return ferr
	}
	return hold(0)
}
