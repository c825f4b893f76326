package localfs_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/fstest"
	"github.com/ffkit/ffkit/fs/localfs"
)

func TestOpenWrite(t *testing.T) {
	ctx := context.Background()
	l := localfs.New()
	name := filepath.Join(t.TempDir(), "rw")
	if _, err := l.OpenWrite(ctx, name, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("OpenWrite of a missing file without OCreate: %v, want ErrNotExist", err)
	}
	w, err := l.OpenWrite(ctx, name, fs.OCreate|fs.OExcl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.OpenWrite(ctx, name, fs.OCreate|fs.OExcl); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("OExcl on an existing file: %v, want ErrExist", err)
	}
	if _, err := w.WriteAt([]byte("world"), 6); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if w.Size() != 11 {
		t.Fatalf("Size = %d, want 11", w.Size())
	}
	buf := make([]byte, 11)
	if err := localfs.ReadFull(w, buf, 0); err != nil || !bytes.Equal(buf, []byte("hello\x00world")) {
		t.Fatalf("read back %q, %v", buf, err)
	}
	if err := w.Truncate(5); err != nil || w.Size() != 5 {
		t.Fatalf("Truncate: %v, size %d", err, w.Size())
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Truncate(ctx, name, 8); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(name)
	if !bytes.Equal(got, []byte("hello\x00\x00\x00")) {
		t.Fatalf("after Truncate(8): %q", got)
	}
	w, err = l.OpenWrite(ctx, name, fs.OTrunc)
	if err != nil || w.Size() != 0 {
		t.Fatalf("OTrunc: %v size %d", err, w.Size())
	}
	w.Close()
	u, err := l.StatFS(ctx, filepath.Dir(name))
	if err != nil || u.Total <= 0 || u.Free < 0 || u.Free > u.Total {
		t.Fatalf("StatFS = %+v, %v", u, err)
	}
}

func TestRandomAccessConformance(t *testing.T) {
	fstest.RunRandomAccess(t, localfs.New(), t.TempDir())
}
