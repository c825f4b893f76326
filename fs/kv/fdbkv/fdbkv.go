//go:build fdb

package fdbkv

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/ffkit/ffkit/fs/kv"
)

// APIVersion is the FoundationDB API version requested (client 7.1 or later).
const APIVersion = 710

// Options tune a Store.
type Options struct {
	// ClusterFile is the path of fdb.cluster. Default: the platform's
	// default cluster file.
	ClusterFile string
	// Prefix namespaces every key. Default "ffkit/".
	Prefix string
	// MaxRetries bounds Update's retries of retryable errors (conflicts,
	// too-old read versions). Default 100.
	MaxRetries int
	// TimeoutMs bounds one transaction attempt (FoundationDB's own
	// timeout option). Default 10000; 0 keeps the default.
	TimeoutMs int64
}

// Store is a kv.Store on FoundationDB.
type Store struct {
	db     fdb.Database
	opts   Options
	prefix []byte
}

var _ kv.Store = (*Store)(nil)

var apiOnce sync.Once
var apiErr error

// Open connects to the FoundationDB cluster.
func Open(opts Options) (*Store, error) {
	if opts.Prefix == "" {
		opts.Prefix = "ffkit/"
	}
	if opts.MaxRetries <= 0 {
		opts.MaxRetries = 100
	}
	if opts.TimeoutMs <= 0 {
		opts.TimeoutMs = 10000
	}
	apiOnce.Do(func() { apiErr = fdb.APIVersion(APIVersion) })
	if apiErr != nil {
		return nil, fmt.Errorf("%w: fdbkv: API version %d: %v", kv.ErrUnavailable, APIVersion, apiErr)
	}
	db, err := fdb.OpenDatabase(opts.ClusterFile)
	if err != nil {
		return nil, fmt.Errorf("%w: fdbkv: open %q: %v", kv.ErrUnavailable, opts.ClusterFile, err)
	}
	return &Store{db: db, opts: opts, prefix: []byte(opts.Prefix)}, nil
}

func init() {
	kv.RegisterBackend("fdb", func(ctx context.Context, rest string) (kv.Store, error) {
		return Open(Options{ClusterFile: rest})
	})
}

// Close releases nothing: the bindings keep one network thread per process.
func (s *Store) Close() error { return nil }

func (s *Store) key(k []byte) fdb.Key {
	out := make([]byte, 0, len(s.prefix)+len(k))
	return fdb.Key(append(append(out, s.prefix...), k...))
}

// end maps an exclusive end (nil: no bound) into the namespace.
func (s *Store) end(e []byte) fdb.Key {
	if e == nil {
		if pe := kv.PrefixEnd(s.prefix); pe != nil {
			return fdb.Key(pe)
		}
		return fdb.Key{0xff} // the end of the user keyspace
	}
	return s.key(e)
}

func (s *Store) strip(k fdb.Key) []byte {
	return append([]byte(nil), k[len(s.prefix):]...)
}

// Error codes of FoundationDB this backend tells apart.
const (
	codeNotCommitted         = 1020 // a read conflict: retry
	codeTransactionCancelled = 1025
	codeOperationCancelled   = 1101
	codeTransactionTooLarge  = 2101
	codeKeyTooLarge          = 2102
	codeValueTooLarge        = 2103
)

// mapErr turns a FoundationDB error into the contract's.
func mapErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var fe fdb.Error
	if errors.As(err, &fe) {
		switch fe.Code {
		case codeTransactionTooLarge, codeKeyTooLarge, codeValueTooLarge:
			return fmt.Errorf("%w: fdbkv: %s: %v", kv.ErrTooLarge, op, err)
		case codeNotCommitted:
			return fmt.Errorf("%w: fdbkv: %s: %v", kv.ErrConflict, op, err)
		}
	}
	return fmt.Errorf("%w: fdbkv: %s: %v", kv.ErrUnavailable, op, err)
}

// begin creates a transaction that ctx cancels. stop must be called when
// the transaction is done with.
func (s *Store) begin(ctx context.Context) (fdb.Transaction, func(), error) {
	tr, err := s.db.CreateTransaction()
	if err != nil {
		return tr, nil, mapErr(ctx, "begin", err)
	}
	if err := tr.Options().SetTimeout(s.opts.TimeoutMs); err != nil {
		return tr, nil, mapErr(ctx, "set timeout", err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			tr.Cancel()
		case <-done:
		}
	}()
	return tr, func() { close(done) }, nil
}

// View runs fn on a snapshot (a transaction that is never committed).
func (s *Store) View(ctx context.Context, fn func(tx kv.ReadTxn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tr, stop, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer stop()
	defer tr.Cancel()
	return fn(&txn{s: s, tr: tr})
}

// Update runs fn in a transaction and commits it, retrying retryable
// errors (conflicts first of all) with FoundationDB's own backoff.
func (s *Store) Update(ctx context.Context, fn func(tx kv.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tr, stop, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer stop()
	for attempt := 1; ; attempt++ {
		t := &txn{s: s, tr: tr}
		err := fn(t)
		if err == nil {
			err = tr.Commit().Get()
		}
		if err == nil {
			return nil
		}
		var fe fdb.Error
		if !errors.As(err, &fe) {
			tr.Cancel()
			return err // the closure's own error: no commit
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt >= s.opts.MaxRetries {
			tr.Cancel()
			if fe.Code == codeNotCommitted {
				return fmt.Errorf("%w: fdbkv: gave up after %d attempts", kv.ErrConflict, attempt)
			}
			return mapErr(ctx, "commit", err)
		}
		// OnError resets the transaction and waits a backoff for retryable
		// errors; it returns the error again for fatal ones.
		if err := tr.OnError(fe).Get(); err != nil {
			return mapErr(ctx, "commit", err)
		}
	}
}

type txn struct {
	s  *Store
	tr fdb.Transaction
}

// ctxErr fails fast on a cancelled context (the watcher goroutine also
// cancels the transaction, failing pending futures).
func ctxErr(ctx context.Context) error { return ctx.Err() }

func (t *txn) get(ctx context.Context, key []byte, snapshot bool) ([]byte, bool, error) {
	if err := ctxErr(ctx); err != nil {
		return nil, false, err
	}
	var f fdb.FutureByteSlice
	if snapshot {
		f = t.tr.Snapshot().Get(t.s.key(key))
	} else {
		f = t.tr.Get(t.s.key(key))
	}
	v, err := f.Get()
	if err != nil {
		return nil, false, t.readErr(ctx, "get", err)
	}
	if v == nil {
		return nil, false, nil
	}
	return v, true, nil
}

// readErr keeps FoundationDB's retryable errors as fdb.Error, so that a
// closure returning them makes Update retry; other failures are mapped.
func (t *txn) readErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var fe fdb.Error
	if errors.As(err, &fe) && fe.Code != codeTransactionCancelled && fe.Code != codeOperationCancelled {
		return err
	}
	return mapErr(ctx, op, err)
}

func (t *txn) rangeRead(ctx context.Context, begin, end []byte, limit int, snapshot bool) ([]kv.KeyValue, error) {
	if err := ctxErr(ctx); err != nil {
		return nil, err
	}
	if end != nil && string(end) <= string(begin) {
		return nil, nil
	}
	if limit < 0 {
		limit = 0
	}
	r := fdb.KeyRange{Begin: t.s.key(begin), End: t.s.end(end)}
	opts := fdb.RangeOptions{Limit: limit}
	var res fdb.RangeResult
	if snapshot {
		res = t.tr.Snapshot().GetRange(r, opts)
	} else {
		res = t.tr.GetRange(r, opts)
	}
	kvs, err := res.GetSliceWithError()
	if err != nil {
		return nil, t.readErr(ctx, "range", err)
	}
	out := make([]kv.KeyValue, len(kvs))
	for i, p := range kvs {
		v := p.Value
		if v == nil {
			v = []byte{}
		}
		out[i] = kv.KeyValue{Key: t.s.strip(p.Key), Value: v}
	}
	return out, nil
}

func (t *txn) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	return t.get(ctx, key, false)
}
func (t *txn) SnapshotGet(ctx context.Context, key []byte) ([]byte, bool, error) {
	return t.get(ctx, key, true)
}
func (t *txn) Range(ctx context.Context, begin, end []byte, limit int) ([]kv.KeyValue, error) {
	return t.rangeRead(ctx, begin, end, limit, false)
}
func (t *txn) SnapshotRange(ctx context.Context, begin, end []byte, limit int) ([]kv.KeyValue, error) {
	return t.rangeRead(ctx, begin, end, limit, true)
}
func (t *txn) Set(key, value []byte) { t.tr.Set(t.s.key(key), value) }
func (t *txn) Delete(key []byte)     { t.tr.Clear(t.s.key(key)) }
func (t *txn) DeleteRange(begin, end []byte) {
	if end != nil && string(end) <= string(begin) {
		return
	}
	t.tr.ClearRange(fdb.KeyRange{Begin: t.s.key(begin), End: t.s.end(end)})
}
