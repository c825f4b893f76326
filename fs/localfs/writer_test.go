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

// Reservations filled and released out of order, from many goroutines,
// land in reservation order; mixed with plain writes and a WriteAt patch.
func TestWriterReserve(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(11, 12))
	type res interface {
		Reserve(n int64) ([][]byte, func(), error)
	}
	for _, sizes := range [][]int{{5}, {writeChunk}, {1 << 20, 3 << 20, 1, writeChunk + 7, 0, 12345}, nil} {
		if sizes == nil { // many samples: more than maxLive chunks staged at once
			for range 200 {
				sizes = append(sizes, rng.IntN(1<<20))
			}
		}
		p := filepath.Join(dir, "r")
		w, err := New().Create(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		var want bytes.Buffer
		w.Write([]byte("hdr"))
		want.WriteString("hdr")
		type job struct {
			bufs    [][]byte
			release func()
			data    []byte
		}
		jobs := make(chan job, 8)
		done := make(chan struct{})
		go func() { // fill and release in a scrambled order
			defer close(done)
			rng := rand.New(rand.NewPCG(13, 14)) // this goroutine's own
			var held []job
			for j := range jobs {
				held = append(held, j)
				if len(held) >= 3 {
					k := rng.IntN(len(held))
					fill(held[k])
					held = append(held[:k], held[k+1:]...)
				}
			}
			for _, j := range held {
				fill(j)
			}
		}()
		for _, n := range sizes {
			data := make([]byte, n)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			want.Write(data)
			bufs, release, err := w.(res).Reserve(int64(n))
			if err != nil {
				t.Fatal(err)
			}
			jobs <- job{bufs, release, data}
		}
		close(jobs)
		<-done
		patch := []byte("HDR")
		w.(interface {
			WriteAt([]byte, int64) (int, error)
		}).WriteAt(patch, 0)
		copy(want.Bytes(), patch)
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(p)
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("sizes %v: file differs (%d vs %d bytes)", len(sizes), len(got), want.Len())
		}
	}
}

func fill(j struct {
	bufs    [][]byte
	release func()
	data    []byte
}) {
	n := 0
	for _, b := range j.bufs {
		n += copy(b, j.data[n:])
	}
	j.release()
}

// One write larger than everything the writer may stage (maxLive chunks)
// used to hang forever in take: the write reserved all its bytes at once
// and its own chunks could never be written back. Write and CopyFromAt now
// stage a window at a time; Reserve refuses what could not be staged.
func TestWriterSampleLargerThanStaging(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	size := maxLive*writeChunk + writeChunk/2 + 7 // 34 MiB + 7
	want := make([]byte, size)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, want, 0o644); err != nil {
		t.Fatal(err)
	}
	sf, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	for _, how := range []string{"write", "copy"} {
		p := filepath.Join(dir, how)
		w, err := New().Create(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte("head")); err != nil { // unaligned start
			t.Fatal(err)
		}
		switch how {
		case "write":
			_, err = w.Write(want)
		case "copy":
			_, err = w.(*writer).CopyFromAt(sf, 0, int64(size), nil, 4)
		}
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got[:4]) != "head" || !bytes.Equal(got[4:], want) {
			t.Fatalf("%s: %d bytes back, want %d and the same bytes", how, len(got), size+4)
		}
	}
	w, err := New().Create(ctx, filepath.Join(dir, "reserve"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, _, err := w.(*writer).Reserve(MaxReserve + 1); err == nil {
		t.Fatal("Reserve past MaxReserve accepted")
	}
	bufs, release, err := w.(*writer).Reserve(MaxReserve)
	if err != nil {
		t.Fatalf("Reserve(MaxReserve): %v", err)
	}
	var n int
	for _, b := range bufs {
		n += len(b)
	}
	release()
	if n != MaxReserve {
		t.Fatalf("reserved %d bytes, want %d", n, MaxReserve)
	}
}
