package backoff

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
)

func TestWaitGrowsToMax(t *testing.T) {
	b := New(time.Microsecond, 5*time.Microsecond)
	var steps []time.Duration
	for range 5 {
		steps = append(steps, b.d)
		if err := b.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Doubles while below max, so it may pass max once, then stays.
	want := []time.Duration{1, 2, 4, 8, 8}
	for i := range want {
		if steps[i] != want[i]*time.Microsecond {
			t.Fatalf("steps %v, want %v µs", steps, want)
		}
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	b := New(time.Hour, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a cancelled context: %v", err)
	}
	if b.d != time.Hour {
		t.Fatalf("a cancelled wait grew the step to %v", b.d)
	}
}

func TestRetry(t *testing.T) {
	conflict := errors.New("test: conflict")
	ctx := context.Background()
	// Conflicts, then success: tried until it passes.
	n := 0
	err := New(time.Microsecond, time.Microsecond).Retry(ctx, 5, "testkv", conflict, func() error {
		if n++; n < 3 {
			return fmt.Errorf("commit: %w", conflict)
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("Retry = %v after %d tries, want nil after 3", err, n)
	}
	// Another error ends it at once.
	other := errors.New("test: other")
	n = 0
	err = New(time.Microsecond, time.Microsecond).Retry(ctx, 5, "testkv", conflict, func() error { n++; return other })
	if !errors.Is(err, other) || n != 1 {
		t.Fatalf("Retry = %v after %d tries, want the error after 1", err, n)
	}
	// The budget runs out: kv.ErrConflict naming the backend.
	n = 0
	err = New(time.Microsecond, time.Microsecond).Retry(ctx, 4, "testkv", conflict, func() error { n++; return conflict })
	if !errors.Is(err, kv.ErrConflict) || !strings.Contains(err.Error(), "testkv: gave up after 4 attempts") || n != 4 {
		t.Fatalf("Retry = %v after %d tries, want kv.ErrConflict after 4", err, n)
	}
	// A cancelled context: no attempt.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	n = 0
	err = New(time.Microsecond, time.Microsecond).Retry(cctx, 4, "testkv", conflict, func() error { n++; return nil })
	if !errors.Is(err, context.Canceled) || n != 0 {
		t.Fatalf("Retry on a cancelled context = %v after %d tries", err, n)
	}
}
