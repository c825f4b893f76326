// Package etcdkv is the etcd backend of the kv contract, and the embedded
// single-member etcd that `ffkit fs up` uses as the default store (no
// setup). The same Store code talks to an embedded member and to a real
// multi-member cluster.
//
// Transactions are optimistic, built from etcd's multi-version store:
//   - the first read of a transaction is linearizable and fixes its read
//     revision; every later read is a Get at that revision (served from the
//     member's MVCC snapshot), so a transaction reads one consistent
//     snapshot;
//   - writes are buffered (read-your-writes overlay) and sent at commit as
//     one etcd Txn;
//   - conflict detection is the Txn's compare list: each key read with Get
//     must still have the mod revision it had (0 if it was absent: a key
//     created since fails, one deleted since fails); each range read with
//     Range must hold no key modified after the read revision (catches
//     inserts and updates) and every key it returned must still have its
//     mod revision (catches deletes). A failed compare makes Update retry
//     fn from scratch.
//
// Read revisions that etcd has compacted away are retried like conflicts.
// A Store is safe for concurrent use; a transaction belongs to the one
// goroutine running the closure.
package etcdkv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/internal/backoff"
	"github.com/ffkit/ffkit/fs/kv/internal/wbuf"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Options tune a Store.
type Options struct {
	// Prefix namespaces every key (several clusters may share one etcd).
	// Default "ffkit/".
	Prefix string
	// MaxRetries bounds Update's retries on conflict. Default 100.
	MaxRetries int
	// DialTimeout bounds connecting. Default 5s.
	DialTimeout time.Duration
	// Logger receives the client's logs. Default: none.
	Logger *zap.Logger
	// TLS, if set, connects over TLS with this configuration (its client
	// certificate proves membership to an etcd that requires one).
	// Default nil: plaintext.
	TLS *tls.Config
	// Reads says how a transaction's first read (the one that fixes its
	// read revision) is served: ReadsAuto (the default) serves it from the
	// member's own state (serializable) when the cluster has exactly one
	// member at Open, and through raft (linearizable) otherwise;
	// ReadsLinearizable and ReadsSerializable force one or the other.
	// With one member both are equally fresh: a write is acknowledged only
	// after that member applied it, so a serializable read sees every
	// acknowledged write, without the read-index round trip.
	Reads ReadMode
}

// ReadMode chooses how a transaction's first read is served (Options.Reads).
type ReadMode int

// Read modes.
const (
	ReadsAuto ReadMode = iota
	ReadsLinearizable
	ReadsSerializable
)

// Validate fills defaults and rejects nonsense.
func (o *Options) Validate() error {
	if o.Prefix == "" {
		o.Prefix = "ffkit/"
	}
	if o.MaxRetries <= 0 {
		o.MaxRetries = 100
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return nil
}

// Store is a kv.Store on etcd.
type Store struct {
	opts Options
	// serializable: first reads skip the read index (see Options.Reads).
	serializable bool
	client       *clientv3.Client
	kv           clientv3.KV
	onClose      func() // stops an owned embedded server; may be nil
}

var _ kv.Store = (*Store)(nil)

// Open connects to the etcd cluster at endpoints ("host:port").
func Open(ctx context.Context, endpoints []string, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: etcdkv: no endpoints", kv.ErrUnavailable)
	}
	if opts.TLS != nil {
		eps := make([]string, len(endpoints))
		for i, e := range endpoints {
			eps[i] = "https://" + strings.TrimPrefix(e, "https://")
		}
		endpoints = eps
	}
	c, err := clientv3.New(clientv3.Config{
		TLS:                opts.TLS,
		Endpoints:          endpoints,
		DialTimeout:        opts.DialTimeout,
		Logger:             opts.Logger,
		Context:            context.WithoutCancel(ctx),
		MaxCallSendMsgSize: 32 << 20,
		MaxCallRecvMsgSize: 256 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: etcdkv: connect to %v: %v", kv.ErrUnavailable, endpoints, err)
	}
	// Fail now rather than on first use when nothing answers.
	sctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	if _, err := c.Get(sctx, "\x00health"); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: etcdkv: %v: %v", kv.ErrUnavailable, endpoints, err)
	}
	st := &Store{opts: opts, client: c, kv: namespace.NewKV(c.KV, opts.Prefix)}
	switch opts.Reads {
	case ReadsSerializable:
		st.serializable = true
	case ReadsAuto:
		if ml, err := c.MemberList(sctx); err == nil && len(ml.Members) == 1 {
			st.serializable = true
		}
	}
	return st, nil
}

// Serializable reports whether transactions' first reads are served from
// the member's own state (Options.Reads).
func (s *Store) Serializable() bool { return s.serializable }

// Client is the underlying etcd client (for tests and tools).
func (s *Store) Client() *clientv3.Client { return s.client }

// Close closes the client and, for a store opened with OpenEmbedded, stops
// the embedded server.
func (s *Store) Close() error {
	err := s.client.Close()
	if s.onClose != nil {
		s.onClose()
	}
	return err
}

// View runs fn on a snapshot.
func (s *Store) View(ctx context.Context, fn func(tx kv.ReadTxn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		t := &txn{s: s, readOnly: true}
		err := fn(t)
		if !errors.Is(err, errRetry) || attempt+1 >= s.opts.MaxRetries {
			return unretry(err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// Update runs fn in a transaction and commits it, retrying on conflict.
func (s *Store) Update(ctx context.Context, fn func(tx kv.Txn) error) error {
	return backoff.New(time.Millisecond, 50*time.Millisecond).Retry(ctx, s.opts.MaxRetries, "etcdkv", errRetry, func() error {
		t := &txn{s: s}
		if err := fn(t); err != nil {
			return err
		}
		return t.commit(ctx)
	})
}

// errRetry marks a transaction to run again (conflict, compacted revision).
var errRetry = errors.New("etcdkv: conflict (retried)")

func unretry(err error) error {
	if errors.Is(err, errRetry) {
		return fmt.Errorf("%w: etcdkv: snapshot compacted repeatedly", kv.ErrConflict)
	}
	return err
}

// mapErr turns etcd and gRPC errors into the contract's.
func mapErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, rpctypes.ErrCompacted):
		return errRetry
	case errors.Is(err, rpctypes.ErrRequestTooLarge), errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%w: etcdkv: %s: %v", kv.ErrTooLarge, op, err)
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.ResourceExhausted {
		return fmt.Errorf("%w: etcdkv: %s: %v", kv.ErrTooLarge, op, err)
	}
	return fmt.Errorf("%w: etcdkv: %s: %v", kv.ErrUnavailable, op, err)
}

type txn struct {
	s        *Store
	readOnly bool
	rev      int64 // read revision; 0 until the first read
	buf      wbuf.Buffer
	// cmpKeys: mod revision each conflict-checked key had at rev (0: absent).
	cmpKeys map[string]int64
	// cmpRanges: ranges read with Range; no key in them may change after rev.
	cmpRanges []wbuf.Range
	// got: keys read with a point read, as they were at rev (a read
	// revision's contents never change, so a second read of a key, as the
	// metadata service's grouped operations in one directory make, costs
	// no round trip).
	got map[string]gotKey
}

type gotKey struct {
	val []byte
	mod int64
	ok  bool
}

func (t *txn) get(ctx context.Context, key []byte, conflict bool) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	if v, ok, found := t.buf.Lookup(key); found {
		return v, ok, nil
	}
	g, cached := t.got[string(key)]
	if !cached {
		resp, err := t.read(ctx, string(key))
		if err != nil {
			return nil, false, mapErr(ctx, "get", err)
		}
		if t.rev == 0 {
			t.rev = resp.Header.Revision
		}
		if g.ok = len(resp.Kvs) > 0; g.ok {
			g.val, g.mod = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
			if g.val == nil {
				g.val = []byte{}
			}
		}
		if t.got == nil {
			t.got = map[string]gotKey{}
		}
		t.got[string(key)] = g
	}
	val, mod, ok := g.val, g.mod, g.ok
	if conflict && !t.readOnly {
		t.noteKey(string(key), mod)
	}
	return val, ok, nil
}

func (t *txn) noteKey(k string, mod int64) {
	if t.cmpKeys == nil {
		t.cmpKeys = map[string]int64{}
	}
	if _, seen := t.cmpKeys[k]; !seen {
		t.cmpKeys[k] = mod
	}
}

// endKey converts an exclusive end (nil: unbounded) to etcd's form.
func endKey(end []byte) string {
	if end == nil {
		return "\x00"
	}
	return string(end)
}

func (t *txn) rangeRead(ctx context.Context, begin, end []byte, limit int, conflict bool) ([]kv.KeyValue, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if end != nil && string(end) <= string(begin) {
		return nil, nil
	}
	storeLimit := t.buf.StoreLimit(begin, end, limit)
	opts := []clientv3.OpOption{clientv3.WithRange(endKey(end))}
	if storeLimit > 0 {
		opts = append(opts, clientv3.WithLimit(int64(storeLimit)))
	}
	resp, err := t.read(ctx, string(begin), opts...)
	if err != nil {
		return nil, mapErr(ctx, "range", err)
	}
	if t.rev == 0 {
		t.rev = resp.Header.Revision
	}
	store := make([]kv.KeyValue, len(resp.Kvs))
	for i, p := range resp.Kvs {
		v := p.Value
		if v == nil {
			v = []byte{}
		}
		store[i] = kv.KeyValue{Key: p.Key, Value: v}
	}
	out := t.buf.Overlay(store, begin, end, limit)
	if conflict && !t.readOnly {
		r := wbuf.Observed(begin, end, limit, out)
		t.cmpRanges = append(t.cmpRanges, r)
		for _, p := range resp.Kvs {
			if r.Contains(p.Key) {
				t.noteKey(string(p.Key), p.ModRevision)
			}
		}
	}
	return out, nil
}

// read is a Get at the transaction's read revision. The first read of a
// transaction is linearizable (serializable on a one-member cluster, see
// Options.Reads) and fixes the revision; later reads at that
// revision are served from the member's local MVCC snapshot (serializable:
// a revision's contents never change), falling back to a linearizable read
// if that member has not applied the revision yet.
func (t *txn) read(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if t.rev == 0 {
		if t.s.serializable {
			opts = append(opts, clientv3.WithSerializable())
		}
		return t.s.kv.Get(ctx, key, opts...)
	}
	opts = append(opts, clientv3.WithRev(t.rev))
	resp, err := t.s.kv.Get(ctx, key, append(opts, clientv3.WithSerializable())...)
	if errors.Is(err, rpctypes.ErrFutureRev) {
		resp, err = t.s.kv.Get(ctx, key, opts...)
	}
	return resp, err
}

// prefetchBatch bounds the reads of one prefetch round trip (an external
// etcd accepts 128 operations per transaction by default).
const prefetchBatch = 128

var _ kv.Prefetcher = (*txn)(nil)

// Prefetch reads the keys not yet read in one etcd transaction of plain
// Gets (several for more than prefetchBatch keys) at the read revision
// (the first read of the transaction fixes it, as read does), and keeps
// them as point reads are kept. A transaction of Gets only is served
// like a Range: from the member's state when its Gets are serializable.
func (t *txn) Prefetch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	vals, oks := make([][]byte, len(keys)), make([]bool, len(keys))
	var need []string
	var seen map[string]bool
	for _, k := range keys {
		if _, _, found := t.buf.Lookup(k); found {
			continue
		}
		if _, cached := t.got[string(k)]; cached || seen[string(k)] {
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[string(k)] = true
		need = append(need, string(k))
	}
	for len(need) > 0 {
		n := min(len(need), prefetchBatch)
		if err := t.prefetchOnce(ctx, need[:n]); err != nil {
			return nil, nil, err
		}
		need = need[n:]
	}
	for i, k := range keys {
		if v, ok, found := t.buf.Lookup(k); found {
			vals[i], oks[i] = v, ok
			continue
		}
		g := t.got[string(k)]
		vals[i], oks[i] = g.val, g.ok
	}
	return vals, oks, nil
}

func (t *txn) prefetchOnce(ctx context.Context, keys []string) error {
	var opts []clientv3.OpOption
	if t.rev != 0 {
		opts = append(opts, clientv3.WithRev(t.rev), clientv3.WithSerializable())
	} else if t.s.serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(k, opts...)
	}
	resp, err := t.s.kv.Txn(ctx).Then(ops...).Commit()
	if errors.Is(err, rpctypes.ErrFutureRev) && t.rev != 0 {
		for i, k := range keys {
			ops[i] = clientv3.OpGet(k, clientv3.WithRev(t.rev))
		}
		resp, err = t.s.kv.Txn(ctx).Then(ops...).Commit()
	}
	if err != nil {
		return mapErr(ctx, "prefetch", err)
	}
	if len(resp.Responses) != len(keys) {
		return fmt.Errorf("%w: etcdkv: prefetch of %d keys answered %d", kv.ErrUnavailable, len(keys), len(resp.Responses))
	}
	if t.rev == 0 {
		t.rev = resp.Header.Revision
	}
	if t.got == nil {
		t.got = make(map[string]gotKey, len(keys))
	}
	for i, k := range keys {
		r := resp.Responses[i].GetResponseRange()
		if r == nil {
			return fmt.Errorf("%w: etcdkv: prefetch of %q: not a range response", kv.ErrUnavailable, k)
		}
		var g gotKey
		if g.ok = len(r.Kvs) > 0; g.ok {
			g.val, g.mod = r.Kvs[0].Value, r.Kvs[0].ModRevision
			if g.val == nil {
				g.val = []byte{}
			}
		}
		t.got[k] = g
	}
	return nil
}

func (t *txn) commit(ctx context.Context) error {
	if t.buf.Empty() {
		return nil
	}
	cmps := make([]clientv3.Cmp, 0, len(t.cmpKeys)+len(t.cmpRanges))
	for k, mod := range t.cmpKeys {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", mod))
	}
	for _, r := range t.cmpRanges {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(r.Begin)).WithRange(endKey(r.End)), "<", t.rev+1))
	}
	ranges, keys, ops := t.buf.Normalized()
	writes := make([]clientv3.Op, 0, len(ranges)+len(keys))
	for _, r := range ranges {
		writes = append(writes, clientv3.OpDelete(string(r.Begin), clientv3.WithRange(endKey(r.End))))
	}
	for i, k := range keys {
		if ops[i].Delete {
			writes = append(writes, clientv3.OpDelete(k))
		} else {
			writes = append(writes, clientv3.OpPut(k, string(ops[i].Value)))
		}
	}
	resp, err := t.s.kv.Txn(ctx).If(cmps...).Then(writes...).Commit()
	if err != nil {
		return mapErr(ctx, "commit", err)
	}
	if !resp.Succeeded {
		return errRetry
	}
	return nil
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
func (t *txn) Set(key, value []byte)         { t.buf.Set(key, value) }
func (t *txn) Delete(key []byte)             { t.buf.Delete(key) }
func (t *txn) DeleteRange(begin, end []byte) { t.buf.DeleteRange(begin, end) }

// ParseSpec splits "//h1:p1,h2:p2/prefix/?cacert=CA&cert=CERT&key=KEY"
// (the part after "etcd:") into endpoints, a key prefix (default
// "ffkit/") and the TLS files (nil without a query): with them the store
// connects over TLS, verifies etcd against CA and presents CERT/KEY as its
// client certificate.
func ParseSpec(rest string) (endpoints []string, prefix string, files *TLSFiles, err error) {
	s, ok := strings.CutPrefix(rest, "//")
	if !ok {
		return nil, "", nil, fmt.Errorf("%w: etcd:%s: want etcd://HOST:PORT[,HOST:PORT...][/PREFIX][?cacert=CA&cert=CERT&key=KEY]", kv.ErrBadSpec, rest)
	}
	s, query, hasQuery := strings.Cut(s, "?")
	if hasQuery {
		q, err := url.ParseQuery(query)
		if err != nil {
			return nil, "", nil, fmt.Errorf("%w: etcd:%s: bad query: %v", kv.ErrBadSpec, rest, err)
		}
		for k := range q {
			if k != "cacert" && k != "cert" && k != "key" {
				return nil, "", nil, fmt.Errorf("%w: etcd:%s: unknown parameter %q (want cacert, cert, key)", kv.ErrBadSpec, rest, k)
			}
		}
		files = &TLSFiles{CA: q.Get("cacert"), Cert: q.Get("cert"), Key: q.Get("key")}
		if files.CA == "" || (files.Cert == "") != (files.Key == "") {
			return nil, "", nil, fmt.Errorf("%w: etcd:%s: TLS needs cacert, and cert with key", kv.ErrBadSpec, rest)
		}
	}
	hosts, p, _ := strings.Cut(s, "/")
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			endpoints = append(endpoints, h)
		}
	}
	if len(endpoints) == 0 {
		return nil, "", nil, fmt.Errorf("%w: etcd:%s: no HOST:PORT", kv.ErrBadSpec, rest)
	}
	if p != "" && !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return endpoints, p, files, nil
}

func init() {
	kv.RegisterBackend("etcd", func(ctx context.Context, rest string) (kv.Store, error) {
		eps, prefix, files, err := ParseSpec(rest)
		if err != nil {
			return nil, err
		}
		opts := Options{Prefix: prefix}
		if files != nil {
			if opts.TLS, err = files.ClientConfig(); err != nil {
				return nil, err
			}
		}
		return Open(ctx, eps, opts)
	})
}
