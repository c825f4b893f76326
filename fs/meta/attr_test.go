package meta

import (
	"context"
	"errors"
	iofs "io/fs"
	"testing"
)

// SetAttr stores permission bits and owner; what it does not change
// keeps the defaults (or the earlier values), and a rename keeps them.
func TestSetAttrStoresModeAndOwner(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	if _, err := s.Create(ctx, "", "/f", true, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mkdir(ctx, "", "/d", false, nil); err != nil {
		t.Fatal(err)
	}
	n, err := s.Stat(ctx, "/f")
	if err != nil || n.Owned {
		t.Fatalf("a new file has stored attributes: %v %+v", err, n)
	}
	perm, uid := uint32(0o100600), uint32(1234) // type bits are dropped
	if _, err := s.SetAttr(ctx, "/f", AttrChange{Perm: &perm, Uid: &uid}); err != nil {
		t.Fatal(err)
	}
	gid := uint32(77)
	if _, err := s.SetAttr(ctx, "/d", AttrChange{Gid: &gid}); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename(ctx, "", "/f", "/d/g", 0); err != nil {
		t.Fatal(err)
	}
	n, err = s.Stat(ctx, "/d/g")
	if err != nil || !n.Owned || n.Perm != 0o600 || n.Uid != 1234 || n.Gid != 0 {
		t.Fatalf("file after chmod, chown, rename: %v %+v", err, n)
	}
	n, err = s.Stat(ctx, "/d")
	if err != nil || !n.Owned || n.Perm != 0o755 || n.Uid != 0 || n.Gid != 77 {
		t.Fatalf("directory after chgrp: %v %+v", err, n)
	}
	if _, err := s.SetAttr(ctx, "/nope", AttrChange{Perm: &perm}); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("SetAttr of a missing path: %v", err)
	}
}
