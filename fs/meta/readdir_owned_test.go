package meta

import (
	"context"
	"testing"
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
