package fuse_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/fuse/fusetest"
	"github.com/ffkit/ffkit/fs/localfs"
)

// needFUSE skips a test on a machine where FUSE cannot be mounted.
func needFUSE(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse (%v): install fuse3 (scripts/setup.sh)", err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil && os.Geteuid() != 0 {
		t.Skip("no fusermount3: install fuse3 (scripts/setup.sh)")
	}
}

// mount serves backend's directory root at a new temporary mount point
// and unmounts it when the test ends.
func mount(t *testing.T, backend fs.FS, root string, opts fuse.Options) (string, *fuse.Server) {
	t.Helper()
	needFUSE(t)
	mnt := t.TempDir()
	srv, err := fuse.Mount(backend, root, mnt, opts)
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return mnt, srv
}

func TestPOSIXLocal(t *testing.T) {
	src := t.TempDir()
	mnt, srv := mount(t, localfs.New(), src, fuse.Options{})
	fusetest.RunPOSIX(t, mnt, localfs.New(), src)
	st := srv.Stats()
	if st.Reads == 0 || st.Writes == 0 || st.Batches+st.WholeFiles == 0 {
		t.Errorf("stats after the suite: %+v", st)
	}
}
