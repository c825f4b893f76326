package fstest

import (
	"context"
	"testing"
	"time"
)

// Readier is a cluster manager that can wait until the cluster serves
// (mgmtd.Server).
type Readier interface {
	WaitReady(ctx context.Context) error
}

// WaitReady fails t unless m reports the cluster ready within d.
func WaitReady(t testing.TB, m Readier, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := m.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}
