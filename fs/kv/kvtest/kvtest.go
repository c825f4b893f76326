// Package kvtest is the one conformance suite of the kv contract. Every
// backend's tests call Run on a live store; the suite checks the semantics
// that the metadata service and mgmtd rely on: snapshot versus
// conflict-checked reads, range reads with limits, read-your-writes,
// DeleteRange, atomicity, retry on conflict, serializable concurrent
// increments and context cancellation.
//
// Each subtest works under its own key prefix, so one store (an etcd
// cluster that is slow to start) serves the whole suite. The store must
// not be shared with another writer of the "kvtest/" prefix.
package kvtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
)

// Options adjust the suite to a backend.
type Options struct {
	// Writers and Increments size the concurrent-increment test.
	// Defaults 4 and 25.
	Writers, Increments int
}

// Run runs the suite against s.
func Run(t *testing.T, s kv.Store, opts Options) {
	if opts.Writers <= 0 {
		opts.Writers = 4
	}
	if opts.Increments <= 0 {
		opts.Increments = 25
	}
	run := func(name string, f func(t *testing.T, s kv.Store, p prefix)) {
		t.Run(name, func(t *testing.T) {
			p := prefix(fmt.Sprintf("kvtest/%d/%s/", time.Now().UnixNano(), name))
			f(t, s, p)
		})
	}
	run("SetGetDelete", testSetGetDelete)
	run("BinaryKeysEmptyValues", testBinary)
	run("ReadYourWrites", testReadYourWrites)
	run("Range", testRange)
	run("DeleteRange", testDeleteRange)
	run("Atomicity", testAtomicity)
	run("SnapshotView", testSnapshotView)
	run("GetConflict", testGetConflict)
	run("SnapshotGetNoConflict", testSnapshotGetNoConflict)
	run("Prefetch", testPrefetch)
	run("RangeConflict", testRangeConflict)
	run("LimitedRangeConflict", testLimitedRangeConflict)
	run("BlindWritesNoConflict", testBlindWrites)
	run("RetryBudget", testRetryBudget)
	run("ConcurrentIncrements", func(t *testing.T, s kv.Store, p prefix) { testIncrements(t, s, p, opts) })
	run("ContextCancel", testCancel)
	run("TooLarge", testTooLarge)
}

type prefix string

func (p prefix) k(s string) []byte { return []byte(string(p) + s) }
func (p prefix) begin() []byte     { return []byte(p) }
func (p prefix) end() []byte       { return kv.PrefixEnd([]byte(p)) }

func set(t *testing.T, s kv.Store, kvs ...[]byte) {
	t.Helper()
	err := s.Update(context.Background(), func(tx kv.Txn) error {
		for i := 0; i+1 < len(kvs); i += 2 {
			tx.Set(kvs[i], kvs[i+1])
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set: %v", err)
	}
}

func get(t *testing.T, s kv.Store, k []byte) (string, bool) {
	t.Helper()
	var v []byte
	var ok bool
	err := s.View(context.Background(), func(tx kv.ReadTxn) error {
		var err error
		v, ok, err = tx.Get(context.Background(), k)
		return err
	})
	if err != nil {
		t.Fatalf("get %q: %v", k, err)
	}
	return string(v), ok
}

func want(t *testing.T, s kv.Store, k []byte, val string, present bool) {
	t.Helper()
	v, ok := get(t, s, k)
	if ok != present || (present && v != val) {
		t.Fatalf("key %q: got (%q, %v), want (%q, %v)", k, v, ok, val, present)
	}
}

func keys(kvs []kv.KeyValue) string {
	var b bytes.Buffer
	for i, p := range kvs {
		if i > 0 {
			b.WriteByte(',')
		}
		i := bytes.LastIndexByte(p.Key, '/')
		b.Write(p.Key[i+1:])
		b.WriteByte('=')
		b.Write(p.Value)
	}
	return b.String()
}

func rangeOf(t *testing.T, s kv.Store, begin, end []byte, limit int) string {
	t.Helper()
	var out []kv.KeyValue
	err := s.View(context.Background(), func(tx kv.ReadTxn) error {
		var err error
		out, err = tx.Range(context.Background(), begin, end, limit)
		return err
	})
	if err != nil {
		t.Fatalf("range: %v", err)
	}
	return keys(out)
}

func testSetGetDelete(t *testing.T, s kv.Store, p prefix) {
	want(t, s, p.k("a"), "", false)
	set(t, s, p.k("a"), []byte("1"))
	want(t, s, p.k("a"), "1", true)
	set(t, s, p.k("a"), []byte("2"))
	want(t, s, p.k("a"), "2", true)
	if err := s.Update(context.Background(), func(tx kv.Txn) error { tx.Delete(p.k("a")); return nil }); err != nil {
		t.Fatal(err)
	}
	want(t, s, p.k("a"), "", false)
	// Deleting an absent key is fine.
	if err := s.Update(context.Background(), func(tx kv.Txn) error { tx.Delete(p.k("zz")); return nil }); err != nil {
		t.Fatal(err)
	}
}

func testBinary(t *testing.T, s kv.Store, p prefix) {
	k1 := append(p.k("b"), 0, 0xff, 0)
	k2 := append(p.k("b"), 0xff, 0xff)
	set(t, s, k1, []byte{}, k2, []byte{0, 1, 2})
	want(t, s, k1, "", true)
	want(t, s, k2, "\x00\x01\x02", true)
	if got := rangeOf(t, s, p.begin(), p.end(), 0); got != "b\x00\xff\x00=,b\xff\xff=\x00\x01\x02" {
		t.Fatalf("range = %q", got)
	}
}

func testReadYourWrites(t *testing.T, s kv.Store, p prefix) {
	set(t, s, p.k("a"), []byte("old"), p.k("b"), []byte("old"), p.k("c"), []byte("old"), p.k("d"), []byte("old"))
	ctx := context.Background()
	err := s.Update(ctx, func(tx kv.Txn) error {
		tx.Set(p.k("a"), []byte("new"))
		tx.Delete(p.k("b"))
		tx.Set(p.k("e"), []byte("new"))
		for _, c := range []struct {
			k    string
			v    string
			ok   bool
			snap bool
		}{{"a", "new", true, false}, {"b", "", false, false}, {"e", "new", true, true}, {"c", "old", true, true}} {
			get := tx.Get
			if c.snap {
				get = tx.SnapshotGet
			}
			v, ok, err := get(ctx, p.k(c.k))
			if err != nil {
				return err
			}
			if string(v) != c.v || ok != c.ok {
				t.Errorf("in txn: %s = (%q,%v), want (%q,%v)", c.k, v, ok, c.v, c.ok)
			}
		}
		r, err := tx.Range(ctx, p.begin(), p.end(), 0)
		if err != nil {
			return err
		}
		if got := keys(r); got != "a=new,c=old,d=old,e=new" {
			t.Errorf("range in txn = %q", got)
		}
		r, err = tx.SnapshotRange(ctx, p.begin(), p.end(), 2)
		if err != nil {
			return err
		}
		if got := keys(r); got != "a=new,c=old" {
			t.Errorf("limited snapshot range in txn = %q", got)
		}
		// DeleteRange hides earlier writes; a later Set shows again.
		tx.DeleteRange(p.k("c"), p.k("f"))
		tx.Set(p.k("d"), []byte("again"))
		r, err = tx.Range(ctx, p.begin(), p.end(), 0)
		if err != nil {
			return err
		}
		if got := keys(r); got != "a=new,d=again" {
			t.Errorf("range after DeleteRange+Set = %q", got)
		}
		if _, ok, _ := tx.Get(ctx, p.k("e")); ok {
			t.Errorf("e visible after DeleteRange")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := rangeOf(t, s, p.begin(), p.end(), 0); got != "a=new,d=again" {
		t.Fatalf("after commit: %q", got)
	}
}

func testRange(t *testing.T, s kv.Store, p prefix) {
	for _, k := range []string{"e", "a", "c", "b", "d"} {
		set(t, s, p.k(k), []byte(k+k))
	}
	set(t, s, p.k("a/x"), []byte("ax"))
	cases := []struct {
		b, e  []byte
		limit int
		want  string
	}{
		{p.begin(), p.end(), 0, "a=aa,x=ax,b=bb,c=cc,d=dd,e=ee"},
		{p.begin(), p.end(), 3, "a=aa,x=ax,b=bb"},
		{p.k("b"), p.k("d"), 0, "b=bb,c=cc"},
		{p.k("b"), p.k("d"), -1, "b=bb,c=cc"},
		{p.k("bb"), p.k("c"), 0, ""},
		{p.k("a/"), kv.PrefixEnd(p.k("a/")), 0, "x=ax"},
		{p.k("d"), p.k("b"), 0, ""},
	}
	for _, c := range cases {
		if got := rangeOf(t, s, c.b, c.e, c.limit); got != c.want {
			t.Errorf("Range(%q, %q, %d) = %q, want %q", c.b, c.e, c.limit, got, c.want)
		}
	}
}

func testDeleteRange(t *testing.T, s kv.Store, p prefix) {
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		set(t, s, p.k(k), []byte(k))
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error {
		tx.DeleteRange(p.k("b"), p.k("d"))
		tx.DeleteRange(p.k("c"), p.k("c0")) // overlapping ranges are fine
		tx.Delete(p.k("b"))                 // and a point inside one
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := rangeOf(t, s, p.begin(), p.end(), 0); got != "a=a,d=d,e=e" {
		t.Fatalf("after DeleteRange: %q", got)
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error {
		tx.DeleteRange(p.begin(), p.end())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := rangeOf(t, s, p.begin(), p.end(), 0); got != "" {
		t.Fatalf("after DeleteRange of all: %q", got)
	}
}

var errAbort = errors.New("kvtest: abort")

func testAtomicity(t *testing.T, s kv.Store, p prefix) {
	ctx := context.Background()
	err := s.Update(ctx, func(tx kv.Txn) error {
		tx.Set(p.k("x"), []byte("1"))
		tx.Set(p.k("y"), []byte("1"))
		return errAbort
	})
	if !errors.Is(err, errAbort) {
		t.Fatalf("Update returned %v, want the closure's error", err)
	}
	want(t, s, p.k("x"), "", false)
	want(t, s, p.k("y"), "", false)

	// A writer moves units between two keys; readers must always see the
	// total unchanged (all-or-nothing commits, consistent snapshots).
	set(t, s, p.k("x"), []byte("50"), p.k("y"), []byte("50"))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bad atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var x, y int
			err := s.View(ctx, func(tx kv.ReadTxn) error {
				a, _, err := tx.Get(ctx, p.k("x"))
				if err != nil {
					return err
				}
				b, _, err := tx.Get(ctx, p.k("y"))
				if err != nil {
					return err
				}
				x, y = atoi(a), atoi(b)
				return nil
			})
			if err != nil {
				bad.Store(err.Error())
				return
			}
			if x+y != 100 {
				bad.Store(fmt.Sprintf("saw x=%d y=%d", x, y))
				return
			}
		}
	}()
	for i := 0; i < 20; i++ {
		err := s.Update(ctx, func(tx kv.Txn) error {
			a, _, err := tx.Get(ctx, p.k("x"))
			if err != nil {
				return err
			}
			b, _, err := tx.Get(ctx, p.k("y"))
			if err != nil {
				return err
			}
			tx.Set(p.k("x"), []byte(fmt.Sprint(atoi(a)-1)))
			tx.Set(p.k("y"), []byte(fmt.Sprint(atoi(b)+1)))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatalf("reader: %v", v)
	}
	want(t, s, p.k("x"), "30", true)
}

func atoi(b []byte) int {
	n := 0
	fmt.Sscan(string(b), &n)
	return n
}

func testSnapshotView(t *testing.T, s kv.Store, p prefix) {
	set(t, s, p.k("a"), []byte("1"), p.k("b"), []byte("1"))
	ctx := context.Background()
	err := s.View(ctx, func(tx kv.ReadTxn) error {
		if v, _, err := tx.Get(ctx, p.k("a")); err != nil || string(v) != "1" {
			return fmt.Errorf("a = %q, %v", v, err)
		}
		set(t, s, p.k("a"), []byte("2"), p.k("b"), []byte("2"), p.k("c"), []byte("2"))
		if v, _, err := tx.Get(ctx, p.k("b")); err != nil || string(v) != "1" {
			return fmt.Errorf("b in old snapshot = %q, %v; want 1", v, err)
		}
		r, err := tx.Range(ctx, p.begin(), p.end(), 0)
		if err != nil {
			return err
		}
		if got := keys(r); got != "a=1,b=1" {
			return fmt.Errorf("range in old snapshot = %q", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want(t, s, p.k("b"), "2", true)
}

// interfere runs fn once, in its own transaction, the first time it is
// called: a concurrent commit between a transaction's reads and its commit.
func interfere(t *testing.T, s kv.Store, once *bool, fn func(tx kv.Txn)) {
	t.Helper()
	if *once {
		return
	}
	*once = true
	if err := s.Update(context.Background(), func(tx kv.Txn) error { fn(tx); return nil }); err != nil {
		t.Fatalf("interfering update: %v", err)
	}
}

// attempts runs body in Update and returns how many times it ran.
func attempts(t *testing.T, s kv.Store, body func(ctx context.Context, tx kv.Txn) error) int {
	t.Helper()
	n := 0
	ctx := context.Background()
	err := s.Update(ctx, func(tx kv.Txn) error {
		n++
		return body(ctx, tx)
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	return n
}

func testGetConflict(t *testing.T, s kv.Store, p prefix) {
	set(t, s, p.k("a"), []byte("1"))
	var done bool
	var seen []string
	n := attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
		v, _, err := tx.Get(ctx, p.k("a"))
		if err != nil {
			return err
		}
		seen = append(seen, string(v))
		interfere(t, s, &done, func(tx kv.Txn) { tx.Set(p.k("a"), []byte("2")) })
		tx.Set(p.k("b"), v)
		return nil
	})
	if n != 2 || fmt.Sprint(seen) != "[1 2]" {
		t.Fatalf("ran %d times seeing %v; want a retry that sees the new value", n, seen)
	}
	want(t, s, p.k("b"), "2", true)

	// A deleted key conflicts too, and so does a key created after it was read absent.
	done = false
	n = attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
		if _, _, err := tx.Get(ctx, p.k("a")); err != nil {
			return err
		}
		interfere(t, s, &done, func(tx kv.Txn) { tx.Delete(p.k("a")) })
		tx.Set(p.k("c"), []byte("x"))
		return nil
	})
	if n != 2 {
		t.Fatalf("delete of a read key: ran %d times, want 2", n)
	}
	done = false
	n = attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
		if _, ok, err := tx.Get(ctx, p.k("new")); err != nil || (ok && !done) {
			return fmt.Errorf("get new: ok=%v err=%v", ok, err)
		}
		interfere(t, s, &done, func(tx kv.Txn) { tx.Set(p.k("new"), []byte("x")) })
		tx.Set(p.k("c"), []byte("y"))
		return nil
	})
	if n != 2 {
		t.Fatalf("creation of a key read absent: ran %d times, want 2", n)
	}
}

func testSnapshotGetNoConflict(t *testing.T, s kv.Store, p prefix) {
	set(t, s, p.k("a"), []byte("1"))
	var done bool
	n := attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
		if _, _, err := tx.SnapshotGet(ctx, p.k("a")); err != nil {
			return err
		}
		if _, err := tx.SnapshotRange(ctx, p.begin(), p.end(), 0); err != nil {
			return err
		}
		interfere(t, s, &done, func(tx kv.Txn) { tx.Set(p.k("a"), []byte("2")); tx.Set(p.k("a2"), nil) })
		tx.Set(p.k("b"), []byte("x"))
		return nil
	})
	if n != 1 {
		t.Fatalf("snapshot reads caused %d runs, want 1", n)
	}
}

// testPrefetch: a backend whose transactions prefetch returns the
// snapshot's values with the transaction's own writes overlaid, records
// no conflict for a prefetched key, and a later Get of it still does.
func testPrefetch(t *testing.T, s kv.Store, p prefix) {
	set(t, s, p.k("a"), []byte("1"), p.k("b"), []byte("2"))
	ctx := context.Background()
	var done, isPrefetcher bool
	n := attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
		pf, ok := tx.(kv.Prefetcher)
		if isPrefetcher = ok; !ok {
			return nil
		}
		tx.Set(p.k("b"), []byte("own"))
		keys := [][]byte{p.k("a"), p.k("b"), p.k("none"), p.k("a")}
		vals, oks, err := pf.Prefetch(ctx, keys)
		if err != nil {
			return err
		}
		if got := fmt.Sprintf("%s %v %s %v %q %v %s %v", vals[0], oks[0], vals[1], oks[1], vals[2], oks[2], vals[3], oks[3]); got != `1 true own true "" false 1 true` {
			return fmt.Errorf("prefetch: got %s", got)
		}
		interfere(t, s, &done, func(tx kv.Txn) { tx.Set(p.k("a"), []byte("3")) })
		tx.Set(p.k("c"), []byte("x"))
		return nil
	})
	if !isPrefetcher {
		t.Skip("the backend's transactions do not prefetch")
	}
	if n != 1 {
		t.Fatalf("prefetched keys caused %d runs, want 1 (no conflict)", n)
	}
	// A Get after the prefetch records the conflict.
	done = false
	var seen []string
	n = attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
		if _, _, err := tx.(kv.Prefetcher).Prefetch(ctx, [][]byte{p.k("a")}); err != nil {
			return err
		}
		interfere(t, s, &done, func(tx kv.Txn) { tx.Set(p.k("a"), []byte("4")) })
		v, _, err := tx.Get(ctx, p.k("a"))
		if err != nil {
			return err
		}
		seen = append(seen, string(v))
		tx.Set(p.k("d"), v)
		return nil
	})
	if n != 2 || fmt.Sprint(seen) != "[3 4]" {
		t.Fatalf("Get after a prefetch: ran %d times seeing %v; want a retry that sees the new value", n, seen)
	}
	// Read-only transactions prefetch the same snapshot.
	err := s.View(ctx, func(tx kv.ReadTxn) error {
		pf, ok := tx.(kv.Prefetcher)
		if !ok {
			return nil
		}
		vals, oks, err := pf.Prefetch(ctx, [][]byte{p.k("d"), p.k("none")})
		if err != nil {
			return err
		}
		if string(vals[0]) != "4" || !oks[0] || oks[1] {
			return fmt.Errorf("view prefetch: %q %v %v", vals[0], oks[0], oks[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func testRangeConflict(t *testing.T, s kv.Store, p prefix) {
	set(t, s, p.k("r/a"), []byte("1"), p.k("r/b"), []byte("1"), p.k("z"), []byte("1"))
	rb, re := p.k("r/"), kv.PrefixEnd(p.k("r/"))
	for _, c := range []struct {
		name     string
		write    func(tx kv.Txn)
		wantRuns int
	}{
		{"insert", func(tx kv.Txn) { tx.Set(p.k("r/c"), []byte("1")) }, 2},
		{"update", func(tx kv.Txn) { tx.Set(p.k("r/a"), []byte("2")) }, 2},
		{"delete", func(tx kv.Txn) { tx.Delete(p.k("r/b")) }, 2},
		{"deleterange", func(tx kv.Txn) { tx.DeleteRange(rb, re) }, 2},
		{"outside", func(tx kv.Txn) { tx.Set(p.k("z"), []byte("2")); tx.Set(p.k("r"), nil) }, 1},
	} {
		var done bool
		n := attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
			if _, err := tx.Range(ctx, rb, re, 0); err != nil {
				return err
			}
			interfere(t, s, &done, c.write)
			tx.Set(p.k("out"), []byte(c.name))
			return nil
		})
		if n != c.wantRuns {
			t.Errorf("%s: ran %d times, want %d", c.name, n, c.wantRuns)
		}
	}
	// An empty range read (e.g. "is this directory empty?") conflicts with an insert.
	var done bool
	n := attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
		r, err := tx.Range(ctx, p.k("empty/"), kv.PrefixEnd(p.k("empty/")), 1)
		if err != nil {
			return err
		}
		if len(r) == 0 {
			interfere(t, s, &done, func(tx kv.Txn) { tx.Set(p.k("empty/x"), nil) })
		}
		tx.Set(p.k("out"), []byte("empty"))
		return nil
	})
	if n != 2 {
		t.Errorf("insert into a range read empty: ran %d times, want 2", n)
	}
}

func testLimitedRangeConflict(t *testing.T, s kv.Store, p prefix) {
	set(t, s, p.k("a"), []byte("1"), p.k("c"), []byte("1"), p.k("e"), []byte("1"))
	// Range with limit 2 observed a and c: a write after c is outside what
	// was read, a write between a and c is inside.
	for _, c := range []struct {
		key      string
		wantRuns int
	}{{"d", 1}, {"b", 2}} {
		var done bool
		n := attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
			if _, err := tx.Range(ctx, p.begin(), p.end(), 2); err != nil {
				return err
			}
			interfere(t, s, &done, func(tx kv.Txn) { tx.Set(p.k(c.key), []byte("x")) })
			tx.Set([]byte(string(p)+"~out"), nil)
			return nil
		})
		if n != c.wantRuns {
			t.Errorf("write of %s after a limited range read: ran %d times, want %d", c.key, n, c.wantRuns)
		}
	}
}

func testBlindWrites(t *testing.T, s kv.Store, p prefix) {
	var done bool
	n := attempts(t, s, func(ctx context.Context, tx kv.Txn) error {
		interfere(t, s, &done, func(tx kv.Txn) { tx.Set(p.k("a"), []byte("other")) })
		tx.Set(p.k("a"), []byte("mine"))
		return nil
	})
	if n != 1 {
		t.Fatalf("blind write ran %d times, want 1", n)
	}
	want(t, s, p.k("a"), "mine", true)
}

func testRetryBudget(t *testing.T, s kv.Store, p prefix) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := 0
	err := s.Update(ctx, func(tx kv.Txn) error {
		n++
		if _, _, err := tx.Get(ctx, p.k("hot")); err != nil {
			return err
		}
		// Someone else always gets in first.
		if err := s.Update(ctx, func(o kv.Txn) error { o.Set(p.k("hot"), []byte(fmt.Sprint(n))); return nil }); err != nil {
			return err
		}
		tx.Set(p.k("mine"), []byte("x"))
		return nil
	})
	if !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("a transaction that always conflicts returned %v after %d runs, want kv.ErrConflict", err, n)
	}
	want(t, s, p.k("mine"), "", false)
}

func testIncrements(t *testing.T, s kv.Store, p prefix, opts Options) {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, opts.Writers)
	var runs atomic.Int64
	for w := 0; w < opts.Writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < opts.Increments; i++ {
				err := s.Update(ctx, func(tx kv.Txn) error {
					runs.Add(1)
					v, _, err := tx.Get(ctx, p.k("n"))
					if err != nil {
						return err
					}
					tx.Set(p.k("n"), []byte(fmt.Sprint(atoi(v)+1)))
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := opts.Writers * opts.Increments
	want(t, s, p.k("n"), fmt.Sprint(total), true)
	t.Logf("%d increments took %d transaction runs", total, runs.Load())
}

func testCancel(t *testing.T, s kv.Store, p prefix) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := s.Update(ctx, func(tx kv.Txn) error { ran = true; tx.Set(p.k("a"), nil); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Update on a cancelled context: %v", err)
	}
	if err := s.View(ctx, func(tx kv.ReadTxn) error { ran = true; return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("View on a cancelled context: %v", err)
	}
	if ran {
		t.Fatal("closure ran on a cancelled context")
	}
	want(t, s, p.k("a"), "", false)
	// Cancelled while running: reads fail, nothing commits.
	ctx, cancel = context.WithCancel(context.Background())
	err := s.Update(ctx, func(tx kv.Txn) error {
		tx.Set(p.k("b"), []byte("x"))
		cancel()
		_, _, err := tx.Get(ctx, p.k("b"))
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Update cancelled inside: %v", err)
	}
	want(t, s, p.k("b"), "", false)
}

func testTooLarge(t *testing.T, s kv.Store, p prefix) {
	big := make([]byte, 1<<20)
	err := s.Update(context.Background(), func(tx kv.Txn) error {
		for i := 0; i < 20; i++ {
			tx.Set(p.k(fmt.Sprint(i)), big)
		}
		return nil
	})
	if !errors.Is(err, kv.ErrTooLarge) {
		t.Fatalf("a 20 MiB transaction: %v, want kv.ErrTooLarge", err)
	}
	want(t, s, p.k("0"), "", false)
}
