package fuse

import (
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ffkit/ffkit/fs"
)

// Listing-order prefetch. A program that reads the files of a directory
// one after the other in name order (cat *, tar, cp -r, a loader reading
// shards in listing order) waits, for each file, for its first bytes to
// come from the storage; the local disk hides none of that either, but
// a mount can: when two opens in a row in a directory were of neighbours
// in its cached listing (metaCache), the next prefetchAhead files small
// enough to be fetched whole (Options.ReadWhole) are fetched whole before
// they are opened, and the open of one adopts its fetch. Shuffled orders
// (a training loader's) never look sequential and prefetch nothing.
//
// A prefetched file is served only to an open of the same path whose
// LOOKUP described the same file (inode, length and mtime) within the
// metadata cache's bound; one not opened within that bound (at most
// prefetchKeepMax) is dropped.
// The fetches take the mount's read-ahead memory like any whole-file
// fetch (none if it is used up).
type prefetcher struct {
	mu    sync.Mutex
	last  map[string]string          // directory -> name of its last whole-file open; guarded by mu
	files map[string]*prefetchedFile // by backend path; guarded by mu
}

type prefetchedFile struct {
	f     fs.File
	ra    *readahead
	ino   uint64
	size  int64
	mtime time.Time
	at    time.Time
}

const (
	prefetchAhead   = 4
	prefetchKeepMax = 10 * time.Second
	// prefetchDirs bounds the directories whose last open is remembered.
	prefetchDirs = 64
)

// fetchesWhole: a file of size bytes opened for reading is fetched whole
// (Options.ReadWhole).
func (s *Server) fetchesWhole(size int64) bool {
	return s.opts.ReadAhead > 0 && size > 0 && size <= s.opts.ReadWhole
}

func newPrefetcher() *prefetcher {
	return &prefetcher{last: map[string]string{}, files: map[string]*prefetchedFile{}}
}

// opened records a whole-file open of backend path p and, if it followed
// the open of its predecessor in p's directory's cached listing, starts
// fetching the files after it.
func (s *Server) prefetchAfter(p string) {
	if !s.mc.enabled() || s.opts.ReadWhole <= 0 || s.opts.ReadAhead <= 0 {
		return
	}
	io, ok := s.backend.(fs.InfoOpener)
	if !ok {
		return
	}
	dir, name := path.Split(p)
	dir = cleanDir(dir)
	pf := s.pf
	pf.mu.Lock()
	defer pf.mu.Unlock()
	pf.sweepLocked(s.prefetchKeep())
	prev, seen := pf.last[dir]
	if !seen && len(pf.last) >= prefetchDirs {
		clear(pf.last)
	}
	pf.last[dir] = name
	if !seen || prev >= name {
		return
	}
	next, ok := s.mc.following(dir, prev, name, prefetchAhead)
	if !ok {
		return
	}
	for _, fi := range next {
		q := path.Join(dir, fi.Name)
		if _, have := pf.files[q]; have || fi.Sys == nil || fi.IsDir || fi.Kind != 0 || fi.Size <= 0 || fi.Size > s.opts.ReadWhole {
			continue
		}
		f, ok := io.OpenInfo(q, fi, fs.OpenOptions{Direct: true}) // as openLooked
		if !ok {
			continue
		}
		ra := newReadahead(s, f)
		if !ra.fetchWhole(true) {
			f.Close()
			return // no read-ahead memory left
		}
		s.stats.prefetched.Add(1)
		pf.files[q] = &prefetchedFile{f: f, ra: ra, ino: fi.Ino, size: fi.Size, mtime: fi.ModTime, at: time.Now()}
	}
}

// takePrefetched returns the fetch of backend path p started for the
// file st describes, if there is one (the caller owns it).
func (s *Server) takePrefetched(p string, st fs.FileInfo) (fs.File, *readahead, bool) {
	pf := s.pf
	pf.mu.Lock()
	e := pf.files[p]
	delete(pf.files, p)
	pf.mu.Unlock()
	if e == nil {
		return nil, nil, false
	}
	if e.ino != st.Ino || e.size != st.Size || !e.mtime.Equal(st.ModTime) || time.Since(e.at) > s.prefetchKeep() {
		e.drop()
		return nil, nil, false
	}
	s.stats.prefetchUsed.Add(1)
	return e.f, e.ra, true
}

func (e *prefetchedFile) drop() {
	e.ra.close()
	e.f.Close()
}

// prefetchKeep is how long a prefetched file waits for its open.
func (s *Server) prefetchKeep() time.Duration { return min(s.opts.AttrTimeout, prefetchKeepMax) }

// sweepLocked drops the fetches not opened within keep.
func (pf *prefetcher) sweepLocked(keep time.Duration) {
	for p, e := range pf.files {
		if time.Since(e.at) > keep {
			delete(pf.files, p)
			e.drop()
		}
	}
}

// close drops every fetch not taken (at unmount).
func (pf *prefetcher) close() {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	for p, e := range pf.files {
		delete(pf.files, p)
		e.drop()
	}
}

// following returns up to n entries after name in dir's current listing,
// if the listing is current and prev is the entry just before name (a
// reader going through the directory in listing order). Entries this
// mount changed since the listing are left out.
func (c *metaCache) following(dir, prev, name string, n int) ([]fs.FileInfo, bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.dirs[dir]
	if d == nil || !now.Before(d.listedUntil) || len(d.order) == 0 {
		return nil, false
	}
	cmp := func(e fs.FileInfo, n string) int { return strings.Compare(e.Name, n) }
	i, found := slices.BinarySearchFunc(d.order, name, cmp)
	if !found || i == 0 || d.order[i-1].Name != prev {
		return nil, false
	}
	var out []fs.FileInfo
	for _, e := range d.order[i+1 : min(i+1+n, len(d.order))] {
		if fi := d.names[e.Name]; fi != nil && fi.Ino == e.Ino && fi.Size == e.Size && fi.ModTime.Equal(e.ModTime) {
			out = append(out, *fi)
		}
	}
	return out, true
}
