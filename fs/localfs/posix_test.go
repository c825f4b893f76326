package localfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
)

// POSIX describes symlinks as themselves, passes links, special files,
// xattrs, renameat2 and attributes through, and gives new nodes the mode
// in their context.
func TestPOSIXPassThrough(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	p := NewPOSIX()
	f, g, l := filepath.Join(d, "f"), filepath.Join(d, "g"), filepath.Join(d, "l")
	o := fs.WithOwner(ctx, fs.Owner{Perm: 0o640, Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())})
	w, err := p.OpenWrite(o, f, fs.OCreate)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if st, err := p.Stat(ctx, f); err != nil || st.Perm != 0o640 || !st.HasOwner || st.Nlink != 1 {
		t.Fatalf("new file: %v %+v", err, st)
	}
	if err := p.Symlink(ctx, "f", l); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Stat(ctx, l); err != nil || st.Kind != fs.KindSymlink {
		t.Fatalf("symlink: %v %+v", err, st)
	}
	if target, err := p.Readlink(ctx, l); err != nil || target != "f" {
		t.Fatalf("readlink: %q %v", target, err)
	}
	if err := p.Link(ctx, f, g); err != nil {
		t.Fatal(err)
	}
	if err := p.Mknod(o, filepath.Join(d, "fifo"), fs.KindFIFO, 0); err != nil {
		t.Fatal(err)
	}
	ents, err := p.List(ctx, d)
	if err != nil || len(ents) != 4 || ents[0].Name != "f" || ents[0].Nlink != 2 || ents[1].Kind != fs.KindFIFO || ents[3].Kind != fs.KindSymlink {
		t.Fatalf("list: %v %+v", err, ents)
	}
	if err := p.RenameFlags(ctx, f, g, fs.RenameNoReplace); !errors.Is(err, os.ErrExist) {
		t.Fatalf("RENAME_NOREPLACE over a name: %v", err)
	}
	if err := p.RenameFlags(ctx, f, l, fs.RenameExchange); err != nil {
		t.Fatal(err)
	}
	if st, _ := p.Stat(ctx, f); st.Kind != fs.KindSymlink {
		t.Fatalf("after exchange f is %+v", st)
	}
	mt := time.Unix(1_234_567_890, 123)
	perm := uint32(0o600)
	if st, err := p.SetAttr(ctx, g, fs.AttrChange{Perm: &perm, MTime: &mt}); err != nil || st.Perm != 0o600 || !st.ModTime.Equal(mt) {
		t.Fatalf("setattr: %v %+v", err, st)
	}
	dangling := filepath.Join(d, "dangling")
	if err := p.Symlink(ctx, "nowhere", dangling); err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Geteuid())
	if st, err := p.SetAttr(ctx, dangling, fs.AttrChange{Uid: &uid, MTime: &mt}); err != nil || st.Kind != fs.KindSymlink || !st.ModTime.Equal(mt) {
		t.Fatalf("setattr of a dangling symlink: %v %+v", err, st)
	}
	if err := p.SetXattr(ctx, g, "user.k", []byte("v"), 0); err != nil {
		t.Skipf("no user xattrs on %s: %v", d, err)
	}
	if v, err := p.GetXattr(ctx, g, "user.k"); err != nil || string(v) != "v" {
		t.Fatalf("getxattr: %q %v", v, err)
	}
	if names, err := p.ListXattr(ctx, g); err != nil || len(names) != 1 || names[0] != "user.k" {
		t.Fatalf("listxattr: %v %v", names, err)
	}
	if err := p.RemoveXattr(ctx, g, "user.k"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.GetXattr(ctx, g, "user.k"); !errors.Is(err, fs.ErrNoAttr) {
		t.Fatalf("getxattr of a removed attribute: %v", err)
	}
}
