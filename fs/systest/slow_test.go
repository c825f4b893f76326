package systest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// slowWindow is the FFKIT_RETRY_WINDOW of every operation of the
// slow-node tests: none may take it whole.
const slowWindow = 20 * time.Second

// opLog runs the slow-node tests' operations (ffkit commands from the
// client host) and keeps their outcome.
type opLog struct {
	t *testing.T
	c *nsCluster

	mu       sync.Mutex // guards the fields below
	done     []time.Time
	failures []string
	longest  time.Duration

	stop chan struct{}
	wg   sync.WaitGroup
}

func newOpLog(t *testing.T, c *nsCluster) *opLog {
	return &opLog{t: t, c: c, stop: make(chan struct{})}
}

// loop runs op(i) for i = 0, 1, ... until close.
func (l *opLog) loop(op func(i int)) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			op(i)
		}
	}()
}

// close stops the loops and waits for them.
func (l *opLog) close() {
	close(l.stop)
	l.wg.Wait()
}

// op runs one command; check (maybe nil) inspects its result.
func (l *opLog) op(name string, args []string, check func() string) {
	start := time.Now()
	out, code := l.c.run([]string{fmt.Sprintf("FFKIT_RETRY_WINDOW=%v", slowWindow)}, args...)
	d := time.Since(start)
	msg := ""
	if code != 0 {
		msg = fmt.Sprintf("%s: exit %d: %s", name, code, out)
	} else if check != nil {
		msg = check()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.longest = max(l.longest, d)
	if msg != "" {
		l.failures = append(l.failures, msg)
		return
	}
	l.done = append(l.done, time.Now())
}

// count fails the test on any failure so far and returns how many
// operations succeeded.
func (l *opLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.failures {
		l.t.Error(f)
	}
	if len(l.failures) > 0 {
		l.t.FailNow()
	}
	return len(l.done)
}

// rate waits for k more operations and returns how many per second
// completed between the first and the last of them.
func (l *opLog) rate(what string, k int) float64 {
	l.t.Helper()
	from := l.count()
	deadline := time.Now().Add(5 * time.Minute)
	for l.count() < from+k+1 {
		if time.Now().After(deadline) {
			l.t.Fatalf("%s: only %d operations in 5 min", what, l.count()-from)
		}
		time.Sleep(50 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return float64(k) / l.done[from+k].Sub(l.done[from]).Seconds()
}

// checkLongest fails the test if an operation took the whole retry
// window.
func (l *opLog) checkLongest() {
	l.mu.Lock()
	long := l.longest
	l.mu.Unlock()
	l.t.Logf("longest operation %v (retry window %v)", long.Round(time.Millisecond), slowWindow)
	if long >= slowWindow {
		l.t.Errorf("an operation took %v, the whole retry window", long)
	}
}

// throttle limits host victim's link to rate (tc tbf on its eth0) until
// the returned function is called (also at cleanup); it skips the test
// where tc cannot.
func throttle(t *testing.T, c *nsCluster, victim int, rate string) (lift func()) {
	t.Helper()
	if err := tcCmd(c.nn.hosts[victim], "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"); err != nil {
		t.Skipf("cannot throttle here: %v", err)
	}
	var once sync.Once
	lift = func() {
		once.Do(func() {
			if err := tcCmd(c.nn.hosts[victim], "qdisc", "del", "dev", "eth0", "root"); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(lift)
	return lift
}

// waitTakenOut waits until mgmtd has logged node victim slow and none of
// its targets serves, and returns how long that took from start.
func waitTakenOut(t *testing.T, c *nsCluster, victim int, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	slowLine := fmt.Sprintf("node %d is slow", victim)
	for {
		b, _ := os.ReadFile(filepath.Join(c.dir, "mgmtd.log"))
		st, err := c.status()
		out := strings.Contains(string(b), slowLine) && err == nil
		if out {
			for _, ch := range st.Chains {
				for _, tg := range ch.Targets {
					out = out && (tg.Node != victim || tg.State != "serving")
				}
			}
		}
		if out {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("throttled node %d not taken out of its chains in %v (status %+v)", victim, within, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// logsOnFailure logs the tails of mgmtd's and the victim's logs if the
// test failed.
func logsOnFailure(t *testing.T, c *nsCluster, victim int) {
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"mgmtd.log", fmt.Sprintf("storage-%d.log", victim)} {
				b, _ := os.ReadFile(filepath.Join(c.dir, name))
				if len(b) > 8000 {
					b = b[len(b)-8000:]
				}
				t.Logf("---- %s (tail) ----\n%s", name, b)
			}
		}
	})
}

// TestSlowStorageNodeTakenOut (issue 16, item 3): one storage host of the
// namespace cluster throttled to 8 Mbit/s (tc tbf on its link: under 1%
// of the others') while writers (fs put) and readers (fs get, checked)
// run from the client host. Reads hedge away from it and report it to
// mgmtd, which takes its targets out of their chains (log line, status):
// writes go on at the speed of the two healthy members. Once the throttle
// is lifted and its hold has ended it returns through resync and every
// target serves again. The test counts operations in a window before the
// throttle and in one while the node is out, and compares the rates
// (ours, not a wall-clock speed); no operation may fail or take longer
// than the retry window. Before, the slow node stayed in every chain:
// writes crawled at its pace and it was never taken out.
func TestSlowStorageNodeTakenOut(t *testing.T) {
	if _, err := exec.LookPath("tc"); err != nil {
		t.Skip("needs tc")
	}
	if testing.Short() {
		t.Skip("throttles a host of a namespace cluster")
	}
	c := startNSCluster(t, 2)
	const victim = 2
	logsOnFailure(t, c, victim)
	var want [][]byte
	for i := 0; i < 3; i++ {
		src := filepath.Join(c.dir, fmt.Sprintf("r%d.bin", i))
		want = append(want, randomFile(t, src, 4<<20+i)) // chunks on both chains
		c.firstPut(src, fmt.Sprintf("/r%d.bin", i))
	}
	l := newOpLog(t, c)
	for w := 0; w < 2; w++ {
		src := filepath.Join(c.dir, fmt.Sprintf("w%d.bin", w))
		randomFile(t, src, 1<<20)
		l.loop(func(i int) { // writer
			l.op("put", []string{"fs", "put", "--token-file", c.tokenFile, src, c.url + fmt.Sprintf("/w%d-%d.bin", w, i)}, nil)
		})
		dst := filepath.Join(c.dir, fmt.Sprintf("got%d.bin", w))
		l.loop(func(i int) { // reader
			k := (i + w) % len(want)
			l.op("get", []string{"fs", "get", "--token-file", c.tokenFile, c.url + fmt.Sprintf("/r%d.bin", k), dst}, func() string {
				if b, _ := os.ReadFile(dst); !bytes.Equal(b, want[k]) {
					return fmt.Sprintf("get r%d.bin: other bytes", k)
				}
				return ""
			})
		})
	}
	defer l.close()
	const k = 12
	l.rate("warm-up", 4)
	before := l.rate("unthrottled", k)

	lift := throttle(t, c, victim, "8mbit")
	took := waitTakenOut(t, c, victim, time.Now(), 3*time.Minute)
	t.Logf("throttled node %d taken out of its chains %v after the throttle began", victim, took.Round(time.Millisecond))
	during := l.rate("throttled", k)
	t.Logf("operations per second (puts of 1 MiB and checked gets of 4 MiB, 2 of each at a time): %.2f unthrottled, %.2f with node %d throttled to 8 Mbit/s and out of its chains (%.2fx)",
		before, during, victim, during/before)
	if during < before/5 {
		t.Errorf("with one node throttled the cluster ran at %.2f operations/s against %.2f before", during, before)
	}
	lift()
	// Its hold ends and it returns through resync.
	c.waitServing(3, 6)
	if b, _ := os.ReadFile(filepath.Join(c.dir, "mgmtd.log")); !strings.Contains(string(b), fmt.Sprintf("node %d's hold for slowness ended", victim)) {
		t.Errorf("mgmtd did not log node %d's return", victim)
	}
	l.rate("after", 4)
	l.checkLongest()
}

// TestSlowForwarderTakenOut (issue 16, item 3, slow at forwarding): with
// only writers running (nobody reads, so no reader reports latency), the
// storage host that is never a chain's head (node 3: the tail of chain 1
// and the middle of chain 2, whose updates it forwards) is throttled to
// 8 Mbit/s. Every write to chain 2 waits on its forward; its acks and
// those of chain 1 wait behind that traffic. The heads and node 3 itself
// report their forwards' round trips (and the writers their writes to the
// heads) with their heartbeats and routing requests; mgmtd finds node 3
// the one end common to the slow hops and takes it out of its chains, and
// writes go on without it: no put fails or takes the retry window, and
// every acknowledged file reads back. Before, only readers reported
// latency: the slow forwarder was never found, and every write of chain 2
// crawled at its pace.
func TestSlowForwarderTakenOut(t *testing.T) {
	if _, err := exec.LookPath("tc"); err != nil {
		t.Skip("needs tc")
	}
	if testing.Short() {
		t.Skip("throttles a host of a namespace cluster")
	}
	c := startNSCluster(t, 2)
	const victim = 3
	logsOnFailure(t, c, victim)
	src0 := filepath.Join(c.dir, "first.bin")
	randomFile(t, src0, 4096)
	c.firstPut(src0, "/first.bin")
	st, err := c.status()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range st.Chains {
		if ch.Targets[0].Node == victim {
			t.Fatalf("node %d heads chain %d: the test wants a node that only forwards (%+v)", victim, ch.ID, st.Chains)
		}
	}
	l := newOpLog(t, c)
	var mu sync.Mutex // guards acked
	acked := map[string][]byte{}
	for w := 0; w < 3; w++ {
		src := filepath.Join(c.dir, fmt.Sprintf("w%d.bin", w))
		data := randomFile(t, src, 2<<20+w) // chunks on both chains
		l.loop(func(i int) {                // writer
			name := fmt.Sprintf("/w%d-%d.bin", w, i)
			l.op("put", []string{"fs", "put", "--token-file", c.tokenFile, src, c.url + name}, func() string {
				mu.Lock()
				acked[name] = data
				mu.Unlock()
				return ""
			})
		})
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			l.close()
		}
	}
	defer stop()
	l.rate("warm-up", 3)

	lift := throttle(t, c, victim, "8mbit")
	took := waitTakenOut(t, c, victim, time.Now(), 2*time.Minute)
	t.Logf("throttled node %d (never a head; nobody reads) taken out of its chains %v after the throttle began", victim, took.Round(time.Millisecond))
	during := l.rate("throttled", 6)
	t.Logf("puts of 2 MiB per second with node %d out: %.2f", victim, during)
	lift()
	c.waitServing(3, 6)
	stop()
	l.checkLongest()
	// Acknowledged files read back (six of them, any: each read is a
	// process).
	var names []string
	for name := range acked {
		names = append(names, name)
	}
	dst := filepath.Join(c.dir, "got.bin")
	for i, name := range names {
		if i == 6 {
			break
		}
		if out, code := c.run(nil, "fs", "get", "--token-file", c.tokenFile, c.url+name, dst); code != 0 {
			t.Fatalf("get %s: exit %d: %s", name, code, out)
		}
		if b, _ := os.ReadFile(dst); !bytes.Equal(b, acked[name]) {
			t.Errorf("get %s: other bytes than were put", name)
		}
	}
}
