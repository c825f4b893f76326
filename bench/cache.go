package bench

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CacheState says how reads in a measurement met the page cache; every
// benchmark prints it next to its read figures.
type CacheState string

const (
	// CacheDirect: files opened with O_DIRECT (fs.OpenOptions{Direct: true}).
	CacheDirect CacheState = "direct (O_DIRECT, page cache bypassed)"
	// CacheDropped: the kernel's page cache was dropped before the run.
	CacheDropped CacheState = "cold (page cache dropped)"
	// CacheEvicted: the benchmark's own files were evicted (fadvise DONTNEED).
	CacheEvicted CacheState = "cold (files evicted from the page cache)"
	// CacheWarm: nothing was done; reads may come from memory.
	CacheWarm CacheState = "warm (reads may be served by the page cache)"
	// CacheWarmed: the files were read whole before the phase (MakeWarm).
	CacheWarmed CacheState = "warm (files read into the page cache before each phase)"
	// CacheRemote: the files are on a remote FS (ffkit://) and nothing
	// could be dropped: the storage servers' page cache may serve reads.
	CacheRemote CacheState = "remote (the storage servers' page cache may serve reads; could not drop it)"
	// CacheRemoteDropped: remote files, and this machine's page cache was
	// dropped, which makes a cluster running on this machine cold (storage
	// servers on other machines keep their caches).
	CacheRemoteDropped CacheState = "cold on this machine (page cache dropped; storage servers elsewhere keep theirs)"
)

// DropCaches writes back dirty pages and drops the kernel's clean page
// cache (echo 1 > /proc/sys/vm/drop_caches). It needs root and a writable
// /proc/sys (not every container has one).
func DropCaches() error {
	unix.Sync()
	f, err := os.OpenFile("/proc/sys/vm/drop_caches", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("bench: drop the page cache: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString("1\n"); err != nil {
		return fmt.Errorf("bench: drop the page cache: %w", err)
	}
	return nil
}

// EvictFile writes back a local file's dirty pages and asks the kernel to
// drop its cached pages (posix_fadvise DONTNEED). Works without root.
func EvictFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := unix.Fdatasync(fd); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EBADF) {
		return fmt.Errorf("bench: evict %s: %w", path, err)
	}
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("bench: evict %s: %w", path, err)
	}
	return nil
}

// MakeCold prepares a read measurement. It first evicts the given local
// files from the page cache (fadvise DONTNEED: targeted, and it does not
// disturb other work on the machine); only if that is impossible does it
// drop the whole page cache (root only). With direct (the reads will use
// O_DIRECT) the files are still evicted so no dirty pages interfere.
// remote says the files live on a remote FS: then the whole page cache
// of this machine is dropped when allowed (a cluster may run here), since
// O_DIRECT on the client does not reach the servers' disks. It returns the
// state to print; the error says why the reads may still be warm.
func MakeCold(direct, remote bool, localFiles ...string) (CacheState, error) {
	if remote {
		// Direct reads mean nothing to a remote file system's servers
		// (they read with their own I/O), so always try to drop.
		if err := DropCaches(); err != nil {
			return CacheRemote, err
		}
		return CacheRemoteDropped, nil
	}
	var evictErr error
	for _, p := range localFiles {
		if err := EvictFile(p); err != nil && evictErr == nil {
			evictErr = err
		}
	}
	if direct {
		return CacheDirect, nil
	}
	if evictErr == nil && len(localFiles) > 0 {
		return CacheEvicted, nil
	}
	if err := DropCaches(); err == nil {
		return CacheDropped, nil
	} else if evictErr == nil {
		evictErr = err
	}
	return CacheWarm, evictErr
}

// MakeWarm reads local files whole, so that the reads of a measurement are
// served by the page cache (as long as the files fit in memory).
func MakeWarm(localFiles ...string) (CacheState, error) {
	buf := make([]byte, 1<<20)
	for _, p := range localFiles {
		f, err := os.Open(p)
		if err != nil {
			return CacheWarm, fmt.Errorf("bench: warm %s: %w", p, err)
		}
		for {
			_, err = f.Read(buf)
			if err != nil {
				break
			}
		}
		f.Close()
		if err != io.EOF {
			return CacheWarm, fmt.Errorf("bench: warm %s: %w", p, err)
		}
	}
	return CacheWarmed, nil
}
