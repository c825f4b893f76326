package meta

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
)

// tripStore counts the round trips a remote store (etcd) would make:
// each Prefetch call, each Range, and each point read of a key its
// transaction has not read before (etcdkv keeps a transaction's point
// reads).
type tripStore struct {
	kv.Store
	trips atomic.Int64
}

type tripTxn struct {
	kv.Txn
	s    *tripStore
	read map[string]bool
}

func (t *tripTxn) point(k []byte) {
	if !t.read[string(k)] {
		t.read[string(k)] = true
		t.s.trips.Add(1)
	}
}

func (t *tripTxn) Get(ctx context.Context, k []byte) ([]byte, bool, error) {
	t.point(k)
	return t.Txn.Get(ctx, k)
}

func (t *tripTxn) SnapshotGet(ctx context.Context, k []byte) ([]byte, bool, error) {
	t.point(k)
	return t.Txn.SnapshotGet(ctx, k)
}

func (t *tripTxn) Range(ctx context.Context, b, e []byte, limit int) ([]kv.KeyValue, error) {
	t.s.trips.Add(1)
	return t.Txn.Range(ctx, b, e, limit)
}

func (t *tripTxn) SnapshotRange(ctx context.Context, b, e []byte, limit int) ([]kv.KeyValue, error) {
	t.s.trips.Add(1)
	return t.Txn.SnapshotRange(ctx, b, e, limit)
}

func (t *tripTxn) Prefetch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	t.s.trips.Add(1)
	for _, k := range keys {
		t.read[string(k)] = true
	}
	return t.Txn.(kv.Prefetcher).Prefetch(ctx, keys)
}

// readTxn adapts a read-only transaction to tripTxn (its writes are never called).
type readTxn struct{ kv.ReadTxn }

func (readTxn) SnapshotGet(context.Context, []byte) ([]byte, bool, error) { panic("read only") }
func (readTxn) SnapshotRange(context.Context, []byte, []byte, int) ([]kv.KeyValue, error) {
	panic("read only")
}
func (readTxn) Set(_, _ []byte)         { panic("read only") }
func (readTxn) Delete([]byte)           { panic("read only") }
func (readTxn) DeleteRange(_, _ []byte) { panic("read only") }

type readPrefetcher struct {
	readTxn
	pf kv.Prefetcher
}

func (r readPrefetcher) Prefetch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	return r.pf.Prefetch(ctx, keys)
}

func (s *tripStore) Update(ctx context.Context, fn func(tx kv.Txn) error) error {
	return s.Store.Update(ctx, func(tx kv.Txn) error {
		return fn(&tripTxn{Txn: tx, s: s, read: map[string]bool{}})
	})
}

func (s *tripStore) View(ctx context.Context, fn func(tx kv.ReadTxn) error) error {
	return s.Store.View(ctx, func(tx kv.ReadTxn) error {
		return fn(&tripTxn{Txn: readPrefetcher{readTxn{tx}, tx.(kv.Prefetcher)}, s: s, read: map[string]bool{}})
	})
}

// An operation on a path reads its entries, its parent and the inode it
// names in one round trip once the directories are known (two while
// they are not), instead of one per read; a group of creates reads all
// of theirs together.
func TestPrefetchRoundTrips(t *testing.T) {
	ctx := context.Background()
	ts := &tripStore{Store: memkv.New(memkv.Options{})}
	g := &gateStore{Store: ts, gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	close(g.gate)
	s, _ := newTestService(t, g)
	s.group.max = 1
	for _, d := range []string{"/a", "/a/b", "/a/b/c"} {
		if _, err := s.Mkdir(ctx, "", d, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, "warm", "/a/b/c/f0", true, nil); err != nil {
		t.Fatal(err)
	}
	trips := func(what string, max int64, f func() error) {
		t.Helper()
		before := ts.trips.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := ts.trips.Load() - before; got > max {
			t.Errorf("%s: %d round trips, want at most %d", what, got, max)
		}
	}
	// Before: 5 (an entry per component, the inode, the first read).
	trips("stat", 1, func() error { _, err := s.Stat(ctx, "/a/b/c/f0"); return err })
	// Before: 6 (the request id, 3 entries, the parent, the new name).
	trips("create", 1, func() error { _, err := s.Create(ctx, "r1", "/a/b/c/f1", true, nil); return err })
	trips("remove", 2, func() error { return s.Remove(ctx, "r2", "/a/b/c/f0") })
	// A small directory's listing reads its owned files' inodes (for
	// their layouts) together. Before: 13 (3 entries, the range, 8 inodes, the first read).
	if _, err := s.Mkdir(ctx, "", "/a/b/c/o", false, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		if _, err := s.Create(ctx, "", fmt.Sprintf("/a/b/c/o/f%d", i), true, &fs.Owner{Perm: 0o644, Uid: 1, Gid: 1}); err != nil {
			t.Fatal(err)
		}
	}
	trips("list", 3, func() error {
		es, err := s.Readdir(ctx, "/a/b/c/o")
		if err == nil && (len(es) != 8 || es[0].Layout == nil) {
			err = fmt.Errorf("listing: %d entries, first %+v", len(es), es[0])
		}
		return err
	})

	// 16 creates in 4 directories queued behind a held commit: one group.
	for i := 0; i < 4; i++ {
		if _, err := s.Mkdir(ctx, "", fmt.Sprintf("/a/b/c/d%d", i), false, nil); err != nil {
			t.Fatal(err)
		}
	}
	gate := make(chan struct{})
	g.gate = gate
	select {
	case <-g.entered:
	default:
	}
	heldBefore := g.held.Load()
	first := make(chan error, 1)
	go func() {
		_, err := s.Create(ctx, "r-first", "/a/b/c/first", true, nil)
		first <- err
	}()
	<-g.entered
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("/a/b/c/d%d/f%d", i%4, i)
			_, errs[i] = s.Create(ctx, "r-"+name, name, true, nil)
		}()
	}
	for {
		s.group.mu.Lock()
		n := len(s.group.queue)
		s.group.mu.Unlock()
		if n+int(g.held.Load()-heldBefore) == len(errs)+1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	before := ts.trips.Load()
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Before: the held create's 6, then the group's 16 request ids, 16
	// names, 4 directories' entries and inodes (the path above them read
	// once): about 48. Now: one for the held create, and for the group a
	// level of the walk per trip where guesses are missing (the new
	// directories' inodes).
	if got := ts.trips.Load() - before; got > 4 {
		t.Errorf("a create and a group of %d creates made %d round trips, want at most 4", len(errs), got)
	}
}

// Guesses of inode ids made stale by renames, removes and re-creates
// never change an answer.
func TestPrefetchStaleGuesses(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestService(t, nil)
	mk := func(p string) uint64 {
		t.Helper()
		n, err := s.Mkdir(ctx, "", p, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n.ID
	}
	create := func(p string) uint64 {
		t.Helper()
		n, err := s.Create(ctx, "", p, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n.ID
	}
	stat := func(p string) (uint64, error) {
		n, err := s.Stat(ctx, p)
		if err != nil {
			return 0, err
		}
		return n.ID, nil
	}
	mk("/a")
	mk("/a/b")
	old := create("/a/b/f")
	if id, err := stat("/a/b/f"); err != nil || id != old {
		t.Fatalf("stat: %d %v, want %d", id, err, old)
	}
	// The guesses for /a and /a/b/f now name what moved to /c.
	if err := s.Rename(ctx, "", "/a", "/c", 0); err != nil {
		t.Fatal(err)
	}
	mk("/a")
	mk("/a/b")
	if _, err := stat("/a/b/f"); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("stat of a name that moved away: %v, want ErrNotExist", err)
	}
	if err := s.Remove(ctx, "", "/a/b/f"); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("remove of a name that moved away: %v, want ErrNotExist", err)
	}
	if _, err := s.Create(ctx, "", "/c/b/f", true, nil); !errors.Is(err, iofs.ErrExist) {
		t.Fatalf("exclusive create of the moved file: %v, want ErrExist", err)
	}
	fresh := create("/a/b/f")
	if id, err := stat("/a/b/f"); err != nil || id != fresh || fresh == old {
		t.Fatalf("stat of the new file: %d %v, want %d (not %d)", id, err, fresh, old)
	}
	if id, err := stat("/c/b/f"); err != nil || id != old {
		t.Fatalf("stat of the moved file: %d %v, want %d", id, err, old)
	}
	// Remove and re-create: the guess names the removed inode.
	if err := s.Remove(ctx, "", "/c/b/f"); err != nil {
		t.Fatal(err)
	}
	if _, err := stat("/c/b/f"); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("stat after remove: %v", err)
	}
	again := create("/c/b/f")
	if id, err := stat("/c/b/f"); err != nil || id != again {
		t.Fatalf("stat after re-create: %d %v, want %d", id, err, again)
	}
	// A file where a directory was guessed.
	if err := s.Remove(ctx, "", "/a/b/f"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "", "/a/b"); err != nil {
		t.Fatal(err)
	}
	create("/a/b")
	if _, err := stat("/a/b/f"); !errors.Is(err, ErrNotDir) {
		t.Fatalf("stat under a file: %v, want ErrNotDir", err)
	}
	if _, err := s.Create(ctx, "", "/a/b/f", true, nil); !errors.Is(err, ErrNotDir) {
		t.Fatalf("create under a file: %v, want ErrNotDir", err)
	}
}
