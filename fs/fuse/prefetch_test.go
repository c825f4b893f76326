package fuse_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

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
}
