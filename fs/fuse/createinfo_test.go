package fuse_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/localfs"
)

// infoFS is localfs with creates that return the file they made
// (fs.EmptyCreatorInfo, as the cluster's) and a count of the Stats of
// names under dir.
type infoFS struct {
	*localfs.FS
	dir   string
	stats atomic.Int64
}

func (f *infoFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	if strings.HasPrefix(name, f.dir+"/") {
		f.stats.Add(1)
	}
	return f.FS.Stat(ctx, name)
}

func (f *infoFS) CreateEmpty(ctx context.Context, name string, exclusive bool) error {
	_, err := f.CreateEmptyInfo(ctx, name, exclusive)
	return err
}

func (f *infoFS) CreateEmptyInfo(ctx context.Context, name string, exclusive bool) (fs.FileInfo, error) {
	flag := os.O_CREATE | os.O_WRONLY
	if exclusive {
		flag |= os.O_EXCL
	}
	h, err := os.OpenFile(name, flag, 0o644)
	if err != nil {
		return fs.FileInfo{}, err
	}
	if err := h.Close(); err != nil {
		return fs.FileInfo{}, err
	}
	return f.FS.Stat(ctx, name)
}

// A file created in the background and closed unwritten keeps the times
// its create returned: its release asks the storage nothing (before, a
// Stat per file), and it reports the same time before and after.
func TestCreateNeedsNoStat(t *testing.T) {
	src := t.TempDir()
	b := &infoFS{FS: localfs.New(), dir: filepath.Join(src, "d")}
	mnt, srv := mount(t, b, src, fuse.Options{AttrTimeout: time.Hour})
	dir := filepath.Join(mnt, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadDir(dir); err != nil { // every new name is known missing
		t.Fatal(err)
	}
	const n = 40
	before := srv.Stats().CreatesAsync
	for i := range n {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%02d", i)), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Close()
	async := srv.Stats().CreatesAsync - before
	if async < n/2 {
		t.Fatalf("%d of %d creates answered early: the test tests little", async, n)
	}
	if got := b.stats.Load(); got >= async {
		t.Errorf("%d creates answered early cost %d Stats of the storage, want fewer (none but the kernel's)", async, got)
	}
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("f%02d", i))
		st1, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st2, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st1.Size() != 0 || st1.ModTime().IsZero() || !st2.ModTime().Equal(st1.ModTime()) {
			t.Errorf("%s: size %d, times %v then %v", p, st1.Size(), st1.ModTime(), st2.ModTime())
		}
	}
}
