package storage

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ffkit/ffkit/fs/proto"
)

// slot is a chunk's write slot on a target: the core's "one update in
// flight per chunk per hop" (fs/storage/chain). One update, re-drive or
// resync transfer of the chunk holds it, from building its pending
// version through the successor's acknowledgement to its local commit;
// the next ones wait in arrival order (the core's queue of writes at the
// head) and are handed the slot in that order. It is state, guarded by
// Target.mu, not a mutex held across the network: a waiter whose caller
// gives up (its context ends, the service stops, or, for an update from a
// predecessor or a resync transfer, the sender's call timeout passed: it
// resends) leaves the queue and is answered ErrBusy (retryable), instead
// of staying blocked until the update ahead of it ends, up to
// ForwardTimeout later, and then answering a call nobody waits for; background work (the re-drive of stuck pending
// versions) asks without waiting. Independent chunks never wait for each
// other.
type slot struct {
	held  bool
	queue []chan struct{} // waiters in arrival order; closed when handed the slot
	ver   uint64          // the version the holder works on (0: not known yet)
}

// acquire takes chunk c's write slot, waiting behind the updates of the
// chunk ahead of it, or fails with ErrBusy when ctx ends first or, if
// patience > 0, after waiting that long (the caller's own call timeout:
// no one awaits the answer after it).
func (t *Target) acquire(ctx context.Context, id proto.ChunkID, c *chunk, patience time.Duration) error {
	t.mu.Lock()
	if !c.slot.held {
		c.slot.held, c.slot.ver = true, 0
		t.mu.Unlock()
		return nil
	}
	turn := make(chan struct{})
	c.slot.queue = append(c.slot.queue, turn)
	ahead := c.slot.ver
	t.mu.Unlock()
	if patience > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, patience)
		defer cancel()
	}
	select {
	case <-turn:
		return nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	if i := slices.Index(c.slot.queue, turn); i >= 0 {
		c.slot.queue = slices.Delete(c.slot.queue, i, i+1)
		t.mu.Unlock()
		return fmt.Errorf("%w: chunk %v on target %d: waited behind its update v%d: %w", proto.ErrBusy, id, t.ID, ahead, ctx.Err())
	}
	t.mu.Unlock()
	// Handed the slot as the caller gave up: pass it on.
	t.release(c)
	return fmt.Errorf("%w: chunk %v on target %d: %w", proto.ErrBusy, id, t.ID, ctx.Err())
}

// tryAcquire takes chunk c's write slot if no one holds it.
func (t *Target) tryAcquire(c *chunk) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.slot.held {
		return false
	}
	c.slot.held, c.slot.ver = true, 0
	return true
}

// working records the version the slot's holder works on (for errors and
// the metrics of waiters).
func (t *Target) working(c *chunk, ver uint64) {
	t.mu.Lock()
	c.slot.ver = ver
	t.mu.Unlock()
}

// release hands chunk c's write slot to the first waiter, or frees it.
func (t *Target) release(c *chunk) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c.slot.ver = 0
	if len(c.slot.queue) == 0 {
		c.slot.held = false
		return
	}
	next := c.slot.queue[0]
	c.slot.queue = c.slot.queue[1:]
	close(next)
}
