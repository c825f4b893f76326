package scan

import (
	"context"
	"errors"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"
)

// orderedMap consumes every result once, in index order, never two at a
// time; a work or consume error stops it and every result not consumed is
// released; a cancelled context ends it.
func TestOrderedMap(t *testing.T) {
	work := func(ctx context.Context, i int) (*int, error) {
		time.Sleep(time.Duration(rand.Intn(300)) * time.Microsecond)
		v := i * 2
		return &v, nil
	}
	for _, par := range []int{1, 2, 5} {
		var next int
		var busy atomic.Int32
		err := orderedMap(bg, 200, par, work, func(i int, v *int) error {
			if busy.Add(1) != 1 {
				t.Error("consume called concurrently")
			}
			defer busy.Add(-1)
			if i != next || *v != 2*i {
				t.Errorf("par %d: got result %d (%d), want %d", par, i, *v, next)
			}
			next++
			return nil
		}, func(*int) { t.Error("release of a consumed result") })
		if err != nil || next != 200 {
			t.Fatalf("par %d: %d consumed, err %v", par, next, err)
		}
	}
	boom := errors.New("boom")
	for _, failIn := range []string{"work", "consume"} {
		var made, consumed, released atomic.Int32
		err := orderedMap(bg, 500, 3, func(ctx context.Context, i int) (*int, error) {
			if failIn == "work" && i == 50 {
				return nil, boom
			}
			made.Add(1)
			return &i, nil
		}, func(i int, v *int) error {
			consumed.Add(1)
			if failIn == "consume" && i == 50 {
				return boom
			}
			return nil
		}, func(*int) { released.Add(1) })
		if !errors.Is(err, boom) {
			t.Fatalf("%s error: got %v", failIn, err)
		}
		if made.Load() != consumed.Load()+released.Load() {
			t.Fatalf("%s error: %d results made, %d consumed + %d released", failIn, made.Load(), consumed.Load(), released.Load())
		}
	}
	ctx, cancel := context.WithCancel(bg)
	var n atomic.Int32
	err := orderedMap(ctx, 1000, 2, func(ctx context.Context, i int) (*int, error) {
		if n.Add(1) == 20 {
			cancel()
		}
		return &i, nil
	}, func(int, *int) error { return nil }, func(*int) {})
	if !errors.Is(err, context.Canceled) || n.Load() >= 1000 {
		t.Fatalf("cancelled: err %v after %d items", err, n.Load())
	}
}
