package meta

import (
	"context"
	"slices"
	"testing"

	"github.com/ffkit/ffkit/fs"
)

// A listing carries the stored mode and owner of the entries that have
// them (dentry flag "owned"), through chmod, a write's length update and
// a rename, and the defaults (Owned false) for the others.
func TestReaddirCarriesOwners(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	for _, p := range []string{"/d/a", "/d/b"} {
		if _, err := s.Mkdir(ctx, "", "/d", true, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Create(ctx, "", p, true, nil); err != nil {
			t.Fatal(err)
		}
	}
	perm, uid, gid := uint32(0o640), uint32(1001), uint32(1002)
	if _, err := s.SetAttr(ctx, "/d/a", AttrChange{Perm: &perm, Uid: &uid, Gid: &gid}); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename(ctx, "", "/d/a", "/d/c", 0); err != nil {
		t.Fatal(err)
	}
	ents, err := s.Readdir(ctx, "/d")
	if err != nil || len(ents) != 2 {
		t.Fatalf("readdir: %v %+v", err, ents)
	}
	b, c := ents[0], ents[1]
	if b.Name != "b" || b.Owned || b.Perm != 0 {
		t.Errorf("default-owned entry: %+v", b)
	}
	if c.Name != "c" || !c.Owned || c.Perm != 0o640 || c.Uid != 1001 || c.Gid != 1002 {
		t.Errorf("owned entry after chmod, chown and rename: %+v", c)
	}
}

// A listing carries what opening a file needs (layout, holes, length)
// for the entries whose inode it reads (owned ones), so that a mount
// answering lookups from it opens with no Stat; not for directories.
func TestReaddirCarriesLayouts(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	o := &fs.Owner{Perm: 0o644, Uid: 1, Gid: 1}
	if _, err := s.Mkdir(ctx, "", "/d/sub", true, o); err != nil {
		t.Fatal(err)
	}
	n, sid, err := s.BeginFile(ctx, "/d/f", "c", o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitFile(ctx, "r1", "/d/f", n.ID, sid, 4242); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "", "/d/plain", true, nil); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stat(ctx, "/d/f")
	if err != nil {
		t.Fatal(err)
	}
	ents, err := s.Readdir(ctx, "/d")
	if err != nil || len(ents) != 3 {
		t.Fatalf("readdir: %v %+v", err, ents)
	}
	f, plain, sub := ents[0], ents[1], ents[2]
	if f.Name != "f" || f.Layout == nil || f.Size != 4242 || f.Size != st.Size || f.Inode != st.ID ||
		f.Layout.ChunkSize != st.Layout.ChunkSize || !slices.Equal(f.Layout.Chains, st.Layout.Chains) || f.Holes != st.Holes {
		t.Errorf("owned file's entry %+v (layout %+v), stat %+v (layout %+v)", f, f.Layout, st, st.Layout)
	}
	if plain.Name != "plain" || plain.Layout != nil {
		t.Errorf("unowned file's entry carries a layout: %+v", plain)
	}
	if sub.Name != "sub" || sub.Layout != nil {
		t.Errorf("directory's entry carries a layout: %+v", sub)
	}
}
