// Package backoff is the retry loop of Update that the memkv and etcdkv
// backends share: run the transaction again while it conflicts, up to a
// budget, waiting a jittered and growing time between attempts so that
// contending transactions spread out instead of meeting again. A Backoff
// belongs to one Update call and is not safe for concurrent use.
package backoff

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
)

// Backoff is a jittered exponential backoff.
type Backoff struct {
	d, max time.Duration
}

// New returns a Backoff whose first wait is about first; each wait doubles
// the next while it is below max.
func New(first, max time.Duration) *Backoff { return &Backoff{d: first, max: max} }

// Wait sleeps a random time in [d/2, 3d/2), d the current step, then grows
// the step. It returns ctx's error if ctx ends first.
func (b *Backoff) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.d/2 + rand.N(b.d)):
	}
	if b.d < b.max {
		b.d *= 2
	}
	return nil
}

// Retry runs try until it returns anything but an error matching retry
// (the backend's conflict), waiting between attempts. After maxAttempts
// attempts that all conflicted it gives up with kv.ErrConflict, naming
// backend; it checks ctx before every attempt and ends with ctx's error.
func (b *Backoff) Retry(ctx context.Context, maxAttempts int, backend string, retry error, try func() error) error {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := try()
		if !errors.Is(err, retry) {
			return err
		}
		if attempt+1 >= maxAttempts {
			return fmt.Errorf("%w: %s: gave up after %d attempts", kv.ErrConflict, backend, attempt+1)
		}
		if err := b.Wait(ctx); err != nil {
			return err
		}
	}
}
