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

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
)

// gateStore counts committed transactions and, while its gate is shut,
// holds every Update before it starts (entered reports each one held).
type gateStore struct {
	kv.Store
	commits atomic.Int64
	held    atomic.Int64 // Updates that reached the gate
	gate    chan struct{}
	entered chan struct{}
}

func (g *gateStore) Update(ctx context.Context, fn func(tx kv.Txn) error) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	g.held.Add(1)
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	wrote := false
	err := g.Store.Update(ctx, func(tx kv.Txn) error {
		wrote = false
		if err := fn(tx); err != nil {
			return err
		}
		wrote = true
		return nil
	})
	if err == nil && wrote {
		g.commits.Add(1)
	}
	return err
}

// Creates and removes queued behind a commit are committed together in one
// transaction, and each keeps its own outcome: exclusive creates of
// existing names, creates under a missing directory and removes of
// missing names fail alone; the others succeed and are stored.
func TestGroupCommitKeepsPerOpErrors(t *testing.T) {
	ctx := context.Background()
	g := &gateStore{Store: memkv.New(memkv.Options{}), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	close(g.gate)
	s, _ := newTestService(t, g)
	s.group.max = 1
	if _, err := s.Mkdir(ctx, "", "/d", false, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := s.Create(ctx, "", fmt.Sprintf("/d/old%d", i), true, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Mkdir(ctx, "", "/d/full", false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "", "/d/full/f", true, nil); err != nil {
		t.Fatal(err)
	}
	g.gate = make(chan struct{})
	<-g.entered // drain the entries of the setup
	select {
	case <-g.entered:
	default:
	}

	heldBefore := g.held.Load()
	// The first create takes the one leader slot and is held at the gate.
	first := make(chan error, 1)
	go func() {
		_, err := s.Create(ctx, "r-first", "/d/first", true, nil)
		first <- err
	}()
	<-g.entered

	type outcome struct {
		what string
		want error // nil: must succeed
		err  error
	}
	var ops []*outcome
	var wg sync.WaitGroup
	run := func(o *outcome, f func() error) {
		ops = append(ops, o)
		wg.Add(1)
		go func() { defer wg.Done(); o.err = f() }()
	}
	for i := 0; i < 12; i++ {
		name := fmt.Sprintf("/d/new%d", i)
		run(&outcome{what: "create " + name}, func() error {
			_, err := s.Create(ctx, "r-"+name, name, true, nil)
			return err
		})
	}
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("/d/old%d", i)
		run(&outcome{what: "exclusive create " + name, want: iofs.ErrExist}, func() error {
			_, err := s.Create(ctx, "r-"+name, name, true, nil)
			return err
		})
	}
	run(&outcome{what: "create under a missing directory", want: iofs.ErrNotExist}, func() error {
		_, err := s.Create(ctx, "r-missing", "/nodir/f", true, nil)
		return err
	})
	for i := 2; i < 4; i++ {
		name := fmt.Sprintf("/d/old%d", i)
		run(&outcome{what: "remove " + name}, func() error { return s.Remove(ctx, "r-rm-"+name, name) })
	}
	run(&outcome{what: "remove a missing name", want: iofs.ErrNotExist}, func() error {
		return s.Remove(ctx, "r-rm-missing", "/d/missing")
	})

	// Fails after its first writes: the group runs again without it.
	run(&outcome{what: "remove a directory not empty", want: ErrNotEmpty}, func() error {
		return s.Remove(ctx, "r-rm-full", "/d/full")
	})

	// Wait until all of them are queued behind the held commit (or, were
	// they not grouped, held at the gate themselves).
	for {
		s.group.mu.Lock()
		n := len(s.group.queue)
		s.group.mu.Unlock()
		if n+int(g.held.Load()-heldBefore) == len(ops)+1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	before := g.commits.Load()
	close(g.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, o := range ops {
		switch {
		case o.want == nil && o.err != nil:
			t.Errorf("%s: %v", o.what, o.err)
		case o.want != nil && !errors.Is(o.err, o.want):
			t.Errorf("%s: got %v, want %v", o.what, o.err, o.want)
		}
	}
	// The first create's commit, then one for the rest together.
	if got := g.commits.Load() - before; got != 2 {
		t.Errorf("%d operations took %d commits, want 2 (the held one and one group)", len(ops)+1, got)
	}
	for i := 0; i < 12; i++ {
		if _, err := s.Stat(ctx, fmt.Sprintf("/d/new%d", i)); err != nil {
			t.Errorf("after the group: %v", err)
		}
	}
	for i := 0; i < 4; i++ {
		_, err := s.Stat(ctx, fmt.Sprintf("/d/old%d", i))
		if gone := errors.Is(err, iofs.ErrNotExist); gone != (i >= 2) {
			t.Errorf("old%d: stat after the group: %v", i, err)
		}
	}
	// A request id replayed after its group committed gets the stored answer.
	if _, err := s.Create(ctx, "r-/d/new3", "/d/new3", true, nil); err != nil {
		t.Errorf("replayed exclusive create: %v", err)
	}
}

// The collector waits for the creates and removes in flight on its server
// before removing each file's chunks (they share the store's commits).
func TestCollectorYieldsToForeground(t *testing.T) {
	ctx := context.Background()
	g := &gateStore{Store: memkv.New(memkv.Options{}), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	close(g.gate)
	s, ch := newTestService(t, g)
	s.gcYieldMax = time.Hour
	a, sid, err := s.BeginFile(ctx, "/y", "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AbandonFile(ctx, a.ID, sid); err != nil {
		t.Fatal(err)
	}
	removed := func() int {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		return len(ch.removed)
	}
	gate := make(chan struct{})
	g.gate = gate
	select {
	case <-g.entered:
	default:
	}
	defer func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}()
	created := make(chan error, 1)
	go func() {
		_, err := s.Create(ctx, "", "/z", true, nil)
		created <- err
	}()
	<-g.entered // the create waits to commit

	collected := make(chan GCStats, 1)
	go func() {
		st, err := s.CollectGarbage(ctx, 0)
		if err != nil {
			t.Error(err)
		}
		collected <- st
	}()
	for removed() == 0 && s.gcYields.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if removed() > 0 {
		t.Fatal("the collector removed chunks while a create waited to commit")
	}
	close(gate)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if st := <-collected; st.Files != 1 || removed() != 1 {
		t.Fatalf("after the create: collected %+v, chunks of %d files removed; want 1", st, removed())
	}
}
