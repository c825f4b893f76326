// Package lease is primary election over a kv.Store: one key holds the
// current holder, its epoch and an expiry time. A candidate takes the key
// when it is free or expired; the holder renews it well before it
// expires; a standby campaigning in the background takes over once the
// primary stops renewing (it died or lost the store).
//
// Fencing: Fence reads the lease key with a conflict-checked Get inside the
// caller's write transaction and fails unless this holder still owns it
// with its epoch and an unexpired time. Because the read is conflict
// checked, a write of an old primary can never commit after a takeover:
// either it serialises before the takeover (it was primary then), or the
// takeover changed the key it read and its transaction retries, sees the
// new holder, and fails with ErrNotHolder. Clocks only decide when a
// standby may take over and when a primary stops trusting itself; they
// are not needed for the fencing.
//
// mgmtd uses it (Options.Fence); it is reusable by anything with a single
// active instance. A Lease is safe for concurrent use.
package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrNotHolder: this instance does not hold the lease (any more).
var ErrNotHolder = errkind.New(errkind.Unavailable, "lease: not the lease holder")

// Options configure a Lease.
type Options struct {
	// Key is the lease's key in the store. Required.
	Key []byte
	// ID names this candidate (unique among candidates). Required.
	ID string
	// TTL is how long a lease lasts without renewal. Default 5 s.
	TTL time.Duration
	// RenewEvery is how often the holder renews and a standby retries.
	// Default TTL/4.
	RenewEvery time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Record is the stored value of the lease key.
type Record struct {
	Holder  string `json:"holder"`
	Epoch   uint64 `json:"epoch"`
	Expires int64  `json:"expires_unix_nano"`
}

// Lease is one candidate's view of a lease.
type Lease struct {
	store kv.Store
	opts  Options

	mu      sync.Mutex
	epoch   uint64    // guarded by mu; 0 when not holding
	expires time.Time // guarded by mu
}

// New returns a candidate for the lease at opts.Key.
func New(store kv.Store, opts Options) (*Lease, error) {
	if len(opts.Key) == 0 || opts.ID == "" {
		return nil, fmt.Errorf("lease: a key and a candidate id are required")
	}
	if opts.TTL <= 0 {
		opts.TTL = 5 * time.Second
	}
	if opts.RenewEvery <= 0 {
		opts.RenewEvery = opts.TTL / 4
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Lease{store: store, opts: opts}, nil
}

func decode(v []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(v, &r); err != nil {
		return r, errkind.Wrap(errkind.Data, fmt.Errorf("lease: corrupt lease record %q: %w", v, err))
	}
	return r, nil
}

// Read returns the stored record (ok=false if nobody ever held the lease).
func Read(ctx context.Context, store kv.Store, key []byte) (rec Record, ok bool, err error) {
	err = store.View(ctx, func(tx kv.ReadTxn) error {
		v, found, err := tx.Get(ctx, key)
		if err != nil || !found {
			ok = false
			return err
		}
		ok = true
		rec, err = decode(v)
		return err
	})
	return rec, ok, err
}

// TryAcquire takes or renews the lease if it is free, expired or already
// ours, and reports whether this candidate holds it now.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	var held bool
	var rec Record
	err := l.store.Update(ctx, func(tx kv.Txn) error {
		held = false
		v, ok, err := tx.Get(ctx, l.opts.Key)
		if err != nil {
			return err
		}
		now := l.opts.Now()
		var cur Record
		if ok {
			if cur, err = decode(v); err != nil {
				return err
			}
		}
		l.mu.Lock()
		myEpoch := l.epoch
		l.mu.Unlock()
		switch {
		case ok && cur.Holder == l.opts.ID && cur.Epoch == myEpoch && myEpoch != 0:
			rec = cur // renewal
		case ok && cur.Holder == l.opts.ID && myEpoch == 0:
			// An earlier incarnation of this candidate (same ID: a restart
			// on the same address) held it: take over at once, with a new
			// epoch that fences anything the old one still tries.
			rec = Record{Holder: l.opts.ID, Epoch: cur.Epoch + 1}
		case !ok || now.UnixNano() >= cur.Expires:
			rec = Record{Holder: l.opts.ID, Epoch: cur.Epoch + 1} // takeover
		default:
			return nil // someone else holds it
		}
		rec.Expires = now.Add(l.opts.TTL).UnixNano()
		b, _ := json.Marshal(rec)
		tx.Set(l.opts.Key, b)
		held = true
		return nil
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		return false, err
	}
	if held {
		l.epoch = rec.Epoch
		l.expires = time.Unix(0, rec.Expires)
	} else {
		l.epoch = 0
	}
	return held, nil
}

// Campaign blocks until this candidate holds the lease or ctx ends.
func (l *Lease) Campaign(ctx context.Context) error {
	t := time.NewTicker(l.opts.RenewEvery)
	defer t.Stop()
	for {
		held, err := l.TryAcquire(ctx)
		if held {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_ = err // a store that cannot be reached: keep trying
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Hold renews the lease until ctx ends or the lease is lost (another
// holder took it, or renewals failed until it expired); it returns
// ErrNotHolder then, or ctx's error.
func (l *Lease) Hold(ctx context.Context) error {
	t := time.NewTicker(l.opts.RenewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		held, err := l.TryAcquire(ctx)
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if !held && err == nil {
			return fmt.Errorf("%w: %s lost the lease", ErrNotHolder, l.opts.ID)
		}
		if err != nil && !l.Held() {
			return fmt.Errorf("%w: %s could not renew before expiry: %v", ErrNotHolder, l.opts.ID, err)
		}
	}
}

// Held reports whether this candidate believes it holds the lease: it won
// it and the lease has not expired by the local clock. Use Fence for
// decisions written to the store.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch != 0 && l.opts.Now().Before(l.expires)
}

// Epoch is the epoch this candidate holds (0: none); it increases with
// every change of holder, so it can tag a primary's messages.
func (l *Lease) Epoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch
}

// Fence fails with ErrNotHolder unless this candidate holds the lease, as
// read inside tx with a conflict-checked Get. Call it first in every write
// transaction of the primary.
func (l *Lease) Fence(ctx context.Context, tx kv.Txn) error {
	l.mu.Lock()
	myEpoch := l.epoch
	l.mu.Unlock()
	v, ok, err := tx.Get(ctx, l.opts.Key)
	if err != nil {
		return err
	}
	if !ok || myEpoch == 0 {
		return fmt.Errorf("%w: %s", ErrNotHolder, l.opts.ID)
	}
	rec, err := decode(v)
	if err != nil {
		return err
	}
	if rec.Holder != l.opts.ID || rec.Epoch != myEpoch {
		return fmt.Errorf("%w: %s (epoch %d); held by %s (epoch %d)", ErrNotHolder, l.opts.ID, myEpoch, rec.Holder, rec.Epoch)
	}
	if l.opts.Now().UnixNano() >= rec.Expires {
		return fmt.Errorf("%w: %s: the lease expired", ErrNotHolder, l.opts.ID)
	}
	return nil
}

// Resign gives the lease up (a clean shutdown), so a standby takes over at
// once instead of after the TTL.
func (l *Lease) Resign(ctx context.Context) error {
	l.mu.Lock()
	myEpoch := l.epoch
	l.epoch = 0
	l.mu.Unlock()
	if myEpoch == 0 {
		return nil
	}
	return l.store.Update(ctx, func(tx kv.Txn) error {
		v, ok, err := tx.Get(ctx, l.opts.Key)
		if err != nil || !ok {
			return err
		}
		rec, err := decode(v)
		if err != nil {
			return err
		}
		if rec.Holder != l.opts.ID || rec.Epoch != myEpoch {
			return nil
		}
		rec.Expires = 0
		b, _ := json.Marshal(rec)
		tx.Set(l.opts.Key, b)
		return nil
	})
}

// Serve runs run while this candidate holds the lease: it campaigns, then
// calls run with a context that is cancelled when the lease is lost (or
// ctx ends), and campaigns again after a loss. run must stop acting as
// primary when its context ends; every write it makes should call Fence.
// Serve returns nil when ctx ends (resigning the lease so a standby takes
// over at once), or run's error if run fails on its own.
func Serve(ctx context.Context, l *Lease, run func(ctx context.Context) error) error {
	for {
		if err := l.Campaign(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		rctx, cancel := context.WithCancel(ctx)
		held := make(chan error, 1)
		go func() {
			held <- l.Hold(rctx)
			cancel()
		}()
		err := run(rctx)
		cancel()
		<-held
		if ctx.Err() != nil || err != nil && rctx.Err() == nil {
			rctx2, c2 := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			l.Resign(rctx2)
			c2()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		// The lease was lost: campaign again as a standby.
	}
}
