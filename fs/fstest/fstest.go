// Package fstest is the conformance suite of the fs.FS contract. Every
// implementation (local files, the cluster client) runs the same Run, so
// the packages above fs behave the same on any storage.
package fstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"path"
	"sync"
	"testing"

	"github.com/ffkit/ffkit/fs"
)

// Run runs the suite against f, using the directory root (which must exist
// and be empty) for its files.
func Run(t *testing.T, f fs.FS, root string) {
	ctx := context.Background()
	p := func(name string) string { return path.Join(root, name) }

	write := func(t *testing.T, name string, data []byte) {
		t.Helper()
		w, err := f.Create(ctx, name)
		if err != nil {
			t.Fatalf("Create(%s): %v", name, err)
		}
		if _, err := w.Write(data); err != nil {
			t.Fatalf("Write(%s): %v", name, err)
		}
		if err := w.Commit(); err != nil {
			t.Fatalf("Commit(%s): %v", name, err)
		}
	}
	read := func(t *testing.T, name string) []byte {
		t.Helper()
		r, err := f.Open(ctx, name, fs.OpenOptions{})
		if err != nil {
			t.Fatalf("Open(%s): %v", name, err)
		}
		defer r.Close()
		buf := make([]byte, r.Size())
		if _, err := r.ReadAt(buf, 0); err != nil && len(buf) > 0 {
			t.Fatalf("ReadAt(%s): %v", name, err)
		}
		return buf
	}

	t.Run("CreateCommitRead", func(t *testing.T) {
		data := randBytes(1, 3<<20+17)
		write(t, p("a.bin"), data)
		if got := read(t, p("a.bin")); !bytes.Equal(got, data) {
			t.Fatalf("read back %d bytes, differ from the %d written", len(got), len(data))
		}
		st, err := f.Stat(ctx, p("a.bin"))
		if err != nil || st.Size != int64(len(data)) || st.IsDir || st.Name != "a.bin" {
			t.Fatalf("Stat = %+v, %v; want size %d file a.bin", st, err, len(data))
		}
	})

	t.Run("EmptyFile", func(t *testing.T) {
		write(t, p("empty"), nil)
		st, err := f.Stat(ctx, p("empty"))
		if err != nil || st.Size != 0 {
			t.Fatalf("Stat(empty) = %+v, %v", st, err)
		}
	})

	t.Run("UncommittedIsInvisible", func(t *testing.T) {
		w, err := f.Create(ctx, p("ghost"))
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("half written"))
		if _, err := f.Stat(ctx, p("ghost")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Stat of an uncommitted file: err = %v, want ErrNotExist", err)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("Close without Commit: %v", err)
		}
		if _, err := f.Stat(ctx, p("ghost")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("after abandon: err = %v, want ErrNotExist", err)
		}
		for _, e := range list(t, f, root) {
			if e.Name != "a.bin" && e.Name != "empty" {
				t.Fatalf("abandoned write left %q behind", e.Name)
			}
		}
	})

	t.Run("ReplaceOnCommit", func(t *testing.T) {
		write(t, p("r"), []byte("old contents"))
		w, _ := f.Create(ctx, p("r"))
		w.Write([]byte("new"))
		if got := read(t, p("r")); string(got) != "old contents" {
			t.Fatalf("before commit: %q, want the old contents", got)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := read(t, p("r")); string(got) != "new" {
			t.Fatalf("after commit: %q, want new", got)
		}
	})

	t.Run("ListSorted", func(t *testing.T) {
		dir := p("list")
		if err := f.MkdirAll(ctx, path.Join(dir, "sub", "deeper")); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"b", "a", "B", "c10", "c2"} {
			write(t, path.Join(dir, n), []byte(n))
		}
		var names []string
		for _, e := range list(t, f, dir) {
			names = append(names, e.Name)
			if e.Name == "sub" && !e.IsDir {
				t.Fatalf("sub is not reported as a directory")
			}
		}
		want := "[B a b c10 c2 sub]"
		if fmt.Sprint(names) != want {
			t.Fatalf("List = %v, want %s", names, want)
		}
	})

	t.Run("RenameRemove", func(t *testing.T) {
		write(t, p("x"), []byte("x"))
		write(t, p("y"), []byte("y"))
		if err := f.Rename(ctx, p("x"), p("y")); err != nil {
			t.Fatal(err)
		}
		if got := read(t, p("y")); string(got) != "x" {
			t.Fatalf("rename over existing: y = %q, want x", got)
		}
		if _, err := f.Stat(ctx, p("x")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("old name still there: %v", err)
		}
		if err := f.Remove(ctx, p("y")); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Open(ctx, p("y"), fs.OpenOptions{}); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Open after Remove: %v, want ErrNotExist", err)
		}
		if err := f.Remove(ctx, p("list")); err == nil {
			t.Fatal("Remove of a non-empty directory succeeded")
		}
	})

	t.Run("ReadBatch", func(t *testing.T) {
		a := randBytes(2, 1<<20)
		b := randBytes(3, 5000)
		write(t, p("ba"), a)
		write(t, p("bb"), b)
		fa, err := f.Open(ctx, p("ba"), fs.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer fa.Close()
		fb, err := f.Open(ctx, p("bb"), fs.OpenOptions{Direct: true})
		if err != nil {
			t.Fatal(err)
		}
		defer fb.Close()
		rng := rand.New(rand.NewSource(4))
		var reqs []fs.ReadRequest
		var want [][]byte
		for i := 0; i < 500; i++ {
			src, file := a, fa
			if i%3 == 0 {
				src, file = b, fb
			}
			off := rng.Intn(len(src))
			n := rng.Intn(len(src)-off) % 20000
			reqs = append(reqs, fs.ReadRequest{File: file, Off: int64(off), Buf: make([]byte, n)})
			want = append(want, src[off:off+n])
		}
		if err := f.ReadBatch(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			if !bytes.Equal(reqs[i].Buf, want[i]) {
				t.Fatalf("request %d (%s @%d, %d bytes) read wrong bytes", i, reqs[i].File.Name(), reqs[i].Off, len(want[i]))
			}
		}
		bad := []fs.ReadRequest{{File: fb, Off: int64(len(b)) - 10, Buf: make([]byte, 20)}}
		if err := f.ReadBatch(ctx, bad); !errors.Is(err, fs.ErrShortRead) {
			t.Fatalf("read past end: err = %v, want ErrShortRead", err)
		}
	})

	t.Run("ConcurrentWriters", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := p(fmt.Sprintf("cw%d", i))
				w, err := f.Create(ctx, name)
				if err == nil {
					_, err = w.Write(randBytes(int64(10+i), 100000))
				}
				if err == nil {
					err = w.Commit()
				}
				if err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for i := 0; i < 8; i++ {
			if got := read(t, p(fmt.Sprintf("cw%d", i))); !bytes.Equal(got, randBytes(int64(10+i), 100000)) {
				t.Fatalf("cw%d: wrong contents", i)
			}
		}
	})
}

func list(t *testing.T, f fs.FS, dir string) []fs.FileInfo {
	t.Helper()
	ents, err := f.List(context.Background(), dir)
	if err != nil {
		t.Fatalf("List(%s): %v", dir, err)
	}
	return ents
}

func randBytes(seed int64, n int) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}
