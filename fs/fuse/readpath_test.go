package fuse_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/fuse/fusetest"
	"github.com/ffkit/ffkit/fs/localfs"
)

// npLoad reads a file through f as np.load reads an .npz: 1 MiB at 0,
// the tail, then the whole file from 0; it returns what the last pass read.
func npLoad(t *testing.T, f *os.File, size int) []byte {
	t.Helper()
	head := make([]byte, min(1<<20, size))
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	tail := make([]byte, min(64<<10, size))
	if _, err := f.ReadAt(tail, int64(size-len(tail))); err != nil {
		t.Fatal(err)
	}
	all := make([]byte, size)
	if _, err := f.ReadAt(all, 0); err != nil {
		t.Fatal(err)
	}
	return all
}

// TestReadWholeSmallFiles: small files are fetched whole at open, and
// every read of the head-tail-head pattern is served from memory.
func TestReadWholeSmallFiles(t *testing.T) {
	src := t.TempDir()
	const files, size = 4, 3<<20 + 12345
	var data [][]byte
	for i := range files {
		d := fusetest.Pattern(int64(40+i), size)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint(i)), d, 0o644); err != nil {
			t.Fatal(err)
		}
		data = append(data, d)
	}
	mnt, srv := mount(t, localfs.New(), src, fuse.Options{})
	for i := range files {
		f, err := os.Open(filepath.Join(mnt, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		got := npLoad(t, f, size)
		f.Close()
		if !bytes.Equal(got, data[i]) {
			t.Fatalf("file %d: bytes differ from the file's", i)
		}
	}
	// Each file is stored in the kernel's cache after its open returned,
	// as its pieces arrived (or taken by the kernel's own reads).
	eventually(t, "the stores of the fetches", func() error {
		if st := srv.Stats(); st.StoredFiles != files {
			return fmt.Errorf("%d files stored in the kernel's cache: %+v", st.StoredFiles, st)
		}
		return nil
	})
	st := srv.Stats()
	if st.WholeFiles != files {
		t.Errorf("%d files opened, %d fetched whole: %+v", files, st.WholeFiles, st)
	}
	// Every read was served by the kernel from the stored pages, or by
	// the mount from the fetched files.
	if st.ReadAheadHits != st.Reads {
		t.Errorf("%d of %d reads served from the fetched files: %+v", st.ReadAheadHits, st.Reads, st)
	}
	if st.Batches != 0 {
		t.Errorf("%d reads went to the storage one by one: %+v", st.BatchedReads, st)
	}

	// The files change behind the mount (new bytes, one shorter, one
	// longer): an open sees them, not the pages stored before.
	for i := range files {
		d := fusetest.Pattern(int64(80+i), size-(i-1)*100000)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint(i)), d, 0o644); err != nil {
			t.Fatal(err)
		}
		data[i] = d
	}
	for i := range files {
		got, err := os.ReadFile(filepath.Join(mnt, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data[i]) {
			t.Fatalf("file %d after a change behind the mount: %d bytes, want %d, or the bytes differ", i, len(got), len(data[i]))
		}
	}
}

// TestStoreCacheOff: with Options.NoStoreCache, files fetched whole are
// not stored in the kernel's cache; their reads come to the mount.
func TestStoreCacheOff(t *testing.T) {
	src := t.TempDir()
	const size = 2<<20 + 7
	d := fusetest.Pattern(5, size)
	if err := os.WriteFile(filepath.Join(src, "f"), d, 0o644); err != nil {
		t.Fatal(err)
	}
	mnt, srv := mount(t, localfs.New(), src, fuse.Options{NoStoreCache: true})
	got, err := os.ReadFile(filepath.Join(mnt, "f"))
	if err != nil || !bytes.Equal(got, d) {
		t.Fatalf("read: %d bytes, %v; want the file's %d", len(got), err, size)
	}
	if st := srv.Stats(); st.WholeFiles != 1 || st.StoredFiles != 0 || st.Reads == 0 || st.ReadAheadHits != st.Reads {
		t.Errorf("stats: %+v", st)
	}
}

// alignedBytes returns n bytes at a 4 KiB boundary (for O_DIRECT).
func alignedBytes(n int) []byte {
	b := make([]byte, n+4096)
	o := int(uintptr(unsafe.Pointer(&b[0])) % 4096)
	if o != 0 {
		o = 4096 - o
	}
	return b[o : o+n]
}

// TestReadAheadSurvivesJump: a sequential reader that jumps to the tail
// and comes back finds its read-ahead window still there.
func TestReadAheadSurvivesJump(t *testing.T) {
	src := t.TempDir()
	const size, block = 8 << 20, 256 << 10
	data := fusetest.Pattern(50, size)
	if err := os.WriteFile(filepath.Join(src, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	mnt, srv := mount(t, localfs.New(), src, fuse.Options{ReadWhole: -1, ReadAheadBlock: block, ReadAhead: 4 * block})
	// O_DIRECT: the reads arrive as issued, not reshaped by the page cache.
	f, err := os.OpenFile(filepath.Join(mnt, "big"), os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedBytes(128 << 10)
	read := func(off int) {
		t.Helper()
		if _, err := f.ReadAt(buf, int64(off)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, data[off:off+len(buf)]) {
			t.Fatalf("read at %d: bytes differ from the file's", off)
		}
	}
	off := 0
	for range 8 {
		read(off)
		off += len(buf)
	}
	read(size - len(buf)) // the footer
	before := srv.Stats()
	read(off) // back where it was
	after := srv.Stats()
	if after.ReadAheadHits != before.ReadAheadHits+1 {
		t.Errorf("the read after coming back was not served by read-ahead: before %+v, after %+v", before, after)
	}
	for range 8 {
		off += len(buf)
		read(off)
	}
	if st := srv.Stats(); st.ReadAheadWasted != 0 {
		t.Errorf("%d read-ahead blocks dropped unread: %+v", st.ReadAheadWasted, st)
	}
}

// fsxOps is how many operations TestRandomReadWrite* run
// (FFKIT_FSX_OPS raises it for a long run).
func fsxOps(t *testing.T, def int) int {
	if s := os.Getenv("FFKIT_FSX_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("FFKIT_FSX_OPS=%q: want a positive count", s)
		}
		return n
	}
	return def
}

// fsx runs one seeded random sequence of writes, reads, truncates, syncs
// and reopens (read-only ones too, which take the read path: whole-file
// fetches, read-ahead) on a file in the mount and on a file in a local
// directory, as xfstests' fsx does against its model, and fails on the
// first read that differs.
func fsx(t *testing.T, mntFile, refFile string, seed int64, ops int) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	const maxLen = 6 << 20
	open := func(p string) *os.File {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		return f
	}
	m, r := open(mntFile), open(refFile)
	defer func() { m.Close(); r.Close() }()
	size := int64(0)
	compare := func(op int, what string, mf *os.File, off int64, n int) {
		got, want := make([]byte, n), make([]byte, n)
		gn, gerr := mf.ReadAt(got, off)
		wn, werr := r.ReadAt(want, off)
		if gn != wn || (gerr == nil) != (werr == nil) || !bytes.Equal(got[:gn], want[:wn]) {
			t.Fatalf("seed %d op %d: %s [%d, +%d) of a %d-byte file: mount read %d bytes (%v), local %d (%v); equal %v",
				seed, op, what, off, n, size, gn, gerr, wn, werr, bytes.Equal(got[:min(gn, wn)], want[:min(gn, wn)]))
		}
	}
	for op := range ops {
		switch k := rng.Intn(100); {
		case k < 40: // write
			off := rng.Int63n(maxLen)
			n := 1 + rng.Intn(256<<10)
			if off+int64(n) > maxLen {
				n = int(maxLen - off)
			}
			b := fusetest.Pattern(rng.Int63(), n)
			if _, err := m.WriteAt(b, off); err != nil {
				t.Fatalf("seed %d op %d: write [%d, +%d): %v", seed, op, off, n, err)
			}
			if _, err := r.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
			size = max(size, off+int64(n))
		case k < 75: // read, sometimes past the end
			off := rng.Int63n(size + 1 + 64<<10)
			compare(op, "read", m, off, 1+rng.Intn(512<<10))
		case k < 83: // truncate
			ns := rng.Int63n(maxLen)
			if err := m.Truncate(ns); err != nil {
				t.Fatalf("seed %d op %d: truncate %d: %v", seed, op, ns, err)
			}
			if err := r.Truncate(ns); err != nil {
				t.Fatal(err)
			}
			size = ns
		case k < 87: // fsync
			if err := m.Sync(); err != nil {
				t.Fatalf("seed %d op %d: fsync: %v", seed, op, err)
			}
		case k < 93: // close and reopen
			if err := m.Close(); err != nil {
				t.Fatalf("seed %d op %d: close: %v", seed, op, err)
			}
			m = open(mntFile)
		default: // close, then read in a read-only open as np.load does
			if err := m.Close(); err != nil {
				t.Fatalf("seed %d op %d: close: %v", seed, op, err)
			}
			ro, err := os.Open(mntFile)
			if err != nil {
				t.Fatalf("seed %d op %d: %v", seed, op, err)
			}
			if st, err := ro.Stat(); err != nil || st.Size() != size {
				t.Fatalf("seed %d op %d: stat after close: %v, %v, want size %d", seed, op, st, err, size)
			}
			compare(op, "read-only head", ro, 0, 1<<20)
			compare(op, "read-only tail", ro, max(0, size-64<<10), 64<<10)
			compare(op, "read-only whole", ro, 0, int(size))
			ro.Close()
			m = open(mntFile)
		}
	}
	compare(ops, "final contents", m, 0, int(size)+1)
	if st, err := m.Stat(); err != nil || st.Size() != size {
		t.Fatalf("seed %d: final stat %v, %v, want size %d", seed, st, err, size)
	}
}

// TestRandomReadWriteLocal: fsx-style random operations through a mount
// of a local directory agree with the same operations on the local disk.
func TestRandomReadWriteLocal(t *testing.T) {
	src := t.TempDir()
	ref := t.TempDir()
	mnt, srv := mount(t, localfs.New(), src, fuse.Options{})
	ops := fsxOps(t, 1500)
	for seed := range int64(2) {
		fsx(t, filepath.Join(mnt, fmt.Sprint(seed)), filepath.Join(ref, fmt.Sprint(seed)), seed, ops)
	}
	if st := srv.Stats(); st.WholeFiles == 0 {
		t.Errorf("no read-only open fetched its file whole: %+v", st)
	}
}

// TestRandomReadWriteCluster: the same against a cluster mount; its
// read-only opens use the LOOKUP's answer (no metadata round trip).
func TestRandomReadWriteCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := startCluster(t)
	if err := c.fs.MkdirAll(context.Background(), "/fsx"); err != nil {
		t.Fatal(err)
	}
	mnt, srv := mount(t, c.fs, "/fsx", fuse.Options{})
	ref := t.TempDir()
	fsx(t, filepath.Join(mnt, "f"), filepath.Join(ref, "f"), 7, fsxOps(t, 600))
	if st := srv.Stats(); st.OpensFromLookup == 0 || st.WholeFiles == 0 {
		t.Errorf("read-only opens: %d from the LOOKUP's answer, %d fetched whole: %+v", st.OpensFromLookup, st.WholeFiles, st)
	}
	// With cached names the kernel sends no LOOKUP before most opens: an
	// open must not use the answer of a LOOKUP from before this mount's
	// own writes.
	mnt2, _ := mount(t, c.fs, "/fsx", fuse.Options{AttrTimeout: time.Hour})
	old := fusetest.Pattern(60, 1<<20)
	w, err := c.fs.Create(context.Background(), "/fsx/h")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(old); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(mnt2, "h")
	if st, err := os.Stat(p); err != nil || st.Size() != int64(len(old)) { // the LOOKUP
		t.Fatalf("stat: %v, %v", st, err)
	}
	more := fusetest.Pattern(61, 1<<20)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(more); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if want := append(old, more...); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back after an append through the mount: %d bytes (%v), want %d; equal %v", len(got), err, len(want), bytes.Equal(got, want))
	}
	fsx(t, filepath.Join(mnt2, "g"), filepath.Join(ref, "g"), 8, fsxOps(t, 300))
}
