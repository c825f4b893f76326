package fuse

import (
	"context"
	"sync"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/ffkit/ffkit/fs"
)

// kernelCache tracks what a node's pages in the kernel's page cache hold,
// as far as this mount put them there: a file fetched whole at open is
// written into the kernel's cache (FUSE_NOTIFY_STORE) piece by piece as
// its pieces arrive, after the open has returned, and a later open of the
// same unchanged file keeps those pages instead of fetching it again.
//
// The rules that keep it close-to-open consistent:
//   - An open of a file whose version (inode, size, mtime, ctime) is not
//     the one the pages were stored for drops the kernel's pages before it
//     returns (and stops this node's stores of the older version first):
//     from then on the pages come from this open's fetch or its reads.
//   - A change through this mount (a write open, a truncate) first stops
//     the stores in flight (stop) and forgets the version, so no store of
//     older bytes lands after it; the kernel keeps its pages coherent with
//     the writes it sends itself.
//   - The pages are kept across opens only when a store of that version
//     completed and the kernel still has the file's first page.
type kernelCache struct {
	mu sync.Mutex
	// gen is bumped by stop; a store started in an older gen ends before
	// its next piece. Guarded by mu.
	gen uint64
	// stopped is closed by stop, to wake stores waiting for a piece; a
	// new one is made for the next gen. Guarded by mu.
	stopped chan struct{}
	// live counts the stores running; idle is closed when it drops to 0
	// (nil while no store runs). Guarded by mu.
	live int
	idle chan struct{}
	// ver is the version the kernel's pages of the node belong to, when
	// verOK (else they may be of any version); complete: a store of ver
	// wrote every page. Guarded by mu.
	ver      fileVersion
	verOK    bool
	complete bool
}

// fileVersion identifies one state of a file's bytes: another client's
// write changes its mtime and ctime, a replacing rename its inode.
type fileVersion struct {
	ino          uint64
	size         int64
	mtime, ctime time.Time
}

// versionOf is st's version; false when the backend does not say enough
// (no inode number or modification time) to tell two versions apart.
func versionOf(st fs.FileInfo) (fileVersion, bool) {
	if st.Ino == 0 || st.ModTime.IsZero() {
		return fileVersion{}, false
	}
	return fileVersion{ino: st.Ino, size: st.Size, mtime: st.ModTime, ctime: st.CTime}, true
}

// same: v and w are one version. A change time counts when both know it
// (a directory listing, which answers most lookups with a metadata
// cache, carries none): a rewrite in place that keeps the length and
// sets the old mtime back is then told by the change time only when both
// descriptions came from a stat. (The kernel itself drops a file's pages
// when a lookup reports another mtime or length.)
func (v fileVersion) same(w fileVersion) bool {
	return v.ino == w.ino && v.size == w.size && v.mtime.Equal(w.mtime) &&
		(v.ctime.IsZero() || w.ctime.IsZero() || v.ctime.Equal(w.ctime))
}

// stopStores ends the node's stores in flight (waiting for a piece being
// written to land) and forgets which version the kernel's pages hold:
// called before this mount changes the file.
func (n *node) stopStores(ctx context.Context) {
	kc := &n.kc
	kc.mu.Lock()
	kc.gen++
	if kc.stopped != nil {
		close(kc.stopped)
		kc.stopped = nil
	}
	kc.verOK, kc.complete = false, false
	idle := kc.idle
	kc.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
		}
	}
}

// kernelHolds: the kernel's cache holds every page of version v of the
// file (stored by an earlier open, nothing changed since through this
// mount, and its first page not evicted).
func (n *node) kernelHolds(v fileVersion) bool {
	kc := &n.kc
	kc.mu.Lock()
	holds := kc.verOK && kc.complete && kc.ver.same(v)
	kc.mu.Unlock()
	if !holds {
		return false
	}
	if v.size == 0 {
		return true
	}
	// The pages may have been evicted since (memory pressure, a drop of
	// the caches): then the file is fetched again. A page evicted later
	// than the first is read through the handle.
	var probe [1]byte
	got, errno := n.ReadCache(0, probe[:])
	return errno == 0 && got == 1
}

// startStore writes the whole-file fetch of h into the kernel's cache in
// the background, each piece as it arrives, and returns the open flags:
// FOPEN_KEEP_CACHE when the stores may run (the kernel's pages then come
// from this fetch or this handle's reads only), else none (the kernel
// drops its pages at open). v is the version the open sees (vOK false:
// unknown).
func (h *readHandle) startStore(ctx context.Context, v fileVersion, vOK bool) uint32 {
	n, s := h.n, h.n.srv
	if s.opts.NoStoreCache {
		return 0
	}
	blocks, ok := h.ra.holdWhole()
	if !ok {
		return 0
	}
	kc := &n.kc
	kc.mu.Lock()
	same := vOK && kc.verOK && kc.ver.same(v)
	kc.mu.Unlock()
	if !same {
		// Pages of another version, or of unknown ones: stop the stores
		// that write them and drop them before the open returns.
		n.stopStores(ctx)
		if errno := n.NotifyContent(0, -1); errno != 0 {
			h.ra.release(blocks, false)
			return 0
		}
	}
	kc.mu.Lock()
	if !same {
		kc.ver, kc.verOK, kc.complete = v, vOK, false
	}
	gen := kc.gen
	if kc.stopped == nil {
		kc.stopped = make(chan struct{})
	}
	stopped := kc.stopped
	if kc.live == 0 {
		kc.idle = make(chan struct{})
	}
	kc.live++
	kc.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		complete := h.store(blocks, gen, stopped)
		kc.mu.Lock()
		if complete && kc.gen == gen && kc.verOK && kc.ver.same(v) {
			kc.complete = true
		}
		if kc.live--; kc.live == 0 {
			close(kc.idle)
			kc.idle = nil
		}
		kc.mu.Unlock()
		if complete {
			s.stats.storedFiles.Add(1)
			// Reads come from the kernel's cache now; one it evicted
			// meanwhile is read from the storage. The fetch's memory
			// goes back at once.
			h.ra.close()
		}
	}()
	return gofuse.FOPEN_KEEP_CACHE
}

// store writes blocks (held) into the kernel's cache in order as their
// fetches end, and releases them; true if every one was written (or
// read by the kernel already). It stops at a failed fetch or when stopped
// (gen moved on).
func (h *readHandle) store(blocks []*raBlock, gen uint64, stopped chan struct{}) bool {
	n, ra := h.n, h.ra
	defer ra.release(blocks, false)
	for _, b := range blocks {
		// Not ended by the handle's release: a file read and closed
		// before its store ran (the kernel's reads may outrun it) is still
		// stored, so the next open keeps it. A release cancels the fetches
		// in flight, which then end with an error.
		select {
		case <-b.done:
		case <-stopped:
			return false
		}
		if b.err != nil {
			return false
		}
		if ra.servedWhole(b) {
			// The kernel's own reads raced the store and took the
			// piece already (np.load's first read of 1 MiB makes the
			// kernel read ahead 4 MiB): storing it again would copy it
			// into the same pages twice.
			continue
		}
		n.kc.mu.Lock()
		cur := n.kc.gen == gen
		n.kc.mu.Unlock()
		// stopStores waits for this store to end, so a piece written
		// after the check still lands before the change it waits for.
		if !cur || n.WriteCache(b.off, b.buf) != 0 {
			return false
		}
	}
	return true
}
