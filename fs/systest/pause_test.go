package systest

import (
	"syscall"
	"testing"
	"time"
)

// A storage process frozen with SIGSTOP for a while around the fail
// timeout (issue #16's first failure) rejoins and serves again once
// continued, with no other event in the cluster: its targets move through
// the phases by the routing on every heartbeat (chain.NextPhase), not only
// when mgmtd publishes a newer routing. Writes go on meanwhile and nothing
// acknowledged is lost.
func TestPausedStorageRejoins(t *testing.T) {
	c := newCluster(t, 3)
	m := newModel()
	stop := c.writers(m, 2)
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	waitWrites(t, m, 10, 2*time.Minute)
	for i, factor := range []float64{0.5, 1, 2, 5} {
		victim := 1 + i%c.n
		p := c.storage[victim]
		pause := time.Duration(factor * float64(failTimeout))
		t.Logf("SIGSTOP storage-%d for %v (%.1fx the fail timeout)", victim, pause, factor)
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause) // the fault itself, not a wait for a condition
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Generous: a loaded CI machine; an idle cluster rejoins in a few
		// heartbeats. The old code never rejoined (no newer routing).
		c.waitServing(3 * time.Minute)
		waitWrites(t, m, 5, 2*time.Minute)
	}
	n := stop()
	stop = nil
	t.Logf("%d writes acknowledged", n)
	c.check(m, true)
}
