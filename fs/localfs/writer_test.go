package localfs

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// The staged, O_DIRECT, fallocate-ahead writer must produce exactly the
// bytes written, patched by WriteAt, for sizes around the chunk size.
func TestWriterChunksAndWriteAt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{0, 1, 4095, writeChunk - 1, writeChunk, writeChunk + 1, 3*writeChunk + 12345} {
		want := make([]byte, size)
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		p := filepath.Join(dir, "f")
		os.Remove(p)
		w, err := New().Create(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		for rest := want; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(3<<20))
			if _, err := w.Write(rest[:k]); err != nil {
				t.Fatal(err)
			}
			rest = rest[k:]
		}
		wa := w.(interface {
			WriteAt([]byte, int64) (int, error)
		})
		// patch the start (already on disk for large files) and the end (still staged)
		for _, off := range []int{0, size / 2, size - 10} {
			if off < 0 || off+10 > size {
				continue
			}
			patch := bytes.Repeat([]byte{byte(off)}, 10)
			copy(want[off:], patch)
			if _, err := wa.WriteAt(patch, int64(off)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := wa.WriteAt([]byte{1}, int64(size)); err == nil {
			t.Fatal("WriteAt past the end accepted")
		}
		// the failed WriteAt poisons the writer: Commit must fail and publish nothing
		if err := w.Commit(); err == nil {
			t.Fatal("commit after a failed write succeeded")
		}
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("published after failure: %v", err)
		}
		// again, cleanly
		w, _ = New().Create(ctx, p)
		w.Write(want)
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("size %d: read back %d bytes, equal=%v, err %v", size, len(got), bytes.Equal(got, want), err)
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 {
			t.Fatalf("left behind: %v", ents)
		}
	}
}

// CopyFromAt copies ranges of a file straight into the staged chunks with
// parallel reads, in order, teeing the bytes in order.
func TestWriterCopyFromAt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src := make([]byte, 9<<20+333)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	sp := filepath.Join(dir, "src")
	os.WriteFile(sp, src, 0o644)
	sf, _ := os.Open(sp)
	defer sf.Close()
	w, err := New().Create(ctx, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	c := w.(interface {
		CopyFromAt(r io.ReaderAt, off, n int64, tee io.Writer, par int) (int64, error)
	})
	var want, teed bytes.Buffer
	w.Write([]byte("head"))
	want.WriteString("head")
	for _, r := range [][2]int64{{0, 100}, {5, 3 << 20}, {1 << 20, 6<<20 + 333}, {0, 0}} {
		n, err := c.CopyFromAt(sf, r[0], r[1], &teed, 4)
		if err != nil || n != r[1] {
			t.Fatal(n, err)
		}
		want.Write(src[r[0] : r[0]+r[1]])
	}
	if _, err := c.CopyFromAt(sf, int64(len(src))-10, 20, nil, 4); err == nil {
		t.Fatal("short source accepted")
	}
	if err := w.Commit(); err == nil {
		t.Fatal("commit after a failed copy succeeded")
	}
	if !bytes.Equal(teed.Bytes(), want.Bytes()[4:]) {
		t.Fatal("tee got other bytes")
	}
	w, _ = New().Create(ctx, filepath.Join(dir, "out"))
	c = w.(interface {
		CopyFromAt(r io.ReaderAt, off, n int64, tee io.Writer, par int) (int64, error)
	})
	c.CopyFromAt(sf, 0, int64(len(src)), nil, 3)
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "out"))
	if !bytes.Equal(got, src) {
		t.Fatal("copied file differs")
	}
}
