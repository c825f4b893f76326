package fuse

import (
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
)

// A listing read while this mount changed another directory is cached
// (threads creating in directories of their own no longer discard each
// other's listings); one read while this mount changed the same
// directory, or removed a directory anywhere, is not.
func TestListingSpoiledOnlyByItsDirectory(t *testing.T) {
	c := newMetaCache(time.Minute)
	st := fs.FileInfo{Name: "x"}

	g := c.generation()
	c.created("/b/x", &st)
	c.putListing("/a", []fs.FileInfo{{Name: "f"}}, g)
	if _, exists, ok := c.lookup("/a/new"); !ok || exists {
		t.Errorf("a listing of /a read while /b changed: lookup of a new name answered %v (exists %v), want a cached miss", ok, exists)
	}

	g = c.generation()
	c.created("/c/y", nil)
	c.putListing("/c", nil, g)
	if _, _, ok := c.lookup("/c/y"); ok {
		t.Error("a listing of /c read before a create in /c was cached")
	}
	g = c.generation()
	c.created("/d/e/z", nil) // changes /d/e's own description in /d
	c.putListing("/d", []fs.FileInfo{{Name: "e", IsDir: true}}, g)
	if _, _, ok := c.lookup("/d/e"); ok {
		t.Error("a listing of /d read before a create in /d/e was cached")
	}

	// A description changed while /h was listed (a file created here
	// closed): the listing is cached, with that name unknown.
	g = c.generation()
	c.changed("/h/f")
	c.putListing("/h", []fs.FileInfo{{Name: "f"}, {Name: "g"}}, g)
	if _, _, ok := c.lookup("/h/f"); ok {
		t.Error("a name whose description changed during the listing was answered from it")
	}
	if _, exists, ok := c.lookup("/h/g"); !ok || !exists {
		t.Error("a listing read while one of its names was described anew was not cached")
	}

	g = c.generation()
	c.removed("/q/sub", true)
	c.putListing("/r", nil, g)
	if _, _, ok := c.lookup("/r/n"); ok {
		t.Error("a listing read before a directory was removed was cached")
	}
}

// Once a directory's listing expires, the next lookup miss there lists it
// again at once (it no longer waits for prefetchMisses misses, each a
// storage round trip and, for a create, a create not pipelined).
func TestExpiredListingRelistsAtOnce(t *testing.T) {
	const ttl = time.Second
	c := newMetaCache(ttl)
	t0 := time.Now()
	c.putListing("/a", []fs.FileInfo{{Name: "f"}}, c.generation())
	for {
		if _, _, ok := c.lookup("/a/g"); !ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := c.wantListing("/a/")
	if time.Since(t0) >= 2*ttl {
		t.Skip("the machine was too slow to look in time")
	}
	if !want {
		t.Error("the first miss after the listing expired did not ask for a listing")
	}
	// A name changed here while the listing is fresh is asked of the
	// storage alone, as before.
	c.putListing("/b", []fs.FileInfo{{Name: "f"}}, c.generation())
	c.changed("/b/f")
	if c.wantListing("/b/") {
		t.Error("a miss in a fresh listing asked for a new listing")
	}
}

// A file with more than one name is not cached (by a stat, a listing or a
// create): a link or unlink of another name changes its link count.
func TestMetaCacheHardLinkNotCached(t *testing.T) {
	c := newMetaCache(time.Hour)
	st := fs.FileInfo{Name: "a", Nlink: 2}
	c.put("/d/a", st, nil, c.generation())
	c.putListing("/d", []fs.FileInfo{{Name: "a", Nlink: 2}, {Name: "b", Nlink: 1}}, c.generation())
	c.created("/d/c", &fs.FileInfo{Name: "c", Nlink: 3})
	for _, p := range []string{"/d/a", "/d/c"} {
		if _, _, ok := c.lookup(p); ok {
			t.Errorf("%s (st_nlink > 1) answered from the cache", p)
		}
	}
	if _, exists, ok := c.lookup("/d/b"); !ok || !exists {
		t.Errorf("/d/b (one name) not cached: ok %v exists %v", ok, exists)
	}
}
