package fuse

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ffkit/ffkit/fs"
)

// The metadata cache: what the mount learned from the storage about names
// (an entry's description, or that a name does not exist) and whole
// directory listings, each kept for Options.AttrTimeout (the same bound
// the kernel is given for its own entry, attribute and negative caches).
// A change made by another client is therefore seen by this mount at most
// AttrTimeout after it was made (plus the time of the call that saw the
// old state); with AttrTimeout 0 nothing is cached.
//
// Changes made through this mount are seen by it at once: every operation
// that changes a name or a description (create, mkdir, unlink, rmdir,
// rename, setattr, the close of a written file) updates or drops the
// cached state of the paths it touched before it returns, and bumps a
// generation so that a storage answer read before the change (by a
// concurrent lookup or listing) is not cached after it.
//
// Lookups answered from a directory's listing make a run of stats or
// creates in one directory cost one listing per AttrTimeout instead of one
// storage round trip each: after prefetchMisses lookups in a directory
// missed the cache within AttrTimeout, the next miss lists the directory
// (directories found to hold more than prefetchMax entries are not listed
// again for that purpose until the listing expires).
//
// Keys are backend paths. Safe for concurrent use.
type metaCache struct {
	ttl time.Duration // 0: disabled

	// gen counts local changes; a storage answer is cached only if no
	// change happened since it was asked for.
	gen atomic.Uint64

	mu      sync.Mutex
	entries map[string]cachedEntry // guarded by mu; by path
	dirs    map[string]*cachedDir  // guarded by mu; by directory path
	// treeAt is the generation of the last removal of a directory here
	// (which may move or drop whole subtrees) and sweptAt that of the
	// last sweep (which forgets cachedDir.changed): a listing asked for
	// before either is not cached. Guarded by mu.
	treeAt, sweptAt uint64

	hits, misses, prefetches atomic.Int64
}

const (
	prefetchMisses = 8
	prefetchMax    = 100_000
	// maxCached bounds the number of entries kept; past it expired ones
	// are swept, and if that is not enough everything is dropped.
	maxCached = 1 << 20
)

type cachedEntry struct {
	st     fs.FileInfo
	exists bool // false: a negative entry
	until  time.Time
}

type cachedDir struct {
	// names is the directory's complete listing while listedUntil is in
	// the future; a nil *fs.FileInfo is a name whose state is unknown
	// (changed here since the listing: lookups ask the storage).
	names       map[string]*fs.FileInfo
	listedUntil time.Time
	// order is the listing as read (by name; prefetch.go).
	order []fs.FileInfo
	// misses counts lookups in the directory the cache could not answer
	// since missSince.
	misses    int
	missSince time.Time
	// big: a listing found more than prefetchMax entries; not listed for
	// lookups until bigUntil.
	bigUntil time.Time
	// changed is the generation of the last change here to the
	// directory's names: a listing asked for before it is not cached (a
	// change elsewhere does not spoil it, so that concurrent creates in
	// many directories do not discard each other's listings). described
	// holds the generation of the last change here to a name's
	// description: a listing asked for before it is cached with that name
	// unknown (the close of a file created here, concurrent with the next
	// lookup's listing, no longer spoils the listing).
	changed   uint64
	described map[string]uint64
}

// maxDescribed bounds cachedDir.described; past it the directory's older
// changes count as changes of its names.
const maxDescribed = 4096

func newMetaCache(ttl time.Duration) *metaCache {
	return &metaCache{ttl: max(ttl, 0), entries: map[string]cachedEntry{}, dirs: map[string]*cachedDir{}}
}

func (c *metaCache) enabled() bool { return c.ttl > 0 }

// generation is read before asking the storage; pass it to the put calls.
func (c *metaCache) generation() uint64 { return c.gen.Load() }

// lookup answers from the cache: ok reports whether it could, exists
// whether the name exists (st then describes it).
func (c *metaCache) lookup(p string) (st fs.FileInfo, exists, ok bool) {
	if !c.enabled() {
		return fs.FileInfo{}, false, false
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, found := c.entries[p]; found && now.Before(e.until) {
		c.hits.Add(1)
		return e.st, e.exists, true
	}
	dir, name := path.Split(p)
	dir = cleanDir(dir)
	if d := c.dirs[dir]; d != nil && now.Before(d.listedUntil) {
		fi, found := d.names[name]
		switch {
		case !found:
			c.hits.Add(1)
			return fs.FileInfo{}, false, true
		case fi != nil:
			c.hits.Add(1)
			return *fi, true, true
		}
	}
	c.misses.Add(1)
	return fs.FileInfo{}, false, false
}

// wantListing counts a lookup miss in dir and reports whether the caller
// should list dir (and putListing) instead of asking for the one name.
func (c *metaCache) wantListing(dir string) bool {
	if !c.enabled() {
		return false
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.dirLocked(cleanDir(dir))
	if now.Before(d.bigUntil) {
		return false
	}
	if !d.listedUntil.IsZero() && !now.Before(d.listedUntil) && now.Sub(d.listedUntil) < c.ttl {
		// Its listing expired a moment ago: the run of lookups that made
		// it goes on, so list again at once (waiting for prefetchMisses
		// more misses sent them to the storage one by one, and with them
		// the creates, which are pipelined only for names known missing).
		return true
	}
	if now.Sub(d.missSince) > c.ttl {
		d.misses, d.missSince = 0, now
	}
	d.misses++
	return d.misses > prefetchMisses
}

func (c *metaCache) dirLocked(dir string) *cachedDir {
	d := c.dirs[dir]
	if d == nil {
		d = &cachedDir{}
		c.dirs[dir] = d
	}
	return d
}

// put caches what the storage said about p, asked at generation gen: its
// description, or err (only "does not exist" is cached).
func (c *metaCache) put(p string, st fs.FileInfo, err error, gen uint64) {
	if !c.enabled() || (err != nil && !errors.Is(err, iofs.ErrNotExist)) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen.Load() != gen {
		return
	}
	if err == nil && hardLinked(st) {
		delete(c.entries, p)
		return
	}
	c.sweepLocked()
	c.entries[p] = cachedEntry{st: st, exists: err == nil, until: time.Now().Add(c.ttl)}
}

// hardLinked reports whether st is a file with more than one name. Its
// description is not cached: a link or unlink of another name changes its
// link count (and ctime), and the cache, keyed by path, cannot know the
// other names (so pjdfstest's link/00.t saw a stale st_nlink for up to
// the cache timeout). Such files are rare; each stat of one asks the
// storage.
func hardLinked(st fs.FileInfo) bool { return !st.IsDir && st.Nlink > 1 }

// putListing caches dir's complete listing, read at generation gen.
func (c *metaCache) putListing(dir string, ents []fs.FileInfo, gen uint64) {
	if !c.enabled() {
		return
	}
	c.prefetches.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.dirLocked(cleanDir(dir))
	if d.changed > gen || c.treeAt > gen || c.sweptAt > gen {
		return
	}
	defer func() {
		for name, g := range d.described {
			if _, ok := d.names[name]; ok && g > gen {
				d.names[name] = nil // changed since it was listed: unknown
			}
		}
	}()
	now := time.Now()
	if len(ents) > prefetchMax {
		d.bigUntil = now.Add(c.ttl)
		return
	}
	c.sweepLocked()
	d.names = make(map[string]*fs.FileInfo, len(ents))
	for i := range ents {
		if hardLinked(ents[i]) {
			d.names[ents[i].Name] = nil // unknown: asked of the storage
			continue
		}
		d.names[ents[i].Name] = &ents[i]
	}
	d.listedUntil = now.Add(c.ttl)
	d.order = ents
	d.misses = 0
}

// sweepLocked keeps the cache bounded.
func (c *metaCache) sweepLocked() {
	if len(c.entries)+len(c.dirs) < maxCached {
		return
	}
	c.sweptAt = c.gen.Load()
	now := time.Now()
	for k, e := range c.entries {
		if !now.Before(e.until) {
			delete(c.entries, k)
		}
	}
	for k, d := range c.dirs {
		if !now.Before(d.listedUntil) && !now.Before(d.bigUntil) && now.Sub(d.missSince) > c.ttl {
			delete(c.dirs, k)
		}
	}
	if len(c.entries)+len(c.dirs) >= maxCached {
		clear(c.entries)
		clear(c.dirs)
	}
}

// created records that this mount made p (a file or directory described
// by st, or unknown: nil).
func (c *metaCache) created(p string, st *fs.FileInfo) {
	if !c.enabled() {
		return
	}
	g := c.gen.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dirChangedLocked(p, g, true)
	delete(c.entries, p)
	if st != nil && hardLinked(*st) {
		st = nil // not cached (hardLinked)
	}
	if st != nil {
		c.entries[p] = cachedEntry{st: *st, exists: true, until: time.Now().Add(c.ttl)}
	}
	dir, name := path.Split(p)
	c.parentChangedLocked(cleanDir(dir))
	if d := c.dirs[cleanDir(dir)]; d != nil && d.names != nil {
		var fi *fs.FileInfo
		if st != nil {
			cp := *st
			fi = &cp
		}
		d.names[name] = fi
	}
}

// changed records that this mount changed p's description (not its name).
func (c *metaCache) changed(p string) {
	if !c.enabled() {
		return
	}
	g := c.gen.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dirChangedLocked(p, g, false)
	delete(c.entries, p)
	dir, name := path.Split(p)
	if d := c.dirs[cleanDir(dir)]; d != nil && d.names != nil {
		d.names[name] = nil // unknown: asked of the storage
	}
}

// removed records that this mount removed p (or renamed it away): p no
// longer exists, nor (dir) does anything under it.
func (c *metaCache) removed(p string, dir bool) {
	if !c.enabled() {
		return
	}
	g := c.gen.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dirChangedLocked(p, g, true)
	if dir {
		c.treeAt = g
	}
	c.entries[p] = cachedEntry{exists: false, until: time.Now().Add(c.ttl)}
	parent, name := path.Split(p)
	c.parentChangedLocked(cleanDir(parent))
	if d := c.dirs[cleanDir(parent)]; d != nil && d.names != nil {
		delete(d.names, name)
	}
	if !dir {
		return
	}
	// Whatever was cached under p (a directory renamed away) is gone too.
	prefix := p + "/"
	for k := range c.entries {
		if strings.HasPrefix(k, prefix) {
			delete(c.entries, k)
		}
	}
	for k := range c.dirs {
		if k == p || strings.HasPrefix(k, prefix) {
			delete(c.dirs, k)
		}
	}
}

// dirChangedLocked marks, at generation g, what a change of p does to the
// listings read before it: a change of p's name (named) spoils its
// directory's; a change of its description makes p unknown in it; either
// changes the directory's own description (times, link count) in its
// parent.
func (c *metaCache) dirChangedLocked(p string, g uint64, named bool) {
	dir, name := path.Split(p)
	dir = cleanDir(dir)
	if named {
		c.dirLocked(dir).changed = g
	} else {
		c.describedLocked(dir, name, g)
	}
	if dir != "/" && dir != "" {
		gp, dname := path.Split(dir)
		c.describedLocked(cleanDir(gp), dname, g)
	}
}

func (c *metaCache) describedLocked(dir, name string, g uint64) {
	d := c.dirLocked(dir)
	if len(d.described) >= maxDescribed {
		clear(d.described)
		d.changed = g
		return
	}
	if d.described == nil {
		d.described = map[string]uint64{}
	}
	d.described[name] = g
}

// parentChangedLocked drops the description of directory dir, whose
// entries changed here (its times and, for subdirectories, its link
// count moved with them).
func (c *metaCache) parentChangedLocked(dir string) {
	delete(c.entries, dir)
	if dir == "/" || dir == "" {
		return
	}
	gp, name := path.Split(dir)
	if d := c.dirs[cleanDir(gp)]; d != nil && d.names != nil {
		if _, ok := d.names[name]; ok {
			d.names[name] = nil // unknown: asked of the storage
		}
	}
}

// cleanDir turns path.Split's directory ("/a/b/") into a directory path.
func cleanDir(dir string) string {
	if len(dir) > 1 {
		return strings.TrimSuffix(dir, "/")
	}
	return dir
}

// MetaCacheStats counts the metadata cache's work (see Server.Stats).
type MetaCacheStats struct {
	Hits     int64 `json:"hits"`     // lookups answered from the cache
	Misses   int64 `json:"misses"`   // lookups that went to the storage
	Listings int64 `json:"listings"` // directory listings cached
}

func (c *metaCache) stats() MetaCacheStats {
	return MetaCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Listings: c.prefetches.Load()}
}

// statCached describes p from the metadata cache or, on a miss, from the
// storage (a run of misses in one directory lists it, see metaCache),
// caching the answer. A missing name is an error wrapping fs.ErrNotExist.
func (s *Server) statCached(ctx context.Context, p string) (fs.FileInfo, error) {
	st, exists, ok := s.mc.lookup(p)
	if ok {
		if !exists {
			return fs.FileInfo{}, fmt.Errorf("stat %s (cached): %w", p, iofs.ErrNotExist)
		}
		return st, nil
	}
	dir, name := path.Split(p)
	if s.mc.wantListing(dir) {
		s.pend.waitUnder(ctx, cleanDir(dir))
		gen := s.mc.generation()
		ents, err := s.backend.List(ctx, cleanDir(dir))
		if err == nil {
			s.mc.putListing(dir, ents, gen)
			if len(ents) <= prefetchMax {
				i, found := slices.BinarySearchFunc(ents, name, func(e fs.FileInfo, n string) int { return strings.Compare(e.Name, n) })
				if !found {
					return fs.FileInfo{}, fmt.Errorf("stat %s (listed): %w", p, iofs.ErrNotExist)
				}
				return ents[i], nil
			}
		}
	}
	s.pend.wait(ctx, p)
	gen := s.mc.generation()
	st, err := s.backend.Stat(ctx, p)
	s.mc.put(p, st, err, gen)
	return st, err
}

// listing is dir's cached listing, sorted by name, if the cache holds a
// complete one with every entry described.
func (c *metaCache) listing(dir string) ([]fs.FileInfo, bool) {
	if !c.enabled() {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.dirs[cleanDir(dir)]
	if d == nil || !time.Now().Before(d.listedUntil) {
		return nil, false
	}
	out := make([]fs.FileInfo, 0, len(d.names))
	for _, fi := range d.names {
		if fi == nil {
			return nil, false
		}
		out = append(out, *fi)
	}
	slices.SortFunc(out, func(a, b fs.FileInfo) int { return strings.Compare(a.Name, b.Name) })
	c.hits.Add(1)
	return out, true
}

// listCached lists dir from the cache or the storage, caching the answer.
func (s *Server) listCached(ctx context.Context, dir string) ([]fs.FileInfo, error) {
	if ents, ok := s.mc.listing(dir); ok {
		return ents, nil
	}
	s.pend.waitUnder(ctx, dir)
	gen := s.mc.generation()
	ents, err := s.backend.List(ctx, dir)
	if err == nil {
		s.mc.putListing(dir, ents, gen)
	}
	return ents, err
}

// renamed records that this mount renamed oldp to newp (ok), or tried to
// and failed (then both are described anew).
func (c *metaCache) renamed(oldp, newp string, dir, ok bool) {
	if !ok {
		c.changed(oldp)
		c.changed(newp)
		return
	}
	c.removed(oldp, dir)
	c.removed(newp, true) // what was there (a directory, maybe) is gone
	c.created(newp, nil)
}

// statStorage describes p, the node's path, from the cache unless the
// node is busy (being written or closed here: its own state wins), else
// from the storage.
func (n *node) statStorage(ctx context.Context, p string) (fs.FileInfo, error) {
	if n.busyFor(n.srv.mc) {
		return n.srv.backend.Stat(ctx, p)
	}
	return n.srv.statCached(ctx, p)
}

// busyFor is busy, narrowed when c caches: a node this mount wrote and
// closed (whose times it keeps, see node.report) may then be described
// from the cache or a listing, as its close updated both; only a node
// being written or closed may not.
func (n *node) busyFor(c *metaCache) bool {
	if !c.enabled() {
		return n.busy()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.wf != nil || n.seq != nil || n.closing != nil
}

// invalidate drops what the cache holds about the node (its description
// changed here).
func (n *node) invalidate() {
	if p, errno := n.path(); errno == 0 {
		n.srv.mc.changed(p)
	}
}
