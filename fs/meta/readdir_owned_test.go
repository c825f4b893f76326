package meta

import (
	"context"
	"testing"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/kv"
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

// A listing of entries with stored owners is one range read: the entry
// carries copies of the mode and owner (before, each such entry cost an
// inode read, and a 5,000-entry listing 5,000 of them). Shown by listing
// a directory whose inode records are gone. The names of a hard-linked
// file are the exception: a chmod through one name leaves the other's
// copies stale, so those entries are read from the inode.
func TestReaddirOwnedNeedsNoInodeRead(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	o := &fs.Owner{Perm: 0o600, Uid: 1001, Gid: 1002}
	if _, err := s.Mkdir(ctx, "", "/d", true, nil); err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, p := range []string{"/d/a", "/d/b"} {
		n, err := s.Create(ctx, "", p, true, o)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, n.ID)
	}
	if err := s.store.Update(ctx, func(tx kv.Txn) error {
		for _, id := range ids {
			tx.Delete(inodeKey(id))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ents, err := s.Readdir(ctx, "/d")
	if err != nil || len(ents) != 2 {
		t.Fatalf("readdir without inode records: %v %+v", err, ents)
	}
	for _, e := range ents {
		if !e.Owned || e.Perm != 0o600 || e.Uid != 1001 || e.Gid != 1002 {
			t.Errorf("entry %+v: want owned 0600 1001:1002 from the entry's copy", e)
		}
	}

	// Hard links: chmod through the second name shows under the first.
	if _, err := s.Create(ctx, "", "/d/h", true, o); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mkdir(ctx, "", "/e", true, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, "", "/d/h", "/e/h2"); err != nil {
		t.Fatal(err)
	}
	perm := uint32(0o644)
	if _, err := s.SetAttr(ctx, "/e/h2", AttrChange{Perm: &perm}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"/d", "/e"} {
		ents, err := s.Readdir(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if (e.Name == "h" || e.Name == "h2") && e.Perm != 0o644 {
				t.Errorf("%s/%s after chmod through the other name: perm %o, want 644", dir, e.Name, e.Perm)
			}
		}
	}
}
