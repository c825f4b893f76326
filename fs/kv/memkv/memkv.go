// Package memkv is the in-memory backend of the kv contract, for unit tests
// and benchmarks. It is a real MVCC store: every commit gets a version,
// each key keeps the versions that open transactions may still read, and a
// commit is refused when a key or range the transaction read with Get or
// Range was written by a transaction that committed after it began (the
// FoundationDB model). Nothing is persisted.
//
// A Store is safe for concurrent use; a transaction belongs to the one
// goroutine running the Update or View closure.
package memkv

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/internal/backoff"
	"github.com/ffkit/ffkit/fs/kv/internal/wbuf"
)

// Limits, the same as FoundationDB's, so that code tested here also fits there.
const (
	MaxKeySize   = 10_000
	MaxValueSize = 100_000
	MaxTxnSize   = 10_000_000
)

// Options tune a Store.
type Options struct {
	// MaxRetries is how many times Update retries a conflicting
	// transaction before returning kv.ErrConflict. Default 100.
	MaxRetries int
}

type version struct {
	ver     uint64
	value   []byte
	deleted bool
}

// Store is an in-memory transactional key-value store.
type Store struct {
	opts Options

	mu     sync.RWMutex
	keys   []string             // sorted; every key with at least one version; guarded by mu
	hist   map[string][]version // versions, oldest first; guarded by mu
	ver    uint64               // last committed version; guarded by mu
	active map[uint64]int       // read versions of open transactions -> count; guarded by mu
	closed bool                 // guarded by mu
}

var _ kv.Store = (*Store)(nil)

// New returns an empty store.
func New(opts Options) *Store {
	if opts.MaxRetries <= 0 {
		opts.MaxRetries = 100
	}
	return &Store{opts: opts, hist: map[string][]version{}, active: map[uint64]int{}}
}

// Close drops the data; later calls fail with kv.ErrUnavailable.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.keys, s.hist = nil, map[string][]version{}
	return nil
}

func (s *Store) begin() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, fmt.Errorf("%w: memkv: store closed", kv.ErrUnavailable)
	}
	s.active[s.ver]++
	return s.ver, nil
}

func (s *Store) end(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active[rv]--; s.active[rv] <= 0 {
		delete(s.active, rv)
	}
}

// View runs fn on a snapshot.
func (s *Store) View(ctx context.Context, fn func(tx kv.ReadTxn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rv, err := s.begin()
	if err != nil {
		return err
	}
	defer s.end(rv)
	return fn(&txn{s: s, rv: rv, readOnly: true})
}

// Update runs fn in a transaction and commits it, retrying on conflict.
func (s *Store) Update(ctx context.Context, fn func(tx kv.Txn) error) error {
	return backoff.New(100*time.Microsecond, 10*time.Millisecond).Retry(ctx, s.opts.MaxRetries, "memkv", errRetry, func() error {
		rv, err := s.begin()
		if err != nil {
			return err
		}
		defer s.end(rv)
		t := &txn{s: s, rv: rv}
		if err := fn(t); err != nil {
			return err
		}
		return s.commit(t)
	})
}

var errRetry = fmt.Errorf("memkv: conflict (internal, retried)")

// latestLocked returns the newest version of key, or nil.
func (s *Store) latestLocked(key string) *version {
	h := s.hist[key]
	if len(h) == 0 {
		return nil
	}
	return &h[len(h)-1]
}

// atLocked returns the version of key visible at rv, or nil.
func (s *Store) atLocked(key string, rv uint64) *version {
	h := s.hist[key]
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].ver <= rv {
			if h[i].deleted {
				return nil
			}
			return &h[i]
		}
	}
	return nil
}

// searchLocked returns the index of the first key >= k.
func (s *Store) searchLocked(k []byte) int {
	return sort.Search(len(s.keys), func(i int) bool { return s.keys[i] >= string(k) })
}

func inEnd(k string, end []byte) bool { return end == nil || k < string(end) }

func (s *Store) commit(t *txn) error {
	if t.tooLarge != nil {
		return t.tooLarge
	}
	if t.buf.Empty() {
		return nil // a read-only transaction is serializable at its read version
	}
	if t.buf.Size() > MaxTxnSize {
		return fmt.Errorf("%w: memkv: transaction of %d bytes exceeds %d", kv.ErrTooLarge, t.buf.Size(), MaxTxnSize)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%w: memkv: store closed", kv.ErrUnavailable)
	}
	for k := range t.readKeys {
		if v := s.latestLocked(k); v != nil && v.ver > t.rv {
			return errRetry
		}
	}
	for _, r := range t.readRanges {
		for i := s.searchLocked(r.Begin); i < len(s.keys) && inEnd(s.keys[i], r.End); i++ {
			if s.latestLocked(s.keys[i]).ver > t.rv {
				return errRetry
			}
		}
	}
	s.ver++
	nv := s.ver
	ranges, keys, ops := t.buf.Normalized()
	for _, r := range ranges {
		for i := s.searchLocked(r.Begin); i < len(s.keys) && inEnd(s.keys[i], r.End); i++ {
			if v := s.latestLocked(s.keys[i]); !v.deleted {
				s.appendLocked(s.keys[i], version{ver: nv, deleted: true})
			}
		}
	}
	for i, k := range keys {
		if ops[i].Delete {
			if v := s.latestLocked(k); v == nil || v.deleted {
				continue
			}
			s.appendLocked(k, version{ver: nv, deleted: true})
			continue
		}
		s.appendLocked(k, version{ver: nv, value: ops[i].Value})
	}
	return nil
}

// appendLocked adds a version to key and prunes versions no open
// transaction can read any more. A tombstone older than every open
// transaction is dropped with its key: no conflict check needs it.
func (s *Store) appendLocked(key string, v version) {
	h, existed := s.hist[key]
	h = append(h, v)
	oldest := s.ver
	for rv := range s.active {
		if rv < oldest {
			oldest = rv
		}
	}
	// Keep the newest version <= oldest and everything after it.
	cut := 0
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].ver <= oldest {
			cut = i
			break
		}
	}
	h = h[cut:]
	if len(h) == 1 && h[0].deleted && h[0].ver <= oldest {
		delete(s.hist, key)
		if existed {
			i := s.searchLocked([]byte(key))
			s.keys = append(s.keys[:i], s.keys[i+1:]...)
		}
		return
	}
	s.hist[key] = h
	if !existed {
		i := s.searchLocked([]byte(key))
		s.keys = append(s.keys, "")
		copy(s.keys[i+1:], s.keys[i:])
		s.keys[i] = key
	}
}

type txn struct {
	s          *Store
	rv         uint64
	readOnly   bool
	buf        wbuf.Buffer
	readKeys   map[string]struct{}
	readRanges []wbuf.Range
	tooLarge   error // an oversize Set, reported at commit
}

func checkKey(k []byte) error {
	if len(k) > MaxKeySize {
		return fmt.Errorf("%w: memkv: key of %d bytes exceeds %d", kv.ErrTooLarge, len(k), MaxKeySize)
	}
	return nil
}

func (t *txn) get(ctx context.Context, key []byte, conflict bool) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	if err := checkKey(key); err != nil {
		return nil, false, err
	}
	if conflict && !t.readOnly {
		if t.readKeys == nil {
			t.readKeys = map[string]struct{}{}
		}
		t.readKeys[string(key)] = struct{}{}
	}
	if v, ok, found := t.buf.Lookup(key); found {
		return v, ok, nil
	}
	t.s.mu.RLock()
	defer t.s.mu.RUnlock()
	if v := t.s.atLocked(string(key), t.rv); v != nil {
		return v.value, true, nil
	}
	return nil, false, nil
}

func (t *txn) rangeRead(ctx context.Context, begin, end []byte, limit int, conflict bool) ([]kv.KeyValue, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	storeLimit := t.buf.StoreLimit(begin, end, limit)
	var store []kv.KeyValue
	t.s.mu.RLock()
	for i := t.s.searchLocked(begin); i < len(t.s.keys) && inEnd(t.s.keys[i], end); i++ {
		if v := t.s.atLocked(t.s.keys[i], t.rv); v != nil {
			store = append(store, kv.KeyValue{Key: []byte(t.s.keys[i]), Value: v.value})
			if storeLimit > 0 && len(store) >= storeLimit {
				break
			}
		}
	}
	t.s.mu.RUnlock()
	out := t.buf.Overlay(store, begin, end, limit)
	if conflict && !t.readOnly {
		t.readRanges = append(t.readRanges, wbuf.Observed(begin, end, limit, out))
	}
	return out, nil
}

var _ kv.Prefetcher = (*txn)(nil)

// Prefetch reads keys without recording conflicts (memkv reads cost no
// round trip; it is here so that callers' prefetching is tested on it).
func (t *txn) Prefetch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	vals, oks := make([][]byte, len(keys)), make([]bool, len(keys))
	for i, k := range keys {
		v, ok, err := t.get(ctx, k, false)
		if err != nil {
			return nil, nil, err
		}
		vals[i], oks[i] = v, ok
	}
	return vals, oks, nil
}

func (t *txn) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	return t.get(ctx, key, true)
}
func (t *txn) SnapshotGet(ctx context.Context, key []byte) ([]byte, bool, error) {
	return t.get(ctx, key, false)
}
func (t *txn) Range(ctx context.Context, begin, end []byte, limit int) ([]kv.KeyValue, error) {
	return t.rangeRead(ctx, begin, end, limit, true)
}
func (t *txn) SnapshotRange(ctx context.Context, begin, end []byte, limit int) ([]kv.KeyValue, error) {
	return t.rangeRead(ctx, begin, end, limit, false)
}

// Set, Delete and DeleteRange record oversize writes as a failure that
// surfaces at commit, as the contract's writes return no error.
func (t *txn) Set(key, value []byte) {
	if len(key) > MaxKeySize || len(value) > MaxValueSize {
		t.tooLarge = fmt.Errorf("%w: memkv: key of %d bytes (max %d) or value of %d bytes (max %d)",
			kv.ErrTooLarge, len(key), MaxKeySize, len(value), MaxValueSize)
		return
	}
	t.buf.Set(key, value)
}
func (t *txn) Delete(key []byte)             { t.buf.Delete(key) }
func (t *txn) DeleteRange(begin, end []byte) { t.buf.DeleteRange(begin, end) }

func init() {
	kv.RegisterBackend("mem", func(ctx context.Context, rest string) (kv.Store, error) {
		return New(Options{}), nil
	})
}
