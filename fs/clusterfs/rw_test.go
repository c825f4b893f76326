package clusterfs

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/fstest"
)

func TestRandomAccessWrites(t *testing.T) {
	c := startCluster(t, nil, 1)
	f := c.open(t)
	ctx := context.Background()
	cs := int64(256 << 10) // the test cluster's chunk size
	if _, err := f.OpenWrite(ctx, "/rw", 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("OpenWrite of a missing file without OCreate: %v", err)
	}
	w, err := f.OpenWrite(ctx, "/rw", fs.OCreate|fs.OExcl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.OpenWrite(ctx, "/rw", fs.OCreate|fs.OExcl); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("OCreate|OExcl of an existing file: %v", err)
	}
	model := make([]byte, 0)
	put := func(off int64, b []byte) {
		t.Helper()
		if _, err := w.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		if end := off + int64(len(b)); end > int64(len(model)) {
			model = append(model, make([]byte, end-int64(len(model)))...)
		}
		copy(model[off:], b)
	}
	// Across a chunk boundary, then past a hole, then an overwrite.
	put(cs-100, bytes.Repeat([]byte{1}, 300))
	put(3*cs+7, bytes.Repeat([]byte{2}, 50))
	put(10, []byte("hello"))
	got := make([]byte, len(model))
	if n, err := w.ReadAt(got, 0); n != len(model) || (err != nil && n != len(got)) || !bytes.Equal(got, model) {
		t.Fatalf("read through the handle: n=%d err=%v equal=%v", n, err, bytes.Equal(got, model))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat(ctx, "/rw")
	if st.Size != int64(len(model)) {
		t.Fatalf("size after Flush %d, want %d", st.Size, len(model))
	}
	// Another reader sees the bytes, holes as zeros.
	r, err := f.Open(ctx, "/rw", fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got2 := make([]byte, r.Size())
	if _, err := r.ReadAt(got2, 0); err != nil || !bytes.Equal(got2, model) {
		t.Fatalf("read through Open: %v equal=%v", err, bytes.Equal(got2, model))
	}
	// Two writers extending: the length is the largest end.
	w2, err := f.OpenWrite(ctx, "/rw", 0)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i, h := range []fs.WriteFile{w, w2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.WriteAt([]byte{9}, 5*cs+int64(i)*1000)
			h.Flush()
		}()
	}
	wg.Wait()
	st, _ = f.Stat(ctx, "/rw")
	if st.Size != 5*cs+1001 {
		t.Fatalf("size with two writers %d, want %d", st.Size, 5*cs+1001)
	}
	// Shrinking needs no other writer open.
	if err := w.Truncate(100); err == nil {
		t.Fatal("truncate with another writer open succeeded")
	}
	w2.Close()
	if err := w.Truncate(cs + 10); err != nil {
		t.Fatal(err)
	}
	if w.Size() != cs+10 {
		t.Fatalf("size after truncate %d", w.Size())
	}
	// Extending again: bytes past the old cut read as zeros, not old data.
	if _, err := w.WriteAt([]byte{7}, 2*cs); err != nil {
		t.Fatal(err)
	}
	tail := make([]byte, cs-10)
	if _, err := w.ReadAt(tail, cs+10); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tail, make([]byte, len(tail))) {
		t.Fatal("bytes cut by truncate came back")
	}
	// Unlinked while open: still readable and writable through the handle.
	if err := f.Remove(ctx, "/rw"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("still"), 0); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := w.ReadAt(b, 0); err != nil || string(b) != "still" {
		t.Fatalf("read of an unlinked open file: %q %v", b, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// OTrunc.
	w3, err := f.OpenWrite(ctx, "/t", fs.OCreate)
	if err != nil {
		t.Fatal(err)
	}
	w3.WriteAt([]byte("0123456789"), 0)
	w3.Close()
	w4, err := f.OpenWrite(ctx, "/t", fs.OTrunc)
	if err != nil {
		t.Fatal(err)
	}
	if w4.Size() != 0 {
		t.Fatalf("OTrunc left %d bytes", w4.Size())
	}
	w4.Close()
	if err := f.Truncate(ctx, "/t", 4); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.Stat(ctx, "/t"); st.Size != 4 {
		t.Fatalf("FS.Truncate: size %d", st.Size)
	}
}

// TestRandomAccessConformance runs the fs.RandomAccessFS conformance suite
// against a real in-process cluster (mgmtd, 3 storage servers, 3 replicas).
func TestRandomAccessConformance(t *testing.T) {
	c := startCluster(t, nil, 1)
	f := c.open(t)
	ctx := context.Background()
	if err := f.MkdirAll(ctx, "/rac"); err != nil {
		t.Fatal(err)
	}
	fstest.RunRandomAccess(t, f, "/rac")
}
