package fstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sync"
	"testing"

	"github.com/ffkit/ffkit/fs"
)

// RunRandomAccess is the conformance suite of the optional
// fs.RandomAccessFS capability (writes at offsets, truncate, the
// close-to-open contract of fs.WriteFile). root must exist and be empty.
func RunRandomAccess(t *testing.T, f fs.RandomAccessFS, root string) {
	ctx := context.Background()
	p := func(name string) string { return path.Join(root, name) }
	readAll := func(t *testing.T, name string) []byte {
		t.Helper()
		r, err := f.Open(ctx, name, fs.OpenOptions{})
		if err != nil {
			t.Fatalf("Open(%s): %v", name, err)
		}
		defer r.Close()
		buf := make([]byte, r.Size())
		if len(buf) > 0 {
			if err := f.ReadBatch(ctx, []fs.ReadRequest{{File: r, Buf: buf}}); err != nil {
				t.Fatalf("ReadBatch(%s): %v", name, err)
			}
		}
		return buf
	}
	readAt := func(t *testing.T, w fs.WriteFile, off int64, n int) []byte {
		t.Helper()
		buf := make([]byte, n)
		got, err := w.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("WriteFile.ReadAt(%d, %d): %v", off, n, err)
		}
		return buf[:got]
	}

	t.Run("CreateFlags", func(t *testing.T) {
		if _, err := f.OpenWrite(ctx, p("missing"), 0); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("OpenWrite of a missing file without OCreate: %v, want ErrNotExist", err)
		}
		w, err := f.OpenWrite(ctx, p("excl"), fs.OCreate|fs.OExcl)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if _, err := f.OpenWrite(ctx, p("excl"), fs.OCreate|fs.OExcl); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("OCreate|OExcl on an existing file: %v, want ErrExist", err)
		}
	})

	t.Run("OffsetsHolesAndCloseToOpen", func(t *testing.T) {
		w, err := f.OpenWrite(ctx, p("rw"), fs.OCreate)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteAt([]byte("world"), 6); err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteAt([]byte("hello"), 0); err != nil {
			t.Fatal(err)
		}
		if got := readAt(t, w, 0, 11); !bytes.Equal(got, []byte("hello\x00world")) || w.Size() != 11 {
			t.Fatalf("read back through the handle: %q, size %d", got, w.Size())
		}
		// A large write across chunk boundaries, then a hole of several
		// megabytes, then one byte.
		big := randBytes(7, 9<<20+333)
		if _, err := w.WriteAt(big, 1000); err != nil {
			t.Fatal(err)
		}
		end := int64(1000 + len(big))
		far := end + 5<<20 + 17
		if _, err := w.WriteAt([]byte{0xAB}, far); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, far+1)
		copy(want, "hello\x00world")
		copy(want[1000:], big)
		want[far] = 0xAB
		if got := readAll(t, p("rw")); !bytes.Equal(got, want) {
			t.Fatalf("another reader after Flush: %d bytes, want %d (%s)", len(got), len(want), diffSummary(got, want))
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Truncate", func(t *testing.T) {
		data := randBytes(8, 3<<20)
		w, err := f.OpenWrite(ctx, p("tr"), fs.OCreate)
		if err != nil {
			t.Fatal(err)
		}
		w.WriteAt(data, 0)
		if err := w.Truncate(1000); err != nil {
			t.Fatal(err)
		}
		if err := w.Truncate(6 << 20); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		want := append(append([]byte{}, data[:1000]...), make([]byte, 6<<20-1000)...)
		if got := readAll(t, p("tr")); !bytes.Equal(got, want) {
			t.Fatalf("after truncate to 1000 and extend to 6 MiB: %d bytes, equal %v", len(got), bytes.Equal(got, want))
		}
		if err := f.Truncate(ctx, p("tr"), 10); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, p("tr")); !bytes.Equal(got, data[:10]) {
			t.Fatalf("FS.Truncate(10): %q", got)
		}
		w, err = f.OpenWrite(ctx, p("tr"), fs.OTrunc)
		if err != nil {
			t.Fatal(err)
		}
		if w.Size() != 0 {
			t.Fatalf("OTrunc: size %d", w.Size())
		}
		w.Close()
		if st, err := f.Stat(ctx, p("tr")); err != nil || st.Size != 0 {
			t.Fatalf("after OTrunc: %+v %v", st, err)
		}
	})

	t.Run("RemoveWhileOpen", func(t *testing.T) {
		w, err := f.OpenWrite(ctx, p("gone"), fs.OCreate)
		if err != nil {
			t.Fatal(err)
		}
		w.WriteAt([]byte("before"), 0)
		w.Flush()
		if err := f.Remove(ctx, p("gone")); err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteAt([]byte("after"), 6); err != nil {
			t.Fatalf("write after remove: %v", err)
		}
		if got := readAt(t, w, 0, 11); string(got) != "beforeafter" {
			t.Fatalf("read after remove: %q", got)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("close after remove: %v", err)
		}
		if _, err := f.Stat(ctx, p("gone")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("removed file still there: %v", err)
		}
	})

	t.Run("ConcurrentWritesOneFile", func(t *testing.T) {
		w, err := f.OpenWrite(ctx, p("conc"), fs.OCreate)
		if err != nil {
			t.Fatal(err)
		}
		const pieces, size = 16, 256 << 10
		want := randBytes(9, pieces*size)
		var wg sync.WaitGroup
		errs := make(chan error, pieces)
		for i := range pieces {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := w.WriteAt(want[i*size:(i+1)*size], int64(i*size)); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, p("conc")); !bytes.Equal(got, want) {
			t.Fatalf("concurrent writers: %d bytes, equal %v", len(got), bytes.Equal(got, want))
		}
	})
}

// diffSummary says where two byte slices of equal length differ (the
// first and last differing offsets and how many bytes differ), so that a
// failure tells stale chunks from a lost small write.
func diffSummary(got, want []byte) string {
	first, last, n := -1, -1, 0
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			last, n = i, n+1
		}
	}
	if n == 0 {
		return "equal up to the shorter"
	}
	return fmt.Sprintf("%d bytes differ, first at %d, last at %d", n, first, last)
}
