package fuse_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/posixtest"

	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/localfs"
)

// eventually polls cond until it holds; the bound is generous (the
// machine may be loaded): the test checks that a change is seen, the
// documented bound is a property of the timeouts.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not seen after 2 min: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat %s = %v, want it gone", p, err)
	}
}

// TestMetaCache: with AttrTimeout the mount caches names, attributes,
// missing names and listings; its own changes are seen at once, another
// client's within the timeout, and a consistent mount (AttrTimeout 0)
// sees them at once.
func TestMetaCache(t *testing.T) {
	src := t.TempDir()
	a, srvA := mount(t, localfs.New(), src, fuse.Options{AttrTimeout: time.Second})
	b, _ := mount(t, localfs.New(), src, fuse.Options{AttrTimeout: time.Second})
	c, _ := mount(t, localfs.New(), src, fuse.Options{})

	// This mount's own changes, at once, in a directory it has listed
	// and looked names up in (so that listings and negative entries are
	// cached when the changes come).
	d := filepath.Join(a, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		mustNotExist(t, filepath.Join(d, fmt.Sprintf("f%02d", i)))
	}
	if got := names(t, d); len(got) != 0 {
		t.Fatalf("new directory lists %v", got)
	}
	for i := range 20 {
		p := filepath.Join(d, fmt.Sprintf("f%02d", i))
		if err := os.WriteFile(p, make([]byte, i), 0o644); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p)
		if err != nil || st.Size() != int64(i) {
			t.Fatalf("stat right after create: %v %v, want %d bytes", st, err, i)
		}
	}
	if got := names(t, d); len(got) != 20 {
		t.Fatalf("listing after 20 creates: %v", got)
	}
	// Pipelined unlinks: gone here at once, a name can be created again
	// at once, and after fsync of the directory every client sees them gone.
	for i := 10; i < 20; i++ {
		if err := os.Remove(filepath.Join(d, fmt.Sprintf("f%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 10; i < 20; i++ {
		mustNotExist(t, filepath.Join(d, fmt.Sprintf("f%02d", i)))
	}
	if err := os.WriteFile(filepath.Join(d, "f19"), []byte("again"), 0o644); err != nil {
		t.Fatalf("create right after unlink: %v", err)
	}
	if got := names(t, d); len(got) != 11 || !slices.Contains(got, "f19") || slices.Contains(got, "f18") {
		t.Fatalf("listing after unlinks and a re-create: %v", got)
	}
	dh, err := os.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := dh.Sync(); err != nil {
		t.Fatalf("fsync of the directory: %v", err)
	}
	dh.Close()
	cd := filepath.Join(c, "d")
	if got := names(t, cd); len(got) != 11 || slices.Contains(got, "f18") {
		t.Fatalf("a consistent mount lists %v after the unlinks were synced", got)
	}
	if b, err := os.ReadFile(filepath.Join(cd, "f19")); err != nil || string(b) != "again" {
		t.Fatalf("the re-created file, from another mount: %q %v", b, err)
	}
	for i := 10; i < 19; i++ {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%02d", i)), make([]byte, i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p0, p1 := filepath.Join(d, "f00"), filepath.Join(d, "moved")
	if err := os.Rename(p0, p1); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, p0)
	if _, err := os.Stat(p1); err != nil {
		t.Fatalf("renamed file: %v", err)
	}
	if err := os.Remove(p1); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, p1)
	if err := os.WriteFile(filepath.Join(d, "f01"), make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(d, "f01")); err != nil || st.Size() != 1000 {
		t.Fatalf("stat after a rewrite: %v %v", st, err)
	}
	if err := os.Chmod(filepath.Join(d, "f02"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := names(t, d); len(got) != 19 || slices.Contains(got, "f00") || slices.Contains(got, "moved") {
		t.Fatalf("listing after rename and remove: %v", got)
	}
	if err := os.Rename(d, filepath.Join(a, "d2")); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, filepath.Join(d, "f01"))
	if st, err := os.Stat(filepath.Join(a, "d2", "f01")); err != nil || st.Size() != 1000 {
		t.Fatalf("stat under a renamed directory: %v %v", st, err)
	}
	if hits := srvA.Stats().MetaCache.Hits; hits == 0 {
		t.Errorf("the metadata cache answered nothing: %+v", srvA.Stats().MetaCache)
	}

	// Another client's changes: seen within the timeout by a caching
	// mount, at once by a consistent one.
	nb := filepath.Join(b, "d2", "new")
	na, nc := filepath.Join(a, "d2", "new"), filepath.Join(c, "d2", "new")
	mustNotExist(t, na) // cached missing on a
	if err := os.WriteFile(nb, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(nc); err != nil || st.Size() != 5 {
		t.Fatalf("consistent mount, right after another client's create: %v %v", st, err)
	}
	eventually(t, "a create by another client", func() error {
		_, err := os.Stat(na)
		return err
	})
	eventually(t, "a new name in the listing", func() error {
		if !slices.Contains(names(t, filepath.Join(a, "d2")), "new") {
			return errors.New("not listed")
		}
		return nil
	})
	if err := os.WriteFile(nb, []byte("hello, world"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a new length", func() error {
		st, err := os.Stat(na)
		if err == nil && st.Size() != 12 {
			err = fmt.Errorf("size %d", st.Size())
		}
		return err
	})
	if err := os.Remove(nb); err != nil {
		t.Fatal(err)
	}
	// b's unlink is pipelined (the file is not open there): it has reached
	// the storage once fsync of its directory returns, and from then on a
	// consistent mount sees it gone at once.
	dh, err = os.Open(filepath.Dir(nb))
	if err != nil {
		t.Fatal(err)
	}
	if err := dh.Sync(); err != nil {
		t.Fatalf("fsync of %s: %v", filepath.Dir(nb), err)
	}
	dh.Close()
	mustNotExist(t, nc)
	eventually(t, "a remove by another client", func() error {
		if _, err := os.Stat(na); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stat: %v", err)
		}
		return nil
	})
}

// TestMetaCachePOSIX runs go-fuse's POSIX tests on a caching mount: a
// mount sees its own changes at once.
func TestMetaCachePOSIX(t *testing.T) {
	src := t.TempDir()
	mnt, _ := mount(t, localfs.New(), src, fuse.Options{AttrTimeout: time.Minute})
	for _, name := range []string{
		"TruncateFile", "TruncateNoFile", "MkdirRmdir",
		"RenameOverwriteDestNoExist", "RenameOverwriteDestExist", "RenameOpenDir",
		"ReadDirBasic", "DirSeek", "AppendWrite", "FstatDeleted",
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(mnt, "pt-"+name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			posixtest.All[name](t, dir)
		})
	}
}
