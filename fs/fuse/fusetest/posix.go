// Package fusetest is the POSIX behaviour suite of a mounted ffkit file
// system. RunPOSIX runs it against a real mount, over whatever storage
// backs it (local files, the cluster), and checks close-to-open
// consistency against the same storage reached without FUSE.
package fusetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

// RunPOSIX is the POSIX behaviour suite, run against a real mount at mnt.
// native is the file system behind the mount, reached without FUSE (the
// local files, or the cluster client), and nativeRoot the mounted
// directory in it: close-to-open consistency is checked against it.
func RunPOSIX(t *testing.T, mnt string, native fs.FS, nativeRoot string) {
	ctx := context.Background()
	p := func(name string) string { return filepath.Join(mnt, name) }
	np := func(name string) string { return path.Join(nativeRoot, name) }

	t.Run("CreateWriteReadBack", func(t *testing.T) {
		data := Pattern(1, 3<<20+123)
		if err := os.WriteFile(p("a.bin"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p("a.bin"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read back through the mount: %d bytes, err %v; want the %d written", len(got), err, len(data))
		}
		st, err := os.Stat(p("a.bin"))
		if err != nil || st.Size() != int64(len(data)) || !st.Mode().IsRegular() {
			t.Fatalf("stat = %v, %v", st, err)
		}
	})

	t.Run("CloseToOpen", func(t *testing.T) {
		// Written through the mount and closed: the native client sees it.
		data := Pattern(2, 1<<20+7)
		if err := os.WriteFile(p("c2o"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if got := readNative(t, native, np("c2o")); !bytes.Equal(got, data) {
			t.Fatalf("native read after close: %d bytes, differ from the %d written", len(got), len(data))
		}
		// Written natively: the next open through the mount sees it,
		// although the kernel has the old file cached.
		if _, err := os.ReadFile(p("c2o")); err != nil {
			t.Fatal(err)
		}
		data2 := Pattern(3, 2<<20+5)
		writeNative(t, native, np("c2o"), data2)
		got, err := os.ReadFile(p("c2o"))
		if err != nil || !bytes.Equal(got, data2) {
			t.Fatalf("mount read after a native rewrite: %d bytes, err %v; want %d new bytes", len(got), err, len(data2))
		}
	})

	t.Run("WriteAtOffsets", func(t *testing.T) {
		f, err := os.OpenFile(p("off"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		want := make([]byte, 1<<20)
		r := rand.New(rand.NewSource(4))
		for range 200 {
			off := r.Intn(len(want) - 5000)
			chunk := Pattern(int64(off), 1+r.Intn(5000))
			if _, err := f.WriteAt(chunk, int64(off)); err != nil {
				t.Fatal(err)
			}
			copy(want[off:], chunk)
		}
		if _, err := f.WriteAt([]byte{1}, int64(len(want)-1)); err != nil {
			t.Fatal(err)
		}
		want[len(want)-1] = 1
		got := make([]byte, len(want))
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read back random writes on the same handle: err %v, equal %v", err, bytes.Equal(got, want))
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync: %v", err)
		}
		f.Close()
		if got := readNative(t, native, np("off")); !bytes.Equal(got, want) {
			t.Fatal("native read after close differs")
		}
	})

	t.Run("RenameOverExisting", func(t *testing.T) {
		os.WriteFile(p("old"), []byte("old contents"), 0o644)
		os.WriteFile(p("new"), []byte("new contents, longer"), 0o644)
		// Keep the destination open: it must stay readable with its old
		// data. Open for writing: on the cluster only a write session holds
		// a replaced or unlinked file's chunks (docs/fuse.md: a file open
		// only for reading holds none, as in 3FS, and the collector may
		// remove its data under it, so a read-only handle here would read
		// zeros whenever a collection pass runs before the read).
		held, err := os.OpenFile(p("old"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		if err := os.Rename(p("new"), p("old")); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(p("old")); string(got) != "new contents, longer" {
			t.Fatalf("after rename: %q", got)
		}
		if _, err := os.Stat(p("new")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("source still there: %v", err)
		}
		buf := make([]byte, 64)
		n, _ := held.ReadAt(buf, 0)
		if string(buf[:n]) != "old contents" {
			t.Fatalf("the replaced file, held open, reads %q", buf[:n])
		}
		// Directories: rename into place, then over an empty directory.
		os.MkdirAll(p("rd/sub"), 0o755)
		os.WriteFile(p("rd/sub/f"), []byte("x"), 0o644)
		os.Mkdir(p("rd2"), 0o755)
		// syscall.Rename: os.Rename itself refuses to replace a directory.
		if err := syscall.Rename(p("rd"), p("rd2")); err != nil {
			t.Fatalf("rename a directory over an empty one: %v", err)
		}
		if got, _ := os.ReadFile(p("rd2/sub/f")); string(got) != "x" {
			t.Fatalf("file under the renamed directory: %q", got)
		}
		os.Mkdir(p("full"), 0o755)
		os.WriteFile(p("full/x"), nil, 0o644)
		os.Mkdir(p("src"), 0o755)
		if err := syscall.Rename(p("src"), p("full")); err != syscall.ENOTEMPTY {
			t.Fatalf("rename over a non-empty directory: %v, want ENOTEMPTY", err)
		}
	})

	t.Run("UnlinkWhileOpen", func(t *testing.T) {
		data := Pattern(5, 300<<10)
		os.WriteFile(p("doomed"), data, 0o644)
		r, err := os.Open(p("doomed"))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		w, err := os.OpenFile(p("doomed"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := os.Remove(p("doomed")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p("doomed")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stat after unlink: %v", err)
		}
		got := make([]byte, len(data))
		if _, err := r.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read of an unlinked open file: %v", err)
		}
		if _, err := w.WriteAt([]byte("still here"), 10); err != nil {
			t.Fatalf("write to an unlinked open file: %v", err)
		}
		buf := make([]byte, 10)
		if _, err := w.ReadAt(buf, 10); err != nil || string(buf) != "still here" {
			t.Fatalf("read back from the unlinked file: %q %v", buf, err)
		}
		if st, err := r.Stat(); err != nil || st.Size() != int64(len(data)) {
			t.Fatalf("fstat of the unlinked file: %v %v", st, err)
		}
		// The name is free for a new file.
		if err := os.WriteFile(p("doomed"), []byte("new"), 0o644); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Truncate", func(t *testing.T) {
		data := Pattern(6, 100000)
		os.WriteFile(p("tr"), data, 0o644)
		if err := os.Truncate(p("tr"), 1000); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(p("tr")); !bytes.Equal(got, data[:1000]) {
			t.Fatalf("after truncate to 1000: %d bytes", len(got))
		}
		if err := os.Truncate(p("tr"), 5000); err != nil {
			t.Fatal(err)
		}
		want := append(slices.Clone(data[:1000]), make([]byte, 4000)...)
		if got, _ := os.ReadFile(p("tr")); !bytes.Equal(got, want) {
			t.Fatalf("after extending to 5000: %d bytes, zeros? %v", len(got), bytes.Equal(got, want))
		}
		f, err := os.OpenFile(p("tr"), os.O_RDWR|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		f.Close()
		if st.Size() != 0 {
			t.Fatalf("O_TRUNC left %d bytes", st.Size())
		}
		if got := readNative(t, native, np("tr")); len(got) != 0 {
			t.Fatalf("native sees %d bytes after O_TRUNC", len(got))
		}
	})

	t.Run("TruncateWhileWriting", func(t *testing.T) {
		// Writes gathered on one descriptor must not reappear after
		// another descriptor truncates the file.
		w, err := os.OpenFile(p("tw"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(Pattern(11, 200<<10)); err != nil {
			t.Fatal(err)
		}
		w2, err := os.OpenFile(p("tw"), os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := w2.Close(); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(p("tw")); err != nil || st.Size() != 0 {
			t.Fatalf("after O_TRUNC by a second descriptor and close of the first: %v %v, want size 0", st, err)
		}
		if got := readNative(t, native, np("tw")); len(got) != 0 {
			t.Fatalf("native read: %d bytes, want 0", len(got))
		}
	})

	t.Run("ListingDuringChanges", func(t *testing.T) {
		dir := p("busy")
		os.Mkdir(dir, 0o755)
		for i := range 20 {
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("stable%02d", i)), []byte("s"), 0o644)
		}
		churn, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; churn.Err() == nil; i++ {
				name := filepath.Join(dir, fmt.Sprintf("churn%d", i%7))
				if i%2 == 0 {
					os.WriteFile(name, []byte("c"), 0o644)
				} else {
					os.Remove(name)
				}
			}
		}()
		for range 50 {
			ents, err := os.ReadDir(dir)
			if err != nil {
				cancel()
				wg.Wait()
				t.Fatalf("listing while files come and go: %v", err)
			}
			stable := 0
			for _, e := range ents {
				if len(e.Name()) > 6 && e.Name()[:6] == "stable" {
					stable++
				}
			}
			if stable != 20 {
				cancel()
				wg.Wait()
				t.Fatalf("a listing during changes shows %d of the 20 unchanged files", stable)
			}
		}
		cancel()
		wg.Wait()
		ents, _ := os.ReadDir(dir)
		nat, err := native.List(ctx, np("busy"))
		if err != nil || len(nat) != len(ents) {
			t.Fatalf("after the changes: mount lists %d, native %d (%v)", len(ents), len(nat), err)
		}
	})

	t.Run("ConcurrentWritersDifferentFiles", func(t *testing.T) {
		os.Mkdir(p("cw"), 0o755)
		const writers = 8
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := p(fmt.Sprintf("cw/f%d", w))
				f, err := os.Create(name)
				if err != nil {
					errs <- err
					return
				}
				data := Pattern(int64(100+w), 512<<10+w)
				for off := 0; off < len(data); off += 64 << 10 {
					if _, err := f.Write(data[off:min(off+64<<10, len(data))]); err != nil {
						errs <- err
						f.Close()
						return
					}
				}
				if err := f.Close(); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for w := range writers {
			want := Pattern(int64(100+w), 512<<10+w)
			if got := readNative(t, native, np(fmt.Sprintf("cw/f%d", w))); !bytes.Equal(got, want) {
				t.Fatalf("writer %d: native read differs (%d bytes, want %d)", w, len(got), len(want))
			}
		}
	})

	t.Run("Errors", func(t *testing.T) {
		if _, err := os.Open(p("nope")); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("open missing: %v, want ENOENT", err)
		}
		os.Mkdir(p("e"), 0o755)
		if err := os.Mkdir(p("e"), 0o755); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("mkdir existing: %v, want EEXIST", err)
		}
		os.WriteFile(p("e/f"), nil, 0o644)
		if err := syscall.Rmdir(p("e")); err != syscall.ENOTEMPTY {
			t.Errorf("rmdir non-empty: %v, want ENOTEMPTY", err)
		}
		if err := syscall.Rmdir(p("e/f")); err != syscall.ENOTDIR {
			t.Errorf("rmdir of a file: %v, want ENOTDIR", err)
		}
		if err := syscall.Unlink(p("e")); err != syscall.EISDIR {
			t.Errorf("unlink of a directory: %v, want EISDIR", err)
		}
		if _, err := os.OpenFile(p("e/f"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("O_EXCL on an existing file: %v, want EEXIST", err)
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(mnt, &st); err != nil || st.Blocks == 0 {
			t.Errorf("statfs: %+v %v", st, err)
		}
	})

	t.Run("Xattr", func(t *testing.T) {
		if _, ok := native.(fs.Xattrer); !ok {
			t.Skip("the backend stores no extended attributes")
		}
		f := p("xa")
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(f, "user.a", []byte("v1"), 0); err != nil {
			t.Fatalf("setxattr user.a: %v", err)
		}
		buf := make([]byte, 64)
		if n, err := unix.Getxattr(f, "user.a", buf); err != nil || string(buf[:n]) != "v1" {
			t.Fatalf("getxattr user.a: %q, %v; want v1", buf[:max(n, 0)], err)
		}
		if n, err := unix.Listxattr(f, buf); err != nil || !slices.Contains(strings.Split(string(buf[:n]), "\x00"), "user.a") {
			t.Fatalf("listxattr: %q, %v; want user.a in it", buf[:max(n, 0)], err)
		}
		if err := unix.Setxattr(f, "user.a", []byte("v2"), unix.XATTR_CREATE); err != unix.EEXIST {
			t.Errorf("setxattr XATTR_CREATE of an existing name: %v, want EEXIST", err)
		}
		if err := unix.Setxattr(f, "user.b", []byte("v"), unix.XATTR_REPLACE); err != unix.ENODATA {
			t.Errorf("setxattr XATTR_REPLACE of a missing name: %v, want ENODATA", err)
		}
		// Only user.* names are stored: the others are refused as a file
		// system without them refuses them, whoever asks.
		if err := unix.Setxattr(f, "trusted.x", []byte("v"), 0); err != unix.ENOTSUP {
			t.Errorf("setxattr trusted.x: %v, want ENOTSUP", err)
		}
		if err := unix.Removexattr(f, "user.a"); err != nil {
			t.Fatalf("removexattr user.a: %v", err)
		}
		if _, err := unix.Getxattr(f, "user.a", buf); err != unix.ENODATA {
			t.Errorf("getxattr after removexattr: %v, want ENODATA", err)
		}
		if err := unix.Removexattr(f, "user.a"); err != unix.ENODATA {
			t.Errorf("removexattr of a missing name: %v, want ENODATA", err)
		}
	})

	// go-fuse's reusable POSIX tests, those that apply to a file system
	// without links, symlinks, locks and xattrs.
	for _, name := range []string{
		"TruncateFile", "TruncateNoFile", "MkdirRmdir",
		"RenameOverwriteDestNoExist", "RenameOverwriteDestExist", "RenameOpenDir",
		"ReadDirBasic", "DirSeek", "AppendWrite", "DirectIO", "FileLarge",
		"ParallelFileOpen", "FdLeak", "OpenAt", "FstatDeleted",
	} {
		t.Run("posixtest/"+name, func(t *testing.T) {
			dir := p("pt-" + name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			posixtest.All[name](t, dir)
		})
	}
}

// Pattern is n deterministic pseudo-random bytes.
func Pattern(seed int64, n int) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func readNative(t *testing.T, f fs.FS, name string) []byte {
	t.Helper()
	ctx := context.Background()
	r, err := f.Open(ctx, name, fs.OpenOptions{})
	if err != nil {
		t.Fatalf("native open %s: %v", name, err)
	}
	defer r.Close()
	buf := make([]byte, r.Size())
	if len(buf) > 0 {
		if err := f.ReadBatch(ctx, []fs.ReadRequest{{File: r, Buf: buf}}); err != nil {
			t.Fatalf("native read %s: %v", name, err)
		}
	}
	return buf
}

func writeNative(t *testing.T, f fs.FS, name string, data []byte) {
	t.Helper()
	w, err := f.Create(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
}
