package meta

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/proto"
)

// recChunks stands in for the data plane in the metadata unit tests: a
// fixed chain table, and a record of the removals the collector asks for.
// (The real data plane is exercised by the clusterfs end-to-end tests.)
type recChunks struct {
	mu      sync.Mutex
	removed map[uint64][]proto.ChainID // inode -> chains removed from
	cut     map[uint64]int64           // inode -> truncated chunk length
}

func (r *recChunks) Chains() []proto.ChainID { return []proto.ChainID{1, 2, 3, 4, 5, 6} }
func (r *recChunks) ChunkSize() int64        { return 1 << 20 }
func (r *recChunks) RemoveChunks(ctx context.Context, chain proto.ChainID, inode, from uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.removed == nil {
		r.removed = map[uint64][]proto.ChainID{}
	}
	r.removed[inode] = append(r.removed[inode], chain)
	return nil
}
func (r *recChunks) TruncateChunk(ctx context.Context, chain proto.ChainID, id proto.ChunkID, n int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cut == nil {
		r.cut = map[uint64]int64{}
	}
	r.cut[id.Inode] = n
	return nil
}

func newTestService(t *testing.T, store kv.Store) (*Service, *recChunks) {
	t.Helper()
	if store == nil {
		store = memkv.New(memkv.Options{})
	}
	ch := &recChunks{}
	s, err := NewService(context.Background(), Options{Store: store, Chunks: ch, Stripe: 4})
	if err != nil {
		t.Fatal(err)
	}
	return s, ch
}

func TestSchemaDocInSync(t *testing.T) {
	doc, err := os.ReadFile("../../docs/meta-schema.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range Schema {
		row := "| " + r.Key + " | " + r.Value + " |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/meta-schema.md lacks the row\n%s", row)
		}
	}
	rows := strings.Count(string(doc), "\n| ") - 1 // minus the header row
	if rows != len(Schema) {
		t.Errorf("docs/meta-schema.md has %d schema rows, keys.go has %d", rows, len(Schema))
	}
	// Every prefix constant is documented.
	for _, p := range []string{prefixInode, prefixDentry, prefixSession, prefixIdem, prefixGC, prefixServer, keyInodeAlloc} {
		found := false
		for _, r := range Schema {
			if strings.HasPrefix(r.Key, p) {
				found = true
			}
		}
		if !found {
			t.Errorf("prefix %s has no Schema row", p)
		}
	}
}

func names(es []Entry) string {
	var b []string
	for _, e := range es {
		n := e.Name
		if e.IsDir {
			n += "/"
		}
		b = append(b, n)
	}
	return strings.Join(b, ",")
}

func TestPOSIXSemantics(t *testing.T) {
	ctx := context.Background()
	s, ch := newTestService(t, nil)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Mkdir(ctx, "", "/a/b", false, nil)
	if !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("mkdir without parent: %v", err)
	}
	_, err = s.Mkdir(ctx, "", "/a/b/c", true, nil)
	must(err)
	if _, err := s.Mkdir(ctx, "", "/a", false, nil); !errors.Is(err, iofs.ErrExist) {
		t.Fatalf("mkdir of an existing dir: %v", err)
	}
	f, err := s.Create(ctx, "", "/a/f", true, nil)
	must(err)
	if len(f.Layout.Chains) != 4 || f.Layout.ChunkSize != 1<<20 {
		t.Fatalf("layout %+v", f.Layout)
	}
	if _, err := s.Create(ctx, "", "/a/f", true, nil); !errors.Is(err, iofs.ErrExist) {
		t.Fatalf("exclusive create of an existing file: %v", err)
	}
	if _, err := s.Create(ctx, "", "/a/f/x", false, nil); !errors.Is(err, ErrNotDir) {
		t.Fatalf("create under a file: %v", err)
	}
	// rmdir of a non-empty directory fails; of an empty one works.
	if err := s.Remove(ctx, "", "/a/b"); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("rmdir non-empty: %v", err)
	}
	must(s.Remove(ctx, "", "/a/b/c"))
	must(s.Remove(ctx, "", "/a/b"))
	if _, err := s.Stat(ctx, "/a/b"); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("stat removed dir: %v", err)
	}
	// Rename over an existing file replaces it atomically; the old one is
	// collected (it has bytes: an empty one has no chunks to collect).
	_, err = s.Extend(ctx, f.ID, 10, 0, "")
	must(err)
	g, err := s.Create(ctx, "", "/a/g", true, nil)
	must(err)
	_, err = s.Extend(ctx, g.ID, 100, 0, "")
	must(err)
	must(s.Rename(ctx, "", "/a/g", "/a/f", 0))
	st, err := s.Stat(ctx, "/a/f")
	must(err)
	if st.ID != g.ID || st.Size != 100 {
		t.Fatalf("after rename over: %+v", st)
	}
	es, err := s.Readdir(ctx, "/a")
	must(err)
	if names(es) != "f" || es[0].Size != 100 {
		t.Fatalf("readdir: %s %+v", names(es), es)
	}
	gs, err := s.CollectGarbage(ctx, 0)
	must(err)
	if gs.Files != 1 || len(ch.removed[f.ID]) != 4 {
		t.Fatalf("GC of the replaced file: %+v, removed %v", gs, ch.removed)
	}
	if _, err := s.StatInode(ctx, f.ID); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("replaced inode still there: %v", err)
	}
	// A directory cannot move under itself.
	_, err = s.Mkdir(ctx, "", "/d1/d2/d3", true, nil)
	must(err)
	if err := s.Rename(ctx, "", "/d1", "/d1/d2/d3/x", 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("rename under itself: %v", err)
	}
	if err := s.Rename(ctx, "", "/d1", "/d1", 0); err != nil {
		t.Fatalf("rename onto itself: %v", err)
	}
	// dir over non-empty dir fails, over file fails, file over dir fails.
	_, err = s.Mkdir(ctx, "", "/e", false, nil)
	must(err)
	if err := s.Rename(ctx, "", "/e", "/d1", 0); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("dir over non-empty dir: %v", err)
	}
	if err := s.Rename(ctx, "", "/e", "/a/f", 0); !errors.Is(err, ErrNotDir) {
		t.Fatalf("dir over file: %v", err)
	}
	if err := s.Rename(ctx, "", "/a/f", "/e", 0); !errors.Is(err, ErrIsDir) {
		t.Fatalf("file over dir: %v", err)
	}
	must(s.Rename(ctx, "", "/d1/d2/d3", "/e2", 0))
	must(s.Rename(ctx, "", "/e2", "/e", 0)) // dir over empty dir
	// Truncate shrinks and queues nothing left behind.
	_, err = s.Extend(ctx, g.ID, 5<<20, 0, "")
	must(err)
	tr, err := s.Truncate(ctx, "/a/f", 1<<20+10, "")
	must(err)
	if tr.Size != 1<<20+10 || ch.cut[g.ID] != 10 || tr.TruncVer != 1 {
		t.Fatalf("truncate: %+v cut=%v", tr, ch.cut)
	}
	// A length report from before the truncate is ignored.
	n, err := s.Extend(ctx, g.ID, 4<<20, 0, "")
	must(err)
	if n.Size != 1<<20+10 {
		t.Fatalf("stale extend changed the size to %d", n.Size)
	}
	if err := s.Remove(ctx, "", "/"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("remove /: %v", err)
	}
	if _, err := s.Stat(ctx, "relative"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("relative path: %v", err)
	}
}

func TestBeginCommitAbandon(t *testing.T) {
	ctx := context.Background()
	s, ch := newTestService(t, nil)
	if _, _, err := s.BeginFile(ctx, "/nodir/x", "c", nil); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("begin in a missing dir: %v", err)
	}
	n, sid, err := s.BeginFile(ctx, "/x", "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, "/x"); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("an uncommitted file is visible: %v", err)
	}
	if _, err := s.CommitFile(ctx, "r1", "/x", n.ID, sid, 42); err != nil {
		t.Fatal(err)
	}
	// The same request again (a retry) is not an error and changes nothing.
	again, err := s.CommitFile(ctx, "r1", "/x", n.ID, sid, 42)
	if err != nil || again.ID != n.ID {
		t.Fatalf("retried commit: %+v %v", again, err)
	}
	// A second commit over it replaces it atomically.
	m, sid2, _ := s.BeginFile(ctx, "/x", "c", nil)
	if _, err := s.CommitFile(ctx, "r2", "/x", m.ID, sid2, 7); err != nil {
		t.Fatal(err)
	}
	st, _ := s.Stat(ctx, "/x")
	if st.ID != m.ID || st.Size != 7 {
		t.Fatalf("after replace: %+v", st)
	}
	// Abandon: collected.
	a, sid3, _ := s.BeginFile(ctx, "/y", "c", nil)
	if err := s.AbandonFile(ctx, a.ID, sid3); err != nil {
		t.Fatal(err)
	}
	gs, err := s.CollectGarbage(ctx, 0)
	if err != nil || gs.Files != 2 {
		t.Fatalf("GC: %+v %v", gs, err)
	}
	if len(ch.removed[n.ID]) == 0 || len(ch.removed[a.ID]) == 0 {
		t.Fatalf("chunks of the replaced and the abandoned file not removed: %v", ch.removed)
	}
}

// A removed file that a writer still has open is not collected until the
// session ends.
func TestGCWaitsForSessions(t *testing.T) {
	ctx := context.Background()
	s, ch := newTestService(t, nil)
	f, _ := s.Create(ctx, "", "/f", true, nil)
	_, sid, err := s.OpenWrite(ctx, "", "/f", "c", false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "", "/f"); err != nil {
		t.Fatal(err)
	}
	gs, _ := s.CollectGarbage(ctx, 0)
	if gs.Deferred != 1 || len(ch.removed[f.ID]) != 0 {
		t.Fatalf("collected a file still open: %+v", gs)
	}
	if _, err := s.CloseSession(ctx, f.ID, sid, 10, 0); err != nil {
		t.Fatal(err)
	}
	gs, _ = s.CollectGarbage(ctx, 0)
	if gs.Files != 1 || len(ch.removed[f.ID]) == 0 {
		t.Fatalf("not collected after close: %+v", gs)
	}
}

// Concurrent writers report their ends; the length is the largest.
func TestLengthIsMaxAcknowledgedEnd(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	f, _ := s.Create(ctx, "", "/f", true, nil)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if _, err := s.Extend(ctx, f.ID, int64(w*1000+i), 0, ""); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	st, _ := s.Stat(ctx, "/f")
	if st.Size != 7019 {
		t.Fatalf("size %d, want 7019", st.Size)
	}
	es, _ := s.Readdir(ctx, "/")
	if es[0].Size != 7019 {
		t.Fatalf("listing size %d", es[0].Size)
	}
}

func TestConcurrentCreatesOneWins(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	for round := 0; round < 10; round++ {
		name := fmt.Sprintf("/f%d", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins, exists := 0, 0
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.Create(ctx, "", name, true, nil)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins++
				case errors.Is(err, iofs.ErrExist):
					exists++
				default:
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if wins != 1 || exists != 3 {
			t.Fatalf("%s: %d wins, %d ErrExist", name, wins, exists)
		}
	}
}

// Two renames that would each be fine alone but together make a cycle
// (a under b, b under a): at most one succeeds, and the tree stays a tree.
func TestConcurrentRenamesNoCycle(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	for round := 0; round < 20; round++ {
		a, b := fmt.Sprintf("/r%d/a", round), fmt.Sprintf("/r%d/b", round)
		if _, err := s.Mkdir(ctx, "", a, true, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Mkdir(ctx, "", b, false, nil); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		wg.Add(2)
		go func() { defer wg.Done(); errs[0] = s.Rename(ctx, "", a, b+"/a", 0) }()
		go func() { defer wg.Done(); errs[1] = s.Rename(ctx, "", b, a+"/b", 0) }()
		wg.Wait()
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
			} else if !errors.Is(err, ErrInvalid) && !errors.Is(err, iofs.ErrNotExist) {
				t.Fatalf("unexpected: %v", err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d renames succeeded (%v)", round, ok, errs)
		}
		checkTree(t, s)
	}
}

// checkTree walks the store: every directory reaches the root through
// parent pointers, every entry names a live inode whose parent and name
// point back, every directory's link count is 2 + its subdirectories, and
// no unreachable directory exists.
func checkTree(t *testing.T, s *Service) {
	t.Helper()
	ctx := context.Background()
	reach := map[uint64]bool{RootInode: true}
	var walkDir func(id uint64, path string)
	walkDir = func(id uint64, path string) {
		err := s.store.View(ctx, func(tx kv.ReadTxn) error {
			p := dentryPrefix(id)
			kvs, err := tx.Range(ctx, p, kv.PrefixEnd(p), 0)
			if err != nil {
				return err
			}
			dir, err := getInode(ctx, tx, id)
			if err != nil {
				return fmt.Errorf("directory %s: %v", path, err)
			}
			subdirs := 0
			for _, e := range kvs {
				if d, err := decodeDentry(e.Value); err == nil && d.IsDir {
					subdirs++
				}
			}
			if dir.Nlink != 2+subdirs {
				return fmt.Errorf("directory %s/: link count %d, want 2 + %d subdirectories", path, dir.Nlink, subdirs)
			}
			for _, e := range kvs {
				name, _ := dentryName(e.Key)
				d, err := decodeDentry(e.Value)
				if err != nil {
					return fmt.Errorf("bad dentry %s/%s: %v", path, name, err)
				}
				n, err := getInode(ctx, tx, d.Inode)
				if err != nil {
					return fmt.Errorf("%s/%s: %v", path, name, err)
				}
				if n.Parent != id || n.Name != name {
					return fmt.Errorf("%s/%s: inode says parent %d name %q", path, name, n.Parent, n.Name)
				}
				if reach[n.ID] {
					return fmt.Errorf("%s/%s: inode %d reached twice (cycle or hard link)", path, name, n.ID)
				}
				reach[n.ID] = true
				if n.IsDir() {
					defer walkDir(n.ID, path+"/"+name)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	walkDir(RootInode, "")
	// Every directory inode is reachable.
	s.store.View(ctx, func(tx kv.ReadTxn) error {
		p := []byte(prefixInode)
		kvs, _ := tx.Range(ctx, p, kv.PrefixEnd(p), 0)
		for _, e := range kvs {
			var n Inode
			getJSON(ctx, staticReader{e.Value}, nil, &n)
			if n.IsDir() && !reach[n.ID] {
				t.Fatalf("directory inode %d (%q) is unreachable", n.ID, n.Name)
			}
		}
		return nil
	})
}

type staticReader struct{ v []byte }

func (r staticReader) Get(context.Context, []byte) ([]byte, bool, error) { return r.v, true, nil }

// Writers that died (sessions never renewed) leave unpublished files; the
// collector ends their sessions and removes their chunks, a page per pass,
// covering a queue longer than a page.
func TestGCExpiredSessionsPaged(t *testing.T) {
	ctx := context.Background()
	ch := &recChunks{}
	s, err := NewService(ctx, Options{Store: memkv.New(memkv.Options{}), Chunks: ch, SessionTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for i := 0; i < 10; i++ {
		n, _, err := s.BeginFile(ctx, fmt.Sprintf("/dead%d", i), "gone", nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, n.ID)
	}
	time.Sleep(5 * time.Millisecond)
	for pass := 0; pass < 12; pass++ {
		if _, err := s.CollectGarbage(ctx, 3); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if len(ch.removed[id]) == 0 {
			t.Errorf("chunks of dead writer's inode %d not removed", id)
		}
		if _, err := s.StatInode(ctx, id); !errors.Is(err, iofs.ErrNotExist) {
			t.Errorf("inode %d still there: %v", id, err)
		}
	}
}

// The same with the cycle closing deeper in the tree: a moves under
// b/c/d while b moves under a/x. Only the ancestor walk's conflict-checked
// reads (not the parents') make one of them fail.
func TestConcurrentDeepRenamesNoCycle(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	for round := 0; round < 30; round++ {
		r := fmt.Sprintf("/d%d", round)
		for _, p := range []string{r + "/a/x", r + "/b/c/d"} {
			if _, err := s.Mkdir(ctx, "", p, true, nil); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		wg.Add(2)
		go func() { defer wg.Done(); <-start; errs[0] = s.Rename(ctx, "", r+"/a", r+"/b/c/d/a", 0) }()
		go func() { defer wg.Done(); <-start; errs[1] = s.Rename(ctx, "", r+"/b", r+"/a/x/b", 0) }()
		close(start)
		wg.Wait()
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
			} else if !errors.Is(err, ErrInvalid) && !errors.Is(err, iofs.ErrNotExist) {
				t.Fatalf("unexpected: %v", err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d renames succeeded (%v)", round, ok, errs)
		}
	}
	checkTree(t, s)
}
