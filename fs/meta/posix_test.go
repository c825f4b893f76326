package meta

import (
	"context"
	"errors"
	iofs "io/fs"
	"strings"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv/memkv"

	"github.com/ffkit/ffkit/fs"
)

// New nodes take the owner given; a setgid directory passes its group on.
func TestOwnerOnCreate(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	d, err := s.Mkdir(ctx, "", "/d", false, &fs.Owner{Perm: 0o2775, Uid: 10, Gid: 20})
	if err != nil || !d.Owned || d.Perm != 0o2775 || d.Uid != 10 || d.Gid != 20 || d.CTime == 0 || d.ATime == 0 {
		t.Fatalf("mkdir: %v %+v", err, d)
	}
	f, err := s.Create(ctx, "", "/d/f", true, &fs.Owner{Perm: 0o600, Uid: 30, Gid: 40})
	if err != nil || f.Perm != 0o600 || f.Uid != 30 || f.Gid != 20 {
		t.Fatalf("create in a setgid directory: %v %+v", err, f)
	}
	sub, err := s.Mkdir(ctx, "", "/d/sub", false, &fs.Owner{Perm: 0o755, Uid: 30, Gid: 40})
	if err != nil || sub.Perm != 0o2755 || sub.Gid != 20 {
		t.Fatalf("mkdir in a setgid directory: %v %+v", err, sub)
	}
	n, _, err := s.BeginFile(ctx, "/d/g", "c", &fs.Owner{Perm: 0o640, Uid: 1, Gid: 2})
	if err != nil || n.Perm != 0o640 || n.Uid != 1 || n.Gid != 20 {
		t.Fatalf("begin file: %v %+v", err, n)
	}
}

// Symlinks, FIFOs and devices are metadata-only inodes whose type the
// listing carries; hard links count and survive the removal of a name.
func TestNodeTypesAndLinks(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	if _, err := s.Mknod(ctx, "", "/l", TypeSymlink, "target/x", 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mknod(ctx, "", "/p", TypeFIFO, "", 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mknod(ctx, "", "/c", TypeChar, "", 0x0501, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mknod(ctx, "", "/c", TypeBlock, "", 1, nil); !errors.Is(err, iofs.ErrExist) {
		t.Fatalf("mknod over an existing name: %v", err)
	}
	l, err := s.Stat(ctx, "/l")
	if err != nil || l.Type != TypeSymlink || l.Target != "target/x" || l.Size != 8 || l.Layout != nil {
		t.Fatalf("symlink: %v %+v", err, l)
	}
	ents, err := s.Readdir(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]Type{}
	for _, e := range ents {
		types[e.Name] = e.Type
	}
	if types["l"] != TypeSymlink || types["p"] != TypeFIFO || types["c"] != TypeChar {
		t.Fatalf("listing types: %v", types)
	}
	if _, err := s.Create(ctx, "", "/f", true, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, "", "/f", "/g"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, "", "/", "/h"); !errors.Is(err, ErrNotPermitted) {
		t.Fatalf("link of a directory: %v", err)
	}
	f, _ := s.Stat(ctx, "/f")
	g, _ := s.Stat(ctx, "/g")
	if f.ID != g.ID || g.Nlink != 2 {
		t.Fatalf("link: %+v %+v", f, g)
	}
	if err := s.Remove(ctx, "", "/f"); err != nil {
		t.Fatal(err)
	}
	g, err = s.Stat(ctx, "/g")
	if err != nil || g.Nlink != 1 || g.Parent == 0 {
		t.Fatalf("after removing one name: %v %+v", err, g)
	}
	// The remaining name grows with the file (the dentry copy follows it
	// once it is the inode's name again after a rename).
	if err := s.Rename(ctx, "", "/g", "/g2", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Extend(ctx, g.ID, 100, g.TruncVer, ""); err != nil {
		t.Fatal(err)
	}
	ents, _ = s.Readdir(ctx, "/")
	for _, e := range ents {
		if e.Name == "f" {
			t.Fatalf("a removed name came back: %+v", ents)
		}
		if e.Name == "g2" && e.Size != 100 {
			t.Fatalf("entry size %d, want 100", e.Size)
		}
	}
	if err := s.Remove(ctx, "", "/g2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StatInode(ctx, g.ID); err != nil {
		t.Fatalf("the last unlink collects the inode through GC, not at once: %v", err)
	}
}

func TestRenameFlags(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	for _, p := range []string{"/a", "/b"} {
		if _, err := s.Create(ctx, "", p, true, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Mkdir(ctx, "", "/d/e", true, nil); err != nil {
		t.Fatal(err)
	}
	a, _ := s.Stat(ctx, "/a")
	if err := s.Rename(ctx, "", "/a", "/b", fs.RenameNoReplace); !errors.Is(err, iofs.ErrExist) {
		t.Fatalf("noreplace: %v", err)
	}
	if err := s.Rename(ctx, "", "/a", "/c", fs.RenameNoReplace); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename(ctx, "", "/c", "/nope", fs.RenameExchange); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("exchange with nothing: %v", err)
	}
	if err := s.Rename(ctx, "", "/c", "/d", fs.RenameExchange); err != nil {
		t.Fatal(err)
	}
	c, _ := s.Stat(ctx, "/d")
	d, _ := s.Stat(ctx, "/c/e")
	if c == nil || c.ID != a.ID || d == nil {
		t.Fatalf("exchange: %+v %+v", c, d)
	}
	if err := s.Rename(ctx, "", "/c", "/c/e", fs.RenameExchange); !errors.Is(err, ErrInvalid) {
		t.Fatalf("exchange of a directory with its child: %v", err)
	}
}

// A directory's link count is 2 + its subdirectories, through mkdir,
// rmdir, rename across parents (over an empty directory too) and
// RENAME_EXCHANGE of a directory with a file.
func TestDirLinkCount(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	nlink := func(p string) int {
		t.Helper()
		n, err := s.Stat(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return n.Nlink
	}
	want := func(step string, counts map[string]int) {
		t.Helper()
		for p, c := range counts {
			if got := nlink(p); got != c {
				t.Fatalf("%s: %s has link count %d, want %d", step, p, got, c)
			}
		}
	}
	for _, p := range []string{"/a/x/y", "/a/z", "/b"} {
		if _, err := s.Mkdir(ctx, "", p, true, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, "", "/a/f", true, nil); err != nil {
		t.Fatal(err)
	}
	want("mkdir", map[string]int{"/": 4, "/a": 4, "/a/x": 3, "/a/x/y": 2, "/b": 2})
	if err := s.Rename(ctx, "", "/a/x", "/b/x", 0); err != nil {
		t.Fatal(err)
	}
	want("rename across parents", map[string]int{"/a": 3, "/b": 3, "/b/x": 3})
	if err := s.Rename(ctx, "", "/b/x", "/b/x2", 0); err != nil {
		t.Fatal(err)
	}
	want("rename in one directory", map[string]int{"/b": 3})
	if err := s.Rename(ctx, "", "/a/z", "/b/x2/y", 0); err != nil {
		t.Fatal(err)
	}
	want("rename over an empty directory", map[string]int{"/a": 2, "/b/x2": 3})
	if err := s.Rename(ctx, "", "/a/f", "/b/x2", fs.RenameExchange); err != nil {
		t.Fatal(err)
	}
	want("exchange of a file and a directory", map[string]int{"/a": 3, "/b": 2, "/a/f": 3})
	if err := s.Remove(ctx, "", "/a/f/y"); err != nil {
		t.Fatal(err)
	}
	want("rmdir", map[string]int{"/a/f": 2, "/": 4})
	checkTree(t, s)
}

func TestSetAttrTimesAndXattrs(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	if _, err := s.Create(ctx, "", "/f", true, nil); err != nil {
		t.Fatal(err)
	}
	at, mt := int64(1_000_000_123), int64(2_000_000_456)
	n, err := s.SetAttr(ctx, "/f", AttrChange{ATime: &at, MTime: &mt})
	if err != nil || n.ATime != at || n.MTime != mt || n.CTime <= mt {
		t.Fatalf("times: %v %+v", err, n)
	}
	if _, err := s.Xattr(ctx, "/f", XattrSet, "user.a", []byte("1"), fs.XattrReplace); !errors.Is(err, ErrNoAttr) {
		t.Fatalf("replace of a missing attribute: %v", err)
	}
	if _, err := s.Xattr(ctx, "/f", XattrSet, "user.a", []byte("1"), fs.XattrCreate); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Xattr(ctx, "/f", XattrSet, "user.a", []byte("2"), fs.XattrCreate); !errors.Is(err, iofs.ErrExist) {
		t.Fatalf("create of an existing attribute: %v", err)
	}
	n, _ = s.Stat(ctx, "/f")
	if string(n.Xattrs["user.a"]) != "1" {
		t.Fatalf("xattrs %v", n.Xattrs)
	}
	if _, err := s.Xattr(ctx, "/f", XattrRemove, "user.a", nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Xattr(ctx, "/f", XattrRemove, "user.a", nil, 0); !errors.Is(err, ErrNoAttr) {
		t.Fatalf("remove twice: %v", err)
	}
	if _, err := s.Create(ctx, "", "/"+strings.Repeat("x", 256), true, nil); !errors.Is(err, ErrNameTooLong) {
		t.Fatalf("256-byte name: %v", err)
	}
	if _, err := s.Create(ctx, "", "/"+strings.Repeat("x", 255), true, nil); err != nil {
		t.Fatalf("255-byte name: %v", err)
	}
}

// Every POSIX call crosses the wire: the server knows the methods, the
// owner travels in the context, and errors keep their sentinels.
func TestPOSIXThroughServer(t *testing.T) {
	ctx := context.Background()
	svc, err := NewService(ctx, Options{Store: memkv.New(memkv.Options{}), Chunks: &recChunks{}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := StartServer(ctx, svc, ServerOptions{Token: "t", GCInterval: -1, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill()
	cl, err := NewClient(ClientOptions{Token: "t", Servers: []string{srv.Addr()}, RetryTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	octx := fs.WithOwner(ctx, fs.Owner{Perm: 0o600, Uid: 7, Gid: 8})
	f, err := cl.Create(octx, "/f", true)
	if err != nil || f.Uid != 7 || f.Gid != 8 || f.Perm != 0o600 {
		t.Fatalf("create: %v %+v", err, f)
	}
	if _, err := cl.Mknod(octx, "/l", TypeSymlink, "f", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Link(ctx, "/f", "/g"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Xattr(ctx, "/g", XattrSet, "user.x", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Xattr(ctx, "/g", XattrRemove, "user.y", nil, 0); !errors.Is(err, fs.ErrNoAttr) {
		t.Fatalf("remove a missing xattr: %v", err)
	}
	mt := int64(42)
	if _, err := cl.SetAttr(ctx, "/f", AttrChange{MTime: &mt}); err != nil {
		t.Fatal(err)
	}
	if err := cl.RenameFlags(ctx, "/f", "/l", fs.RenameNoReplace); !errors.Is(err, iofs.ErrExist) {
		t.Fatalf("rename noreplace: %v", err)
	}
	if _, err := cl.Create(ctx, "/"+strings.Repeat("n", 300), true); !errors.Is(err, fs.ErrNameTooLong) {
		t.Fatalf("long name: %v", err)
	}
	n, err := cl.Stat(ctx, "/f")
	if err != nil || n.Nlink != 2 || n.MTime != 42 || string(n.Xattrs["user.x"]) != "v" {
		t.Fatalf("stat: %v %+v", err, n)
	}
}

// A directory's mtime and ctime follow changes of its entries; a later
// utimensat on it wins over earlier changes.
func TestDirTimes(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	d, err := s.Mkdir(ctx, "", "/d", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	stat := func() *Inode {
		t.Helper()
		n, err := s.Stat(ctx, "/d")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	last := d.MTime
	for _, op := range []func() error{
		func() error { _, err := s.Create(ctx, "", "/d/f", true, nil); return err },
		func() error { _, err := s.Link(ctx, "", "/d/f", "/d/g"); return err },
		func() error { return s.Rename(ctx, "", "/d/g", "/h", 0) },
		func() error { return s.Remove(ctx, "", "/d/f") },
	} {
		for nowNano() <= last {
		}
		if err := op(); err != nil {
			t.Fatal(err)
		}
		n := stat()
		if n.MTime <= last || n.CTime < n.MTime {
			t.Fatalf("directory times did not move: %d -> %+v", last, n)
		}
		last = n.MTime
	}
	mt := int64(12345)
	if _, err := s.SetAttr(ctx, "/d", AttrChange{MTime: &mt}); err != nil {
		t.Fatal(err)
	}
	if n := stat(); n.MTime != mt || n.CTime <= last {
		t.Fatalf("utimensat on the directory: %+v", n)
	}
}
