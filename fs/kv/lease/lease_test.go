package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func fencedWrite(ctx context.Context, s kv.Store, l *Lease, key, val string) error {
	return s.Update(ctx, func(tx kv.Txn) error {
		if err := l.Fence(ctx, tx); err != nil {
			return err
		}
		tx.Set([]byte(key), []byte(val))
		return nil
	})
}

func TestTakeoverAndFencing(t *testing.T) {
	ctx := context.Background()
	s := memkv.New(memkv.Options{})
	clk := &clock{now: time.Unix(1000, 0)}
	key := []byte("mgmtd/lease")
	a, _ := New(s, Options{Key: key, ID: "a", TTL: 5 * time.Second, Now: clk.Now})
	b, _ := New(s, Options{Key: key, ID: "b", TTL: 5 * time.Second, Now: clk.Now})

	if held, err := a.TryAcquire(ctx); !held || err != nil {
		t.Fatalf("a: %v %v", held, err)
	}
	if held, err := b.TryAcquire(ctx); held || err != nil {
		t.Fatalf("b took a held lease: %v %v", held, err)
	}
	if err := fencedWrite(ctx, s, a, "state", "from a"); err != nil {
		t.Fatalf("primary's fenced write: %v", err)
	}
	if err := fencedWrite(ctx, s, b, "state", "from b"); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("standby's fenced write: %v", err)
	}
	// a renews in time: still a's.
	clk.Add(3 * time.Second)
	if held, _ := a.TryAcquire(ctx); !held {
		t.Fatal("renewal failed")
	}
	clk.Add(3 * time.Second)
	if held, _ := b.TryAcquire(ctx); held {
		t.Fatal("b took a renewed lease")
	}
	// a dies (stops renewing): after the TTL, b takes over with a new epoch.
	clk.Add(3 * time.Second)
	if held, err := b.TryAcquire(ctx); !held || err != nil {
		t.Fatalf("b after expiry: %v %v", held, err)
	}
	if b.Epoch() != 2 {
		t.Fatalf("epoch %d, want 2", b.Epoch())
	}
	// The old primary still thinks it holds epoch 1; its writes must not land.
	if err := fencedWrite(ctx, s, a, "state", "late a"); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("old primary's write after takeover: %v", err)
	}
	if err := fencedWrite(ctx, s, b, "state", "from b"); err != nil {
		t.Fatal(err)
	}
	if held, _ := a.TryAcquire(ctx); held {
		t.Fatal("old primary re-took a held lease")
	}
	// Resign hands over at once.
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if held, _ := a.TryAcquire(ctx); !held {
		t.Fatal("lease not free after resign")
	}
}

// A takeover that commits while the old primary's transaction is open
// makes that transaction retry and fail: no write of the old primary lands
// after the takeover, whatever the clocks say.
func TestFenceRace(t *testing.T) {
	ctx := context.Background()
	s := memkv.New(memkv.Options{})
	clk := &clock{now: time.Unix(1000, 0)}
	key := []byte("lease")
	a, _ := New(s, Options{Key: key, ID: "a", TTL: 5 * time.Second, Now: clk.Now})
	b, _ := New(s, Options{Key: key, ID: "b", TTL: 5 * time.Second, Now: func() time.Time { return clk.Now().Add(time.Hour) }}) // b's clock runs far ahead
	if held, _ := a.TryAcquire(ctx); !held {
		t.Fatal("a")
	}
	runs := 0
	err := s.Update(ctx, func(tx kv.Txn) error {
		runs++
		if err := a.Fence(ctx, tx); err != nil {
			return err
		}
		if runs == 1 {
			if held, err := b.TryAcquire(ctx); !held || err != nil {
				t.Fatalf("b: %v %v", held, err)
			}
		}
		tx.Set([]byte("state"), []byte("a"))
		return nil
	})
	if !errors.Is(err, ErrNotHolder) || runs != 2 {
		t.Fatalf("old primary's racing write: err=%v after %d runs", err, runs)
	}
	var got []byte
	s.View(ctx, func(tx kv.ReadTxn) error { got, _, _ = tx.Get(ctx, []byte("state")); return nil })
	if got != nil {
		t.Fatalf("old primary's write landed: %q", got)
	}
}

func TestCampaignAndHold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := memkv.New(memkv.Options{})
	key := []byte("lease")
	a, _ := New(s, Options{Key: key, ID: "a", TTL: 300 * time.Millisecond})
	b, _ := New(s, Options{Key: key, ID: "b", TTL: 300 * time.Millisecond})
	if err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(ctx)
	holdErr := make(chan error, 1)
	go func() { holdErr <- a.Hold(actx) }()
	won := make(chan error, 1)
	go func() { won <- b.Campaign(ctx) }()
	select {
	case err := <-won:
		t.Fatalf("b won while a holds: %v", err)
	case <-time.After(time.Second):
	}
	acancel() // a dies
	<-holdErr
	start := time.Now()
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	if !b.Held() || a.Held() && a.Epoch() == b.Epoch() {
		t.Fatal("two holders")
	}
	t.Logf("standby took over %v after the primary stopped", time.Since(start))
}
