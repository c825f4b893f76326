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
	var want [][]byte
	for i := 0; i < 3; i++ {
		src := filepath.Join(c.dir, fmt.Sprintf("r%d.bin", i))
		want = append(want, randomFile(t, src, 4<<20+i)) // chunks on both chains
		c.firstPut(src, fmt.Sprintf("/r%d.bin", i))
	}
	const window = 20 * time.Second // FFKIT_RETRY_WINDOW of every operation
	env := []string{fmt.Sprintf("FFKIT_RETRY_WINDOW=%v", window)}

	var mu sync.Mutex // guards the fields below
	var done []time.Time
	var failures []string
	var longest time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	op := func(name string, args []string, check func() string) {
		start := time.Now()
		out, code := c.run(env, args...)
		d := time.Since(start)
		msg := ""
		if code != 0 {
			msg = fmt.Sprintf("%s: exit %d: %s", name, code, out)
		} else if check != nil {
			msg = check()
		}
		mu.Lock()
		defer mu.Unlock()
		longest = max(longest, d)
		if msg != "" {
			failures = append(failures, msg)
			return
		}
		done = append(done, time.Now())
	}
	for w := 0; w < 2; w++ {
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			src := filepath.Join(c.dir, fmt.Sprintf("w%d.bin", w))
			randomFile(t, src, 1<<20)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				op("put", []string{"fs", "put", "--token-file", c.tokenFile, src, c.url + fmt.Sprintf("/w%d-%d.bin", w, i)}, nil)
			}
		}()
		go func() { // reader
			defer wg.Done()
			dst := filepath.Join(c.dir, fmt.Sprintf("got%d.bin", w))
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := i % len(want)
				op("get", []string{"fs", "get", "--token-file", c.tokenFile, c.url + fmt.Sprintf("/r%d.bin", k), dst}, func() string {
					if b, _ := os.ReadFile(dst); !bytes.Equal(b, want[k]) {
						return fmt.Sprintf("get r%d.bin: other bytes", k)
					}
					return ""
				})
			}
		}()
	}
	throttled := false
	defer func() {
		close(stop)
		wg.Wait()
		if throttled {
			tcCmd(c.nn.hosts[victim], "qdisc", "del", "dev", "eth0", "root")
		}
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range failures {
			t.Error(f)
		}
		if len(failures) > 0 {
			t.FailNow()
		}
		return len(done)
	}
	// rate waits for k more operations and returns how many per second
	// completed between the first and the last of them.
	rate := func(what string, k int) float64 {
		t.Helper()
		from := count()
		deadline := time.Now().Add(5 * time.Minute)
		for count() < from+k+1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: only %d operations in 5 min", what, count()-from)
			}
			time.Sleep(50 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		return float64(k) / done[from+k].Sub(done[from]).Seconds()
	}
	const k = 12
	rate("warm-up", 4)
	before := rate("unthrottled", k)

	mgmtdLog := filepath.Join(c.dir, "mgmtd.log")
	slowLine := fmt.Sprintf("node %d is slow", victim)
	if err := tcCmd(c.nn.hosts[victim], "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "8mbit", "burst", "32kbit", "latency", "400ms"); err != nil {
		t.Skipf("cannot throttle here: %v", err)
	}
	throttled = true
	start := time.Now()
	// mgmtd takes it out: its log says so and its targets leave serving.
	for {
		b, _ := os.ReadFile(mgmtdLog)
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
			break
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("throttled node %d not taken out of its chains in 3 min (status %+v)", victim, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("throttled node %d taken out of its chains %v after the throttle began", victim, time.Since(start).Round(time.Millisecond))
	during := rate("throttled", k)
	t.Logf("operations per second (puts of 1 MiB and checked gets of 4 MiB, 2 of each at a time): %.2f unthrottled, %.2f with node %d throttled to 8 Mbit/s and out of its chains (%.2fx)",
		before, during, victim, during/before)
	if during < before/5 {
		t.Errorf("with one node throttled the cluster ran at %.2f operations/s against %.2f before", during, before)
	}

	if err := tcCmd(c.nn.hosts[victim], "qdisc", "del", "dev", "eth0", "root"); err != nil {
		t.Fatal(err)
	}
	throttled = false
	// Its hold ends and it returns through resync.
	c.waitServing(3, 6)
	if b, _ := os.ReadFile(mgmtdLog); !strings.Contains(string(b), fmt.Sprintf("node %d's hold for slowness ended", victim)) {
		t.Errorf("mgmtd did not log node %d's return", victim)
	}
	rate("after", 4)
	mu.Lock()
	long := longest
	mu.Unlock()
	t.Logf("longest operation %v (retry window %v)", long.Round(time.Millisecond), window)
	if long >= window {
		t.Errorf("an operation took %v, the whole retry window", long)
	}
}
