package loader

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
)

// stallFS is local files behind a switch: while stalled, every batched read
// blocks until its context is cancelled, like a hung network mount. It is
// registered for stalltest:// URLs (the path after the authority is local).
type stallFS struct {
	*localfs.FS
	stalled atomic.Bool
	blocked atomic.Int64
}

var stall = &stallFS{FS: localfs.New()}

func init() {
	fs.RegisterScheme("stalltest", func(ctx context.Context, authority string) (fs.FS, error) { return stall, nil })
}

func (s *stallFS) ReadBatch(ctx context.Context, reqs []fs.ReadRequest) error {
	if s.stalled.Load() {
		s.blocked.Add(1)
		defer s.blocked.Add(-1)
		<-ctx.Done()
		return ctx.Err()
	}
	return s.FS.ReadBatch(ctx, reqs)
}

// ReadBatchN shadows localfs's capability so ffrecord's reads come here.
func (s *stallFS) ReadBatchN(ctx context.Context, reqs []fs.ReadRequest, _ int) error {
	return s.ReadBatch(ctx, reqs)
}

func TestWatchdogNamesStuckStageAndFile(t *testing.T) {
	dir := makeDataset(t, t.TempDir(), "a", 400, 2)
	url := "stalltest://x" + dir
	base := runtime.NumGoroutine()

	var mu sync.Mutex
	var logs []string
	// Next waits until the second report (however slow a loaded machine
	// makes the timers), then gives up through its context.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := Options{BatchSize: 10, Shuffle: true, Watchdog: 60 * time.Millisecond,
		Log: func(s string) {
			mu.Lock()
			logs = append(logs, s)
			if len(logs) == 2 {
				cancel()
			}
			mu.Unlock()
		}}

	// Healthy reads through the wrapper first.
	l := mustOpen(t, []string{url}, o)
	if got := drain(t, l, 3); len(got) != 3 {
		t.Fatal("no batches through the wrapper")
	}
	// Hang the storage; reporting mode keeps waiting and logs every period.
	stall.stalled.Store(true)
	defer stall.stalled.Store(false)
	if err := l.SetEpoch(1); err != nil {
		t.Fatal(err)
	}
	_, err := l.Next(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Next on hung storage: %v", err)
	}
	mu.Lock()
	report := strings.Join(logs, "\n")
	mu.Unlock()
	if !strings.Contains(report, "is reading") || !strings.Contains(report, "PART_0000") {
		t.Fatalf("report does not name the stage and file:\n%s", report)
	}
	if l.Stats().Stalls < 2 {
		t.Fatalf("stats count %d stalls", l.Stats().Stalls)
	}
	// Close while reads hang: returns, and nothing is left behind.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// FailOnStall: Next gives up with ErrStalled.
	o.FailOnStall = true
	l2 := mustOpen(t, []string{url}, o)
	_, err = l2.Next(context.Background())
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("FailOnStall: %v", err)
	}
	if e := errorContains(err, "reading", "PART_0000"); e != nil {
		t.Fatal(e)
	}
	l2.Close()
	stall.stalled.Store(false)
	waitGoroutines(t, base)
	if b := stall.blocked.Load(); b != 0 {
		t.Fatalf("%d reads still blocked after Close", b)
	}
}
