// Package kv is the small transactional key-value contract that ffkit's
// metadata service and cluster manager are written against, once, as
// JuiceFS and 3FS do. Backends live in sub-packages (memkv: in memory with
// real conflict detection; etcdkv: etcd, embedded or external; fdbkv:
// FoundationDB behind the fdb build tag). One conformance suite (kvtest)
// runs against every backend.
//
// Semantics: serializable transactions. Reads through Get and Range record
// read conflicts: a transaction commits only if nothing it read that way was
// changed by a transaction that committed after it began. SnapshotGet and
// SnapshotRange read the same snapshot without recording conflicts. Writes
// are buffered and applied atomically at commit; a transaction reads its
// own writes.
//
// Update runs fn and commits, retrying fn from scratch on conflict, so fn
// may run more than once: it must reset its outputs at the start and touch
// memory outside the transaction only after Update returns.
//
// Keys and values are byte strings; callers must not modify slices passed
// in or returned.
package kv

import (
	"context"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Errors every backend returns (wrapped) for the same situations.
var (
	// ErrConflict: the transaction conflicted and the retry budget ran out.
	ErrConflict = errkind.New(errkind.Unavailable, "kv: transaction conflict")
	// ErrUnavailable: the store could not be reached.
	ErrUnavailable = errkind.New(errkind.Unavailable, "kv: store unavailable")
	// ErrTooLarge: a key, value or transaction exceeds the backend's limits.
	ErrTooLarge = errkind.New(errkind.Usage, "kv: too large")
)

// KeyValue is one pair returned by a range read.
type KeyValue struct {
	Key   []byte
	Value []byte
}

// ReadTxn reads one consistent snapshot.
type ReadTxn interface {
	// Get returns the value of key, or ok=false if it is absent.
	Get(ctx context.Context, key []byte) (value []byte, ok bool, err error)
	// Range returns the pairs with begin <= key < end in key order, at most
	// limit of them (limit <= 0: no limit).
	Range(ctx context.Context, begin, end []byte, limit int) ([]KeyValue, error)
}

// Txn is a read-write transaction.
type Txn interface {
	ReadTxn
	// SnapshotGet and SnapshotRange read without recording conflicts.
	SnapshotGet(ctx context.Context, key []byte) ([]byte, bool, error)
	SnapshotRange(ctx context.Context, begin, end []byte, limit int) ([]KeyValue, error)
	// Set writes key=value at commit.
	Set(key, value []byte)
	// Delete removes key at commit.
	Delete(key []byte)
	// DeleteRange removes every key with begin <= key < end at commit.
	DeleteRange(begin, end []byte)
}

// Store is a transactional key-value store.
type Store interface {
	// View runs fn on a read-only snapshot.
	View(ctx context.Context, fn func(tx ReadTxn) error) error
	// Update runs fn in a read-write transaction and commits it, retrying on
	// conflict (see the package comment).
	Update(ctx context.Context, fn func(tx Txn) error) error
	// Close releases the store's resources.
	Close() error
}

// PrefixEnd returns the smallest key greater than every key with prefix p,
// for range reads over a prefix. It returns nil (no upper bound) when p is
// all 0xff bytes.
func PrefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Prefetcher is implemented by transactions (read-only or read-write) that
// can read many keys in one round trip. Prefetch reads keys at the
// transaction's snapshot (its own writes overlaid) and returns each
// one's value and presence; it records no conflicts, but a later Get or
// SnapshotGet of a prefetched key reads the same value without a round
// trip and records conflicts as usual. It is an optimisation only:
// callers must mean the same with or without it.
type Prefetcher interface {
	Prefetch(ctx context.Context, keys [][]byte) (values [][]byte, ok []bool, err error)
}
