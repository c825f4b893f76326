package meta

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
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

// A listing of entries with stored owners is one range read: the entry
// carries copies of the mode and owner (before, each such entry cost an
// inode read, and a 5,000-entry listing 5,000 of them). Shown by listing
// a directory whose inode records are gone. The names of a hard-linked
// file are the exception: a chmod through one name leaves the other's
// copies stale, so those entries are read from the inode.
func TestReaddirOwnedNeedsNoInodeRead(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	s.opts.ListLayouts = -1 // layouts of a small directory's files are read from the inodes
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

// updateCounter counts the transactions that ran on a store.
type updateCounter struct {
	kv.Store
	n atomic.Int64
}

func (u *updateCounter) Update(ctx context.Context, fn func(tx kv.Txn) error) error {
	u.n.Add(1)
	return u.Store.Update(ctx, fn)
}

// open(O_CREAT) of a new file through a mount and its close are one
// transaction each (each is a durable commit: two fewer than the create,
// session, length and session-end transactions they were), and they
// leave what they did before: a file with holes allowed, a session while
// open, none after.
func TestOpenCreateAndCloseAreOneTransactionEach(t *testing.T) {
	ctx := context.Background()
	st := &updateCounter{Store: memkv.New(memkv.Options{})}
	s, _ := newTestService(t, st)
	if _, err := s.Mkdir(ctx, "", "/d", true, nil); err != nil {
		t.Fatal(err)
	}
	before := st.n.Load()
	n, sid, err := s.OpenWrite(ctx, "r1", "/d/f", "c1", true, true, &fs.Owner{Perm: 0o640})
	if err != nil || sid == "" {
		t.Fatalf("open create: %v %q", err, sid)
	}
	if got := st.n.Load() - before; got != 1 {
		t.Errorf("open(O_CREAT) ran %d transactions, want 1", got)
	}
	if !n.Holes || !n.Owned || n.Perm != 0o640 {
		t.Errorf("created inode %+v: want holes allowed and owner stored", n)
	}
	// A retry of the same request returns the same file and session.
	if n2, sid2, err := s.OpenWrite(ctx, "r1", "/d/f", "c1", true, true, nil); err != nil || n2.ID != n.ID || sid2 != sid {
		t.Errorf("retried open create: %v inode %v session %q, want %d %q", err, n2, sid2, n.ID, sid)
	}
	if _, _, err := s.OpenWrite(ctx, "r2", "/d/f", "c1", true, true, nil); !errors.Is(err, iofs.ErrExist) {
		t.Errorf("second exclusive create: %v, want ErrExist", err)
	}
	before = st.n.Load()
	if _, err := s.CloseSession(ctx, n.ID, sid, 4096, n.TruncVer); err != nil {
		t.Fatal(err)
	}
	if got := st.n.Load() - before; got != 1 {
		t.Errorf("close ran %d transactions, want 1", got)
	}
	got, err := s.Stat(ctx, "/d/f")
	if err != nil || got.Size != 4096 {
		t.Fatalf("after close: %v %+v, want size 4096", err, got)
	}
	if err := s.store.View(ctx, func(tx kv.ReadTxn) error {
		p := sessionPrefix(n.ID)
		kvs, err := tx.Range(ctx, p, kv.PrefixEnd(p), 0)
		if err == nil && len(kvs) != 0 {
			err = fmt.Errorf("%d sessions left after close", len(kvs))
		}
		return err
	}); err != nil {
		t.Error(err)
	}
	ents, err := s.Readdir(ctx, "/d")
	if err != nil || len(ents) != 1 || ents[0].Size != 4096 {
		t.Errorf("listing after close: %v %+v, want f with size 4096", err, ents)
	}
}

// An empty file created without a write session has no chunks: its unlink
// queues nothing for the collector and removes the inode at once. A file
// opened for writing (holes allowed) is collected as before.
func TestUnlinkEmptyFileNeedsNoCollection(t *testing.T) {
	ctx := context.Background()
	s, ch := newTestService(t, nil)
	e, err := s.Create(ctx, "", "/e", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, sid, err := s.OpenWrite(ctx, "", "/w", "c", true, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseSession(ctx, w.ID, sid, 0, 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/e", "/w"} {
		if err := s.Remove(ctx, "", p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.StatInode(ctx, e.ID); !errors.Is(err, iofs.ErrNotExist) {
		t.Errorf("inode of the removed empty file: %v, want gone at once", err)
	}
	gs, err := s.CollectGarbage(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if gs.Files != 1 || len(ch.removed[e.ID]) != 0 || len(ch.removed[w.ID]) == 0 {
		t.Errorf("collection: %+v, removed %v: want only the file opened for writing", gs, ch.removed)
	}
}
