package bench

import (
	"sync"
	"time"
)

// Clock is where the core reads time. Benchmarks use Wall; tests inject a
// ManualClock that the code under test advances, so rates are exact and
// no test depends on the machine's speed.
type Clock interface {
	// Now returns the current time. Only differences between two Now
	// values are used.
	Now() time.Time
	// Sleep waits for d (a ManualClock advances itself by d instead).
	Sleep(d time.Duration)
}

// Wall is the real clock (monotonic readings from time.Now).
var Wall Clock = wallClock{}

type wallClock struct{}

func (wallClock) Now() time.Time        { return time.Now() }
func (wallClock) Sleep(d time.Duration) { time.Sleep(d) }

// ManualClock is a Clock that only moves when Advance or Sleep is called.
// It is safe for concurrent use; concurrent Sleeps add up, which models a
// device that serves one request at a time (its rate is shared by all
// callers).
type ManualClock struct {
	mu sync.Mutex
	t  time.Time // guarded by mu
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{t: start} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d (negative d is ignored).
func (c *ManualClock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Sleep advances the clock by d and returns at once.
func (c *ManualClock) Sleep(d time.Duration) { c.Advance(d) }
