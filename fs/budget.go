package fs

import (
	"context"
	"sync"
)

// Budget bounds the reads in flight across concurrent batched reads that
// share it, without splitting the bound between them: a batch may use all
// of it while the others plan, check or drain their last reads. A loader
// that reads several batches at once thereby keeps the device's queue at
// the budget instead of letting each batch's tail run it down.
//
// A Budget is safe for concurrent use. The zero value and nil are
// unlimited.
type Budget struct {
	mu   sync.Mutex
	max  int
	free int
	wake chan struct{} // closed when tokens come back while someone waits
}

// NewBudget returns a budget of n reads in flight (n <= 0: unlimited, nil).
func NewBudget(n int) *Budget {
	if n <= 0 {
		return nil
	}
	return &Budget{max: n, free: n}
}

// TryTake takes up to n reads' worth without waiting and returns how many
// it took.
func (b *Budget) TryTake(n int) int {
	if b == nil || b.max == 0 {
		return n
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k := min(n, b.free)
	b.free -= k
	return k
}

// Take waits until at least one read's worth is free, then takes up to n
// and returns how many. It returns ctx's error if ctx ends first.
func (b *Budget) Take(ctx context.Context, n int) (int, error) {
	if b == nil || b.max == 0 || n <= 0 {
		return n, nil
	}
	for {
		b.mu.Lock()
		if b.free > 0 {
			k := min(n, b.free)
			b.free -= k
			b.mu.Unlock()
			return k, nil
		}
		if b.wake == nil {
			b.wake = make(chan struct{})
		}
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Give returns n reads' worth taken earlier.
func (b *Budget) Give(n int) {
	if b == nil || b.max == 0 || n <= 0 {
		return
	}
	b.mu.Lock()
	b.free += n
	if b.free > b.max {
		b.mu.Unlock()
		panic("fs: Budget.Give returned more than was taken")
	}
	if b.wake != nil {
		close(b.wake)
		b.wake = nil
	}
	b.mu.Unlock()
}
