package localfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/fs"
)

// POSIX takes paths longer than PATH_MAX (as a mount of a local directory
// passes them for a path near PATH_MAX inside it): every call works on
// them as on short ones.
func TestPOSIXLongPaths(t *testing.T) {
	ctx := context.Background()
	p := NewPOSIX()
	dir := t.TempDir()
	comp := strings.Repeat("d", 250)
	for len(dir) < 2*pathMax+100 { // deep enough to need two steps of shortPath
		dir = filepath.Join(dir, comp)
		if err := p.MkdirAll(ctx, dir); err != nil {
			t.Fatalf("mkdir at %d bytes: %v", len(dir), err)
		}
	}
	f, g, h := filepath.Join(dir, "f"), filepath.Join(dir, "g"), filepath.Join(dir, "h")
	w, err := p.OpenWrite(ctx, f, fs.OCreate)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if w.(*WriteFile).Name() != f {
		t.Errorf("WriteFile.Name %.40q..., want the long path", w.(*WriteFile).Name())
	}
	w.Close()
	perm := uint32(0o600)
	if st, err := p.SetAttr(ctx, f, fs.AttrChange{Perm: &perm}); err != nil || st.Perm != 0o600 || st.Size != 5 {
		t.Fatalf("chmod: %v %+v", err, st)
	}
	if err := p.Link(ctx, f, g); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Stat(ctx, g); err != nil || st.Nlink != 2 {
		t.Fatalf("stat of the link: %v %+v", err, st)
	}
	if err := p.Rename(ctx, g, h); err != nil {
		t.Fatal(err)
	}
	if err := p.Symlink(ctx, "f", g); err != nil {
		t.Fatal(err)
	}
	if tgt, err := p.Readlink(ctx, g); err != nil || tgt != "f" {
		t.Fatalf("readlink: %q %v", tgt, err)
	}
	if err := p.Truncate(ctx, h, 2); err != nil {
		t.Fatal(err)
	}
	r, err := p.Open(ctx, f, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, _ := r.ReadAt(buf, 0); string(buf[:n]) != "he" || r.Name() != f {
		t.Fatalf("read %q, name ok %v", buf[:n], r.Name() == f)
	}
	r.Close()
	ents, err := p.List(ctx, dir)
	if err != nil || len(ents) != 3 {
		t.Fatalf("list: %v %d entries", err, len(ents))
	}
	if _, err := p.StatFS(ctx, dir); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{f, g, h} {
		if err := p.Remove(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Stat(ctx, f); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat after remove: %v", err)
	}
}
