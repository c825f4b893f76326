package systest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/proto"
)

// upProcs is an `ffkit fs up` started by a test, with the pids it printed.
type upProcs struct {
	cmd    *exec.Cmd
	done   chan struct{}
	url    string
	pids   map[string]int
	stderr string // fs up's stderr file
}

// startFSUp runs `ffkit fs up` with the given extra flags and waits until
// it printed its URL and the pids of every process (the metadata servers'
// last).
func startFSUp(t *testing.T, dir string, extra ...string) *upProcs {
	t.Helper()
	args := append([]string{"fs", "up", "--dir", dir}, extra...)
	u := &upProcs{cmd: exec.Command(ffkitBin, args...), done: make(chan struct{}), pids: map[string]int{}, stderr: dir + ".log"}
	u.cmd.Stderr, _ = os.Create(u.stderr)
	out, _ := u.cmd.StdoutPipe()
	if err := u.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		u.cmd.Wait()
		close(u.done)
	}()
	t.Cleanup(func() {
		u.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-u.done:
		case <-time.After(30 * time.Second):
			u.cmd.Process.Kill()
			<-u.done
		}
	})
	deadline := time.After(90 * time.Second)
	for u.url == "" || u.pids["meta-2"] == 0 {
		select {
		case l, ok := <-lines:
			if !ok {
				b, _ := os.ReadFile(u.stderr)
				t.Fatalf("fs up exited: %s", b)
			}
			if strings.HasPrefix(l, "ffkit://") {
				u.url = l
			}
			var name string
			var pid int
			if _, err := fmt.Sscanf(l, "pid %s %d", &name, &pid); err == nil {
				u.pids[name] = pid
			}
		case <-deadline:
			t.Fatalf("fs up not ready within 90s (logs in %s/logs)", dir)
		}
	}
	return u
}

// TestFSUpMgmtdFreezeAndKill (issue 16, item 4): a frozen mgmtd must not
// stop I/O, and a killed one is replaced. `fs up` runs two mgmtd
// processes (primary and standby on the embedded store); two writers and
// readers run chunk I/O throughout. SIGSTOP of the primary: I/O goes on
// (the storage services stop serving only briefly, until the standby
// takes over, and then serve on without any resync); SIGCONT; then kill
// -9 of the new primary: a mgmtd takes over again and fs up restarts the
// killed one. No operation fails, every acknowledged chunk reads back
// with its bytes, and every target serves at the end. Before, SIGSTOP of
// mgmtd (then inside fs up) stopped all I/O until SIGCONT, and every
// target went through resync.
func TestFSUpMgmtdFreezeAndKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and freezes its mgmtd")
	}
	base := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(base, "config"))
	t.Setenv("FFKIT_TOKEN", "")
	dir := filepath.Join(base, "cluster")
	u := startFSUp(t, dir, "--heartbeat", "200ms", "--fail-timeout", "2s", "--chunk-size", "1MiB")
	addrs := strings.Split(strings.TrimPrefix(u.url, "ffkit://"), ",")
	if len(addrs) != 2 || u.pids["mgmtd-2"] == 0 {
		t.Fatalf("fs up runs no standby mgmtd: URL %s, pids %v", u.url, u.pids)
	}
	token, err := client.ReadTokenFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cl, err := client.Dial(ctx, addrs, client.Options{Token: token, RequestTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	chains := cl.Chains()
	startVers := map[client.ChainID]uint64{}
	for _, id := range chains {
		startVers[id] = cl.Routing().Chain(id).Version
	}

	// The workload: each worker writes a new chunk, then reads it and an
	// older one back; every acknowledged chunk is remembered.
	var (
		ops, failures atomic.Int64 // operations that succeeded, failed
		mu            sync.Mutex
		acked         = map[proto.ChunkID][]byte{}
		longest       time.Duration
		wg            sync.WaitGroup
	)
	body := func(id proto.ChunkID) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("chunk %d/%d;", id.Inode, id.Index)), 200)
	}
	chainOf := func(id proto.ChunkID) client.ChainID { return chains[int(id.Index)%len(chains)] }
	timed := func(f func() error) error {
		start := time.Now()
		err := f()
		d := time.Since(start)
		mu.Lock()
		longest = max(longest, d)
		mu.Unlock()
		if err != nil && ctx.Err() != nil {
			return err // cut short by the end of the test
		}
		if err != nil {
			failures.Add(1)
			t.Errorf("I/O failed after %v: %v", d.Round(time.Millisecond), err)
		} else {
			ops.Add(1)
		}
		return err
	}
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(0); ctx.Err() == nil; i++ {
				id := proto.ChunkID{Inode: uint64(5000 + w), Index: i}
				data := body(id)
				if timed(func() error { return cl.WriteChunk(ctx, chainOf(id), id, 0, data) }) != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				mu.Lock()
				acked[id] = data
				mu.Unlock()
				old := proto.ChunkID{Inode: id.Inode, Index: i / 2}
				mu.Lock()
				want := acked[old]
				mu.Unlock()
				buf := make([]byte, len(want))
				if timed(func() error {
					return cl.ReadChunks(ctx, []client.ChunkRead{{Chain: chainOf(old), Chunk: old, Buf: buf}})
				}) == nil && !bytes.Equal(buf, want) {
					t.Errorf("chunk %v read back other bytes", old)
				}
			}
		}()
	}
	stopWorkers := func() {
		cancel()
		wg.Wait()
	}
	defer stopWorkers()
	// progress waits until n more operations succeeded.
	progress := func(what string, n int64, cond func() bool) {
		t.Helper()
		from := ops.Load()
		deadline := time.Now().Add(2 * time.Minute)
		for ops.Load() < from+n || (cond != nil && !cond()) {
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(u.stderr)
				t.Fatalf("%s: %d operations in 2 minutes (want %d)\nfs up: %s", what, ops.Load()-from, n, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	serving := func(addr string) bool {
		c, err := client.Dial(context.Background(), []string{addr}, client.Options{Token: token, RequestTimeout: time.Second, RetryTimeout: time.Second})
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	progress("before any fault", 20, nil)

	// 1. The primary (mgmtd-1) frozen: the standby takes over and I/O goes
	// on while the primary stays frozen.
	frozen := u.pids["mgmtd"]
	if err := syscall.Kill(frozen, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { syscall.Kill(frozen, syscall.SIGCONT) }
	defer cont()
	frozenAt := time.Now()
	// The fault lasts until the standby serves and 10 s at least (five
	// fail timeouts: every storage service has long stopped hearing from
	// mgmtd-1)...
	for !serving(addrs[1]) || time.Since(frozenAt) < 10*time.Second {
		if time.Since(frozenAt) > 2*time.Minute {
			t.Fatalf("the standby does not serve 2 minutes after the primary froze")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// ...and then I/O goes on under the standby while mgmtd-1 is frozen.
	progress("mgmtd-1 frozen for 10 s, the standby serving", 40, nil)
	cont()
	mu.Lock()
	t.Logf("mgmtd-1 frozen: the standby took over; %d operations so far, longest %v", ops.Load(), longest)
	longest = 0
	mu.Unlock()

	// 2. The new primary (mgmtd-2) killed: a mgmtd takes over again (the
	// resumed mgmtd-1, or mgmtd-2 restarted by fs up) and I/O goes on.
	if err := syscall.Kill(u.pids["mgmtd-2"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	progress("mgmtd-2 killed", 40, func() bool {
		b, _ := os.ReadFile(u.stderr)
		return bytes.Contains(b, []byte("ffkit: mgmtd mgmtd-2 pid")) && (serving(addrs[0]) || serving(addrs[1]))
	})
	stopWorkers()

	// Nothing lost: every acknowledged chunk reads back.
	mu.Lock()
	defer mu.Unlock()
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	for id, want := range acked {
		buf := make([]byte, len(want))
		if err := cl.ReadChunks(rctx, []client.ChunkRead{{Chain: chainOf(id), Chunk: id, Buf: buf}}); err != nil || !bytes.Equal(buf, want) {
			t.Fatalf("acknowledged chunk %v: %v (bytes equal: %v)", id, err, bytes.Equal(buf, want))
		}
	}
	// Every target serves (wait for it: a takeover may have been slow on
	// a loaded host and dropped a target, which then resyncs).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		cl.Refresh(rctx)
		ok := true
		for _, id := range chains {
			if len(cl.Routing().Chain(id).Readable()) != 3 {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every target serves again: %+v", cl.Routing().Chains)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, id := range chains {
		t.Logf("chain %d: v%d at the start, v%d at the end (%s)", id, startVers[id], cl.Routing().Chain(id).Version, cl.Routing().Chain(id))
	}
	if failures.Load() > 0 {
		t.Fatalf("%d operations failed", failures.Load())
	}
	t.Logf("%d operations, none failed, %d chunks read back; longest operation after the kill %v", ops.Load(), len(acked), longest)
	if t.Failed() || testing.Verbose() {
		for _, name := range []string{"mgmtd-1", "mgmtd-2", "storage-1"} {
			b, _ := os.ReadFile(filepath.Join(dir, "logs", name+".log"))
			t.Logf("%s.log:\n%s", name, b)
		}
	}
}
