package fuse_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/fuse/fusetest"
	"github.com/ffkit/ffkit/fs/localfs"
)

// The POSIX suite on a mount of a local directory as `ffkit fs mount DIR`
// serves it (localfs.POSIX: links, special files and attributes pass through).
func TestPOSIXLocalDirMount(t *testing.T) {
	src := t.TempDir()
	mnt, _ := mount(t, localfs.NewPOSIX(), src, fuse.Options{})
	fusetest.RunPOSIX(t, mnt, localfs.NewPOSIX(), src)
}

// TestUserChecksCluster does on a cluster mount what a new user tries
// first (issue 19): fallocate, flock and POSIX locks (the flock CLI and
// sqlite), python3 -m venv, git clone of a local repository, rsync -a
// twice (the second copies nothing), cp -a (modes and times kept), and
// uid 65534 kept out of a root file with mode 0600.
func TestUserChecksCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (an --allow-other mount, another uid)")
	}
	c := startCluster(t)
	if err := c.fs.MkdirAll(t.Context(), "/user"); err != nil {
		t.Fatal(err)
	}
	mnt, _ := mount(t, c.fs, "/user", fuse.Options{AllowOther: true, AttrTimeout: time.Second})
	if err := os.Chmod(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, dir, name string, args ...string) string {
		t.Helper()
		cmd := commandIn(dir, name, args...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir(), "LC_ALL=C")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	need := func(t *testing.T, tools ...string) {
		for _, tool := range tools {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("no %s on this machine", tool)
			}
		}
	}

	t.Run("fallocate", func(t *testing.T) {
		p := filepath.Join(mnt, "falloc")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString("0123456789"); err != nil {
			t.Fatal(err)
		}
		const size = 1<<20 + 5
		if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
			t.Fatalf("fallocate mode 0: %v", err)
		}
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 2*size); err != nil {
			t.Fatalf("fallocate KEEP_SIZE: %v", err)
		}
		err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4)
		if !errors.Is(err, unix.EOPNOTSUPP) {
			t.Fatalf("fallocate PUNCH_HOLE: %v, want EOPNOTSUPP", err)
		}
		f.Close()
		got, err := os.ReadFile(p)
		if err != nil || len(got) != size || string(got[:10]) != "0123456789" || !bytes.Equal(got[10:], make([]byte, size-10)) {
			t.Fatalf("after fallocate: %v, %d bytes, want %d: the 10 written, then zeros", err, len(got), size)
		}
	})

	t.Run("locks", func(t *testing.T) {
		p := filepath.Join(mnt, "lockfile")
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		a, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := unix.Flock(int(a.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			t.Fatalf("flock: %v", err)
		}
		if err := unix.Flock(int(b.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
			t.Fatalf("a second flock of a locked file: %v, want EWOULDBLOCK", err)
		}
		// The flock command, another process, sees the lock too.
		if err := exec.Command("flock", "-n", p, "true").Run(); err == nil {
			t.Fatal("flock -n of a locked file succeeded")
		}
		unix.Flock(int(a.Fd()), unix.LOCK_UN)
		run(t, mnt, "flock", "-n", p, "true")
		// POSIX byte-range locks (open file description locks: two in
		// one process conflict).
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 1}
		if err := unix.FcntlFlock(a.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatalf("F_OFD_SETLK: %v", err)
		}
		if err := unix.FcntlFlock(b.Fd(), unix.F_OFD_SETLK, &lk); !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("a second F_OFD_SETLK of a locked range: %v, want EAGAIN", err)
		}
		need(t, "sqlite3")
		out := run(t, mnt, "sqlite3", filepath.Join(mnt, "db.sqlite"),
			"create table t(x); begin; insert into t values(1); insert into t values(2); commit; select sum(x) from t;")
		if strings.TrimSpace(out) != "3" {
			t.Fatalf("sqlite3: %q", out)
		}
	})

	t.Run("venv", func(t *testing.T) {
		need(t, "python3")
		// --without-pip: pip's own install is the same file operations,
		// many more of them.
		run(t, mnt, "python3", "-m", "venv", "--without-pip", "venv")
		out := run(t, mnt, filepath.Join(mnt, "venv", "bin", "python"), "-c", "import sys; print(sys.prefix)")
		if strings.TrimSpace(out) != filepath.Join(mnt, "venv") {
			t.Fatalf("the venv's python says its prefix is %q", out)
		}
	})

	t.Run("git", func(t *testing.T) {
		need(t, "git")
		repo := t.TempDir()
		run(t, repo, "git", "init", "-q", "-b", "main")
		os.WriteFile(filepath.Join(repo, "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
		os.MkdirAll(filepath.Join(repo, "src", "pkg"), 0o755)
		os.WriteFile(filepath.Join(repo, "src", "pkg", "a.txt"), []byte("a\n"), 0o644)
		run(t, repo, "git", "add", ".")
		run(t, repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
		run(t, mnt, "git", "clone", "-q", repo, "clone")
		clone := filepath.Join(mnt, "clone")
		run(t, clone, "git", "fsck", "--strict")
		if out := run(t, clone, "git", "status", "--porcelain"); out != "" {
			t.Fatalf("git status of a fresh clone:\n%s", out)
		}
		if out := run(t, clone, "./run.sh"); out != "hi\n" {
			t.Fatalf("run.sh: %q", out)
		}
	})

	// A local tree with modes and times to copy in.
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "tree", "sub"), 0o750)
	os.WriteFile(filepath.Join(src, "tree", "x.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "tree", "sub", "data"), bytes.Repeat([]byte("d"), 100_000), 0o600)
	for i, p := range []string{"tree/x.sh", "tree/sub/data", "tree/sub", "tree"} {
		tm := time.Unix(1_500_000_000+int64(i)*1000, int64(i)*1000+7)
		os.Chtimes(filepath.Join(src, p), tm, tm)
	}
	sameTree := func(t *testing.T, dst string) {
		t.Helper()
		filepath.Walk(filepath.Join(src, "tree"), func(p string, want os.FileInfo, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(src, p)
			got, err := os.Lstat(filepath.Join(dst, rel))
			if err != nil {
				t.Fatal(err)
			}
			if got.Mode() != want.Mode() || !got.ModTime().Equal(want.ModTime()) || (!want.IsDir() && got.Size() != want.Size()) {
				t.Errorf("%s: %v %v %d, want %v %v %d", rel, got.Mode(), got.ModTime(), got.Size(), want.Mode(), want.ModTime(), want.Size())
			}
			return nil
		})
	}

	t.Run("rsync", func(t *testing.T) {
		need(t, "rsync")
		dst := filepath.Join(mnt, "rsync")
		run(t, mnt, "rsync", "-a", src+"/", dst+"/")
		sameTree(t, dst)
		if out := run(t, mnt, "rsync", "-a", "--itemize-changes", src+"/", dst+"/"); out != "" {
			t.Fatalf("a second rsync -a copied again:\n%s", out)
		}
	})

	t.Run("cp", func(t *testing.T) {
		dst := filepath.Join(mnt, "cp")
		run(t, mnt, "cp", "-a", src, dst)
		sameTree(t, dst)
	})

	t.Run("permissions", func(t *testing.T) {
		need(t, "setpriv")
		p := filepath.Join(mnt, "secret")
		if err := os.WriteFile(p, []byte("root only\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, sh := range []string{"echo x >> secret", "echo x > secret", "cat secret", "rm -f secret", "mv secret s2"} {
			cmd := commandIn(mnt, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", sh)
			if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "denied") {
				t.Errorf("uid 65534: %q: %v %s (want permission denied)", sh, err, out)
			}
		}
		if got, err := os.ReadFile(p); err != nil || string(got) != "root only\n" {
			t.Fatalf("the root file after uid 65534's tries: %q %v", got, err)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Mode&0o7777 != 0o600 || st.Uid != 0 {
			t.Fatalf("stat: %v %o %d", err, st.Mode, st.Uid)
		}
	})
}
