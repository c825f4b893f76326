package fuse_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/fuse/fusetest"
	"github.com/ffkit/ffkit/fs/localfs"
	"golang.org/x/sys/unix"
)

// TestFio runs short fio jobs on the mount: random writes with checksums
// verified on read-back, then sequential and random reads.
func TestFio(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (scripts/setup.sh installs it)")
	}
	src := t.TempDir()
	mnt, srv := mount(t, localfs.New(), src, fuse.Options{})
	for _, args := range [][]string{
		{"--name=verify", "--rw=randwrite", "--bs=4k", "--size=8M", "--verify=crc32c", "--do_verify=1", "--ioengine=psync"},
		{"--name=verifydirect", "--rw=write", "--bs=1M", "--size=16M", "--verify=crc32c", "--do_verify=1", "--direct=1", "--ioengine=psync"},
		{"--name=seqread", "--rw=read", "--bs=128k", "--size=16M", "--direct=1", "--ioengine=psync", "--numjobs=2"},
		{"--name=randread", "--rw=randread", "--bs=4k", "--size=16M", "--direct=1", "--ioengine=libaio", "--iodepth=32", "--io_size=4M"},
	} {
		cmd := exec.Command("fio", append([]string{"--directory=" + mnt, "--output-format=terse", "--verify_state_save=0"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("fio %s: %v\n%s", args[0], err, out)
		}
		if bytes.Contains(out, []byte("verify:")) || bytes.Contains(out, []byte("bad magic")) {
			t.Fatalf("fio %s reported a verification failure:\n%s", args[0], out)
		}
	}
	st := srv.Stats()
	if st.ReadAheadHits == 0 || st.Batches == 0 {
		t.Errorf("fio's sequential reads used no read-ahead or no batches: %+v", st)
	}
	t.Logf("mount stats: %+v", st)
}

// TestParquetPyarrow: pyarrow reads through the mount a Parquet file
// written natively, and writes one through the mount that reads back natively.
func TestParquetPyarrow(t *testing.T) {
	if err := exec.Command("python3", "-c", "import pyarrow.parquet").Run(); err != nil {
		t.Skip("pyarrow is not installed (scripts/setup.sh installs it): skipping the Parquet test")
	}
	src := t.TempDir()
	mnt, _ := mount(t, localfs.New(), src, fuse.Options{})
	script := `
import sys, pyarrow as pa, pyarrow.parquet as pq
src, mnt = sys.argv[1], sys.argv[2]
n = 200000
t = pa.table({"id": pa.array(range(n), pa.int64()), "name": pa.array(["row%d" % i for i in range(n)])})
pq.write_table(t, src + "/native.parquet", row_group_size=50000)
got = pq.read_table(mnt + "/native.parquet")
assert got.equals(t), "read through the mount differs"
pf = pq.ParquetFile(mnt + "/native.parquet")
assert pf.metadata.num_row_groups == 4, pf.metadata.num_row_groups
assert pf.read_row_group(2).column("id")[0].as_py() == 100000
pq.write_table(t, mnt + "/mounted.parquet")
assert pq.read_table(src + "/mounted.parquet").equals(t), "written through the mount differs"
print("ok")
`
	out, err := exec.Command("python3", "-c", script, src, mnt).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("pyarrow through the mount: %v\n%s", err, out)
	}
}

// stallFS is a storage that stops answering when stalled is set: every
// call blocks until its context ends, as a cluster that went away.
type stallFS struct {
	fs.FS
	stalled atomic.Bool
}

func (s *stallFS) wait(ctx context.Context) error {
	if !s.stalled.Load() {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *stallFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	if err := s.wait(ctx); err != nil {
		return fs.FileInfo{}, err
	}
	return s.FS.Stat(ctx, name)
}

func (s *stallFS) Open(ctx context.Context, name string, o fs.OpenOptions) (fs.File, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.FS.Open(ctx, name, o)
}

func (s *stallFS) List(ctx context.Context, dir string) ([]fs.FileInfo, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.FS.List(ctx, dir)
}

func (s *stallFS) ReadBatch(ctx context.Context, reqs []fs.ReadRequest) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.FS.ReadBatch(ctx, reqs)
}

// TestStorageGoneTimesOut: when the storage stops answering, callers get
// ETIMEDOUT after Options.Timeout instead of hanging, and the mount
// serves again once the storage is back.
func TestStorageGoneTimesOut(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), bytes.Repeat([]byte("x"), 1<<20), 0o644)
	back := &stallFS{FS: localfs.New()}
	mnt, _ := mount(t, back, src, fuse.Options{Timeout: 300 * time.Millisecond, ReadAhead: -1})
	f, err := os.Open(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back.stalled.Store(true)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, syscall.ETIMEDOUT) {
			t.Errorf("%s with the storage gone: %v, want ETIMEDOUT", what, err)
		}
	}
	start := time.Now()
	_, err = os.Stat(filepath.Join(mnt, "f"))
	check("stat", err)
	_, err = f.ReadAt(make([]byte, 4096), 8192)
	check("read", err)
	_, err = os.ReadDir(mnt)
	check("readdir", err)
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("three calls took %v with a 300ms timeout", d)
	}
	back.stalled.Store(false)
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 8192); err != nil || buf[0] != 'x' {
		t.Fatalf("read after the storage came back: %v", err)
	}
}

// plainFS hides the backend's optional capabilities: only the fs.FS
// contract (whole files published by Create + Commit) is left.
type plainFS struct{ fs.FS }

func TestSequentialOnlyBackend(t *testing.T) {
	src := t.TempDir()
	mnt, _ := mount(t, plainFS{localfs.New()}, src, fuse.Options{})
	data := fusetest.Pattern(9, 3<<20+1)
	if err := os.WriteFile(filepath.Join(mnt, "new"), data, 0o644); err != nil {
		t.Fatalf("write a new file sequentially: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(src, "new")); !bytes.Equal(got, data) {
		t.Fatalf("published file: %d bytes, want %d", len(got), len(data))
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "new")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back through the mount: %v", err)
	}
	// Rewriting a whole file replaces it.
	if err := os.WriteFile(filepath.Join(mnt, "new"), []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(src, "new")); string(got) != "short" {
		t.Fatalf("after rewrite: %q", got)
	}
	// Writes at offsets need fs.RandomAccessFS.
	if _, err := os.OpenFile(filepath.Join(mnt, "new"), os.O_RDWR, 0); !errors.Is(err, syscall.ENOTSUP) {
		t.Fatalf("O_RDWR open without random-access support: %v, want ENOTSUP", err)
	}
	f, err := os.Create(filepath.Join(mnt, "gap"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 100); !errors.Is(err, syscall.ENOTSUP) {
		t.Errorf("write at a gap: %v, want ENOTSUP", err)
	}
	f.Close()
}

func TestReadOnly(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("data"), 0o644)
	mnt, _ := mount(t, localfs.New(), src, fuse.Options{ReadOnly: true})
	if got, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(got) != "data" {
		t.Fatalf("read: %q %v", got, err)
	}
	for what, err := range map[string]error{
		"create": os.WriteFile(filepath.Join(mnt, "g"), nil, 0o644),
		"mkdir":  os.Mkdir(filepath.Join(mnt, "d"), 0o755),
		"remove": os.Remove(filepath.Join(mnt, "f")),
		"rename": os.Rename(filepath.Join(mnt, "f"), filepath.Join(mnt, "h")),
	} {
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s on a read-only mount: %v, want EROFS", what, err)
		}
	}
}

func TestErrnoMapping(t *testing.T) {
	for _, c := range []struct {
		err  error
		want syscall.Errno
	}{
		{fs.ErrNotExist, syscall.ENOENT},
		{fs.ErrExist, syscall.EEXIST},
		{fs.ErrNoSpace, syscall.ENOSPC},
		{fs.ErrUnavailable, syscall.EIO},
		{context.DeadlineExceeded, syscall.ETIMEDOUT},
		{&os.PathError{Op: "rmdir", Path: "x", Err: syscall.ENOTEMPTY}, syscall.ENOTEMPTY},
		{errors.New("anything else"), syscall.EIO},
	} {
		if got := fuse.Errno(c.err); got != c.want {
			t.Errorf("Errno(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestUnmountBusy: a mount with a file held open is detached at once, and
// Unmount returns after UnmountGrace instead of waiting for the holder.
func TestUnmountBusy(t *testing.T) {
	needFUSE(t)
	src, mnt := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("held"), 0o644)
	srv, err := fuse.Mount(localfs.New(), src, mnt, fuse.Options{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	old := fuse.UnmountGrace
	fuse.UnmountGrace = 300 * time.Millisecond
	defer func() { fuse.UnmountGrace = old }()
	start := time.Now()
	err = srv.Unmount()
	if err == nil || !strings.Contains(err.Error(), "still open") {
		t.Errorf("Unmount of a busy mount: %v, want an error saying files are still open", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Unmount took %v", d)
	}
	if fuse.IsMounted(mnt) {
		t.Error("the busy mount is still in the namespace")
	}
}

// TestReadAheadSequentialNotRandom: one descriptor read sequentially is
// served by read-ahead with the right bytes; random reads through another
// start no read-ahead (which would fetch whole windows for nothing).
func TestReadAheadSequentialNotRandom(t *testing.T) {
	src := t.TempDir()
	const size = 256 << 20
	data := fusetest.Pattern(7, 24<<20)
	f, err := os.Create(filepath.Join(src, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil { // the rest is a hole: zeros
		t.Fatal(err)
	}
	f.Close()
	mnt, srv := mount(t, localfs.New(), src, fuse.Options{})

	// Sequential, 128 KiB at a time, as fio's O_DIRECT job reads.
	r, err := os.Open(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 128<<10)
	for off := 0; off < len(data); off += len(buf) {
		if _, err := r.ReadAt(buf, int64(off)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, data[off:off+len(buf)]) {
			t.Fatalf("sequential read at %d: bytes differ from the file's", off)
		}
	}
	r.Close()
	st := srv.Stats()
	// Counted in FUSE reads: the kernel's read-ahead (Options.KernelReadAhead)
	// turns the 128 KiB reads into larger ones.
	if st.ReadAheadHits < st.Reads/2 {
		t.Errorf("sequential reads: %d of %d FUSE reads served by read-ahead", st.ReadAheadHits, st.Reads)
	}

	// The kernel releases the file after close returns: wait until the
	// sequential window is closed and its last fetches have ended, so that
	// none of their bytes count below.
	eventually(t, "sequential read-ahead freed after close", func() error {
		if h := srv.Stats().ReadAheadHeld; h != 0 {
			return fmt.Errorf("%d read-ahead blocks still held", h)
		}
		return nil
	})

	// Random 4 KiB reads over the whole file.
	r, err = os.Open(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	before := srv.Stats().ReadAheadBytes
	rng := rand.New(rand.NewSource(1))
	small := make([]byte, 4096)
	for range 3000 {
		off := rng.Int63n(size/4096) * 4096
		if _, err := r.ReadAt(small, off); err != nil {
			t.Fatal(err)
		}
		if off+4096 <= int64(len(data)) && !bytes.Equal(small, data[off:off+4096]) {
			t.Fatalf("random read at %d: bytes differ from the file's", off)
		}
	}
	// One window started by chance would be 32 MiB; allow one.
	if got := srv.Stats().ReadAheadBytes - before; got > 32<<20 {
		t.Errorf("3000 random 4 KiB reads made read-ahead fetch %d bytes", got)
	}
}

// TestReadAheadSharedFairly: handles reading ahead at once share the
// mount's read-ahead memory, so that none is left to read block by block.
func TestReadAheadSharedFairly(t *testing.T) {
	src := t.TempDir()
	const files, size, block = 4, 8 << 20, 256 << 10
	var data [][]byte
	for i := range files {
		d := fusetest.Pattern(int64(10+i), size)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint(i)), d, 0o644); err != nil {
			t.Fatal(err)
		}
		data = append(data, d)
	}
	// 16 blocks for the mount, 8 in one handle's window: two handles
	// alone would take them all.
	// The kernel's own read-ahead and whole-file fetches off: the reads
	// arrive as issued, and only the windows use the memory.
	mnt, srv := mount(t, localfs.New(), src, fuse.Options{ReadAheadBlock: block, ReadAhead: 8 * block, ReadAheadMemory: 16 * block,
		ReadWhole: -1, KernelReadAhead: -1})
	var fs []*os.File
	for i := range files {
		f, err := os.Open(filepath.Join(mnt, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fs = append(fs, f)
	}
	buf := make([]byte, 64<<10)
	var from, to fuse.Stats // the middle half: shares settled, no file near its end
	for off := 0; off < size; off += len(buf) {
		switch off {
		case size / 4:
			from = srv.Stats()
		case size * 3 / 4:
			to = srv.Stats()
		}
		for i, f := range fs {
			if _, err := f.ReadAt(buf, int64(off)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf, data[i][off:off+len(buf)]) {
				t.Fatalf("file %d at %d: bytes differ", i, off)
			}
		}
	}
	if reads, hits := to.Reads-from.Reads, to.ReadAheadHits-from.ReadAheadHits; hits < reads*9/10 {
		t.Errorf("middle half: %d of %d interleaved sequential reads served by read-ahead, want 90%%: %+v", hits, reads, to)
	}
}

// ctxFS is a storage whose Stat honours its context, as the cluster
// client does.
type ctxFS struct{ fs.FS }

func (c ctxFS) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	if err := ctx.Err(); err != nil {
		return fs.FileInfo{}, fmt.Errorf("stat %s: %w", name, err)
	}
	return c.FS.Stat(ctx, name)
}

// TestStoppingMountIsNotEINTR: while a busy mount is being unmounted, its
// storage calls are canceled; the callers still inside it get ENOTCONN (a
// gone mount), not EINTR, which Go's os package and others retry forever
// (a benchmark once spun on it, logging 122,240 failed stats).
func TestStoppingMountIsNotEINTR(t *testing.T) {
	needFUSE(t)
	src, mnt := t.TempDir(), t.TempDir()
	os.Mkdir(filepath.Join(src, "d"), 0o755)
	srv, err := fuse.Mount(ctxFS{localfs.New()}, src, mnt, fuse.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(filepath.Join(mnt, "d"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	old := fuse.UnmountGrace
	fuse.UnmountGrace = time.Minute
	defer func() { fuse.UnmountGrace = old }()
	unmounted := make(chan error, 1)
	go func() { unmounted <- srv.Unmount() }()
	closed := false
	defer func() {
		if !closed {
			unix.Close(dfd)
			<-unmounted
		}
	}()
	deadline := time.Now().Add(time.Minute)
	var st unix.Stat_t
	for i := 0; ; i++ {
		// A new name each time: nothing cached answers it.
		err := unix.Fstatat(dfd, fmt.Sprintf("missing-%d", i), &st, 0)
		if err == unix.ENOENT {
			if time.Now().After(deadline) {
				t.Fatal("the mount never stopped")
			}
			time.Sleep(time.Millisecond)
			continue
		}
		if err != unix.ENOTCONN {
			t.Fatalf("stat in a stopping mount: %v (%d), want ENOTCONN", err, err)
		}
		break
	}
	unix.Close(dfd)
	closed = true
	if err := <-unmounted; err != nil {
		t.Logf("unmount: %v", err)
	}
}
