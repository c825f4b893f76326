package fuse_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/fuse/fusetest"
)

// TestListingOrderPrefetchCluster: a directory read file after file in
// listing order has its next files fetched before they are opened, and
// the opens adopt those fetches; a reverse order prefetches nothing; a
// file rewritten through the mount after its prefetch is read as
// rewritten.
func TestListingOrderPrefetchCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := startCluster(t)
	if err := c.fs.MkdirAll(context.Background(), "/pf"); err != nil {
		t.Fatal(err)
	}
	const files = 24
	name := func(i int) string { return fmt.Sprintf("f%02d", i) }
	want := make([][]byte, files)
	w, _ := mount(t, c.fs, "/pf", fuse.Options{})
	for i := range files {
		want[i] = fusetest.Pattern(int64(70+i), 200<<10+i)
		if err := os.WriteFile(filepath.Join(w, name(i)), want[i], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(mnt string, i int) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(mnt, name(i)))
		if err != nil || !bytes.Equal(got, want[i]) {
			t.Fatalf("%s: %d bytes (%v), want %d; equal %v", name(i), len(got), err, len(want[i]), bytes.Equal(got, want[i]))
		}
	}
	// Fresh mounts: every name is looked up, and after a few misses the
	// directory's listing answers the lookups.
	rev, srv := mount(t, c.fs, "/pf", fuse.Options{AttrTimeout: time.Minute})
	for i := files - 1; i >= 0; i-- {
		check(rev, i)
	}
	if st := srv.Stats(); st.FilesPrefetched != 0 || st.WholeFiles != files {
		t.Errorf("reverse order: %d files prefetched, %d fetched whole: %+v", st.FilesPrefetched, st.WholeFiles, st)
	}
	fwd, srv := mount(t, c.fs, "/pf", fuse.Options{AttrTimeout: time.Minute})
	for i := range files {
		if i == 10 {
			// f12 was prefetched by now (or is about to be): rewrite it.
			want[12] = fusetest.Pattern(99, len(want[12]))
			if err := os.WriteFile(filepath.Join(fwd, name(12)), want[12], 0o644); err != nil {
				t.Fatal(err)
			}
		}
		check(fwd, i)
	}
	st := srv.Stats()
	if st.FilesPrefetched == 0 || st.PrefetchesUsed == 0 || st.PrefetchesUsed > st.FilesPrefetched {
		t.Errorf("listing order: %d files prefetched, %d of them used: %+v", st.FilesPrefetched, st.PrefetchesUsed, st)
	}
	if st.ReadAheadHits != st.Reads {
		t.Errorf("%d of %d reads served from fetched files: %+v", st.ReadAheadHits, st.Reads, st)
	}
	t.Run("KeptCache", func(t *testing.T) { keptCacheCluster(t, c) })
}

// keptCacheCluster: a file stored in the kernel's cache by one open is
// kept by the next open of the unchanged file (no fetch), and every
// change, by another client or through the mount, is seen by the next
// open (close-to-open), including a rewrite of the same length.
func keptCacheCluster(t *testing.T, c *testCluster) {
	ctx := context.Background()
	if err := c.fs.MkdirAll(ctx, "/kc"); err != nil {
		t.Fatal(err)
	}
	const size = 3<<20 + 5000 // pieces of 1 MiB, a partial last page
	put := func(seed int64) []byte {
		t.Helper()
		d := fusetest.Pattern(seed, size)
		w, err := c.fs.Create(ctx, "/kc/f")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(d); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		return d
	}
	want := put(1)
	mnt, srv := mount(t, c.fs, "/kc", fuse.Options{})
	p := filepath.Join(mnt, "f")
	check := func(what string) {
		t.Helper()
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		st, _ := f.Stat()
		if got := npLoad(t, f, int(st.Size())); !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes, want %d; equal %v", what, len(got), len(want), bytes.Equal(got, want))
		}
	}
	stored := func(n int64) {
		t.Helper()
		eventually(t, "the store of the fetch", func() error {
			if st := srv.Stats(); st.StoredFiles < n {
				return fmt.Errorf("%d files stored: %+v", st.StoredFiles, st)
			}
			return nil
		})
	}
	check("first read")
	stored(1)
	// The next opens keep the cache: no fetch. (Pages evicted meanwhile
	// make an open fetch again; then a later one keeps it.)
	eventually(t, "an open that keeps the cache", func() error {
		check("reread")
		if st := srv.Stats(); st.KeptFiles == 0 {
			return fmt.Errorf("no open kept the cache: %+v", st)
		}
		return nil
	})
	// Another client rewrites the file, same length: the next open sees it.
	want = put(2)
	check("after a rewrite of the same length by another client")
	stored(2)
	eventually(t, "an open that keeps the cache", func() error {
		kept := srv.Stats().KeptFiles
		check("reread")
		if st := srv.Stats(); st.KeptFiles == kept {
			return fmt.Errorf("no open kept the cache: %+v", st)
		}
		return nil
	})
	// A write through the mount, in place, then a truncate.
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	patch := fusetest.Pattern(3, 70000)
	if _, err := f.WriteAt(patch, 1<<20-1000); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	copy(want[1<<20-1000:], patch)
	check("after a write through the mount")
	if err := os.Truncate(p, 2<<20+100); err != nil {
		t.Fatal(err)
	}
	want = want[:2<<20+100]
	check("after a truncate through the mount")
	// Another client rewrites it again and sets the old times back: the
	// change time still tells.
	st, err := c.fs.Stat(ctx, "/kc/f")
	if err != nil {
		t.Fatal(err)
	}
	check("reread")
	want = fusetest.Pattern(4, len(want))
	w, err := c.fs.Create(ctx, "/kc/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	mt := st.ModTime
	if _, err := c.fs.SetAttr(ctx, "/kc/f", fs.AttrChange{MTime: &mt}); err != nil {
		t.Fatal(err)
	}
	check("after a rewrite with the old mtime by another client")

	// With cached names the kernel sends no LOOKUP before most opens:
	// the open tells the version from the file it opened.
	mnt2, srv2 := mount(t, c.fs, "/kc", fuse.Options{AttrTimeout: time.Hour})
	p = filepath.Join(mnt2, "f")
	check("first read, names cached")
	eventually(t, "an open without a LOOKUP that keeps the cache", func() error {
		check("reread, names cached")
		if st := srv2.Stats(); st.KeptFiles == 0 {
			return fmt.Errorf("no open kept the cache: %+v", st)
		}
		return nil
	})
}
