package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/internal/testbin"

	"github.com/ffkit/ffkit/fs/clusterfs"
	"github.com/ffkit/ffkit/fs/fstest"
)

// clusterBinary builds ffkit once for the cluster tests.
func clusterBinary(t *testing.T) string {
	t.Helper()
	return testbin.Path(t)
}

// upCluster is a running `ffkit fs up`.
type upCluster struct {
	cmd  *exec.Cmd
	url  string
	pids map[string]int
	env  []string
	done chan error
	dir  string

	mu       sync.Mutex
	metaPids map[string]int // guarded by mu: "meta-1" -> pid, from fs up's stderr
}

// syncBuffer is a bytes.Buffer safe for one writer and readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) WriteString(x string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(x)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startUp runs `ffkit fs up` with short timers and a private HOME (so the
// token file is the test's own) and waits for its URL line.
func startUp(t *testing.T, dir string) *upCluster {
	t.Helper()
	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "FFKIT_TOKEN=")
	cmd := exec.Command(clusterBinary(t), "fs", "up", "--dir", dir, "--heartbeat", "200ms", "--fail-timeout", "1500ms", "--chunk-size", "1MiB")
	cmd.Env = env
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	u := &upCluster{cmd: cmd, pids: map[string]int{}, env: env, done: make(chan error, 1), dir: dir, metaPids: map[string]int{}}
	go func() {
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			l := sc.Text()
			stderr.WriteString(l + "\n")
			var name string
			var pid int
			if _, err := fmt.Sscanf(l, "ffkit: metadata server %s pid %d", &name, &pid); err == nil {
				u.mu.Lock()
				u.metaPids[name] = pid
				u.mu.Unlock()
			}
		}
	}()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		u.done <- cmd.Wait()
	}()
	t.Cleanup(func() { u.stop(t) })
	timeout := time.After(90 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("fs up exited before it was ready: %s", stderr.String())
			}
			if strings.HasPrefix(l, "ffkit://") {
				u.url = l
			} else if f := strings.Fields(l); len(f) == 3 && f[0] == "pid" {
				u.pids[f[1]], _ = strconv.Atoi(f[2])
			}
			// Every service's pid is on stdout, the metadata servers' last.
			if u.url != "" && u.pids["storage-3"] != 0 && u.pids[fmt.Sprintf("meta-%d", upMetaServers)] != 0 {
				return u
			}
		case <-timeout:
			t.Fatalf("fs up not ready within 90s: %s", stderr.String())
		}
	}
}

func (u *upCluster) stop(t *testing.T) {
	if u.cmd.Process == nil || u.cmd.ProcessState != nil {
		return
	}
	u.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-u.done:
	case <-time.After(30 * time.Second):
		u.cmd.Process.Kill()
		<-u.done
	}
}

// run runs ffkit with the cluster's environment and returns stdout and the exit code.
func (u *upCluster) run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(clusterBinary(t), args...)
	cmd.Env = u.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Logf("ffkit %s: exit %d: %s", strings.Join(args, " "), code, stderr.String())
	}
	return stdout.String(), code
}

func (u *upCluster) must(t *testing.T, args ...string) string {
	t.Helper()
	out, code := u.run(t, args...)
	if code != 0 {
		t.Fatalf("ffkit %s: exit %d", strings.Join(args, " "), code)
	}
	return out
}

// End to end on real processes: the file commands on ffkit:// paths, then a
// dataset packed onto the cluster, a storage process killed with SIGKILL,
// and the dataset verified and loaded to the end with every checksum good.
func TestClusterEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	u := startUp(t, t.TempDir())
	U := u.url

	// File commands.
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "tree", "sub"), 0o755)
	big := make([]byte, 3<<20+123)
	for i := range big {
		big[i] = byte(rand.Uint32())
	}
	os.WriteFile(filepath.Join(src, "tree", "big.bin"), big, 0o644)
	os.WriteFile(filepath.Join(src, "tree", "sub", "small.txt"), []byte("hello\n"), 0o644)
	// put and get keep modes and modification times, of directories too.
	t1, t2 := time.Unix(1_000_000_000, 123456789), time.Unix(1_100_000_000, 5)
	os.Chmod(filepath.Join(src, "tree", "big.bin"), 0o750)
	os.Chtimes(filepath.Join(src, "tree", "big.bin"), t1, t1)
	os.Chmod(filepath.Join(src, "tree", "sub"), 0o700)
	os.Chtimes(filepath.Join(src, "tree", "sub"), t2, t2)
	u.must(t, "fs", "mkdir", U+"/up")
	df0 := dfCheck(t, u, U)
	u.must(t, "fs", "put", filepath.Join(src, "tree"), U+"/up")
	// Storage services report their targets' use in every heartbeat: df
	// shows the file's bytes on every replica (3 x size, over the targets
	// of the chains its chunks went to) within a few heartbeats.
	want := df0.Used + 3*int64(len(big))
	deadline := time.Now().Add(15 * time.Second)
	df1 := dfCheck(t, u, U)
	for df1.Used < want && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		df1 = dfCheck(t, u, U)
	}
	if df1.Used < want {
		t.Fatalf("df: used %d after writing %d bytes x 3 replicas, want >= %d (before: %d)", df1.Used, len(big), want, df0.Used)
	}
	grew := 0
	for i, tg := range df1.Targets {
		if tg.ID == df0.Targets[i].ID && tg.Used > df0.Targets[i].Used {
			grew++
		}
	}
	if grew < 3 {
		t.Fatalf("df: the use of only %d targets grew: %+v", grew, df1.Targets)
	}
	if out := u.must(t, "fs", "df", U); !strings.Contains(out, "CAPACITY") || !strings.Contains(out, "total") {
		t.Fatalf("df output:\n%s", out)
	}
	var rows []fileRow
	if err := json.Unmarshal([]byte(u.must(t, "--json", "fs", "ls", U+"/up/tree")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Name != "big.bin" || rows[0].Size != int64(len(big)) || !rows[1].IsDir {
		t.Fatalf("ls: %+v", rows)
	}
	if rows[0].Mode != "-rwxr-x---" || !rows[0].ModTime.Equal(t1) || rows[1].Mode != "drwx------" || !rows[1].ModTime.Equal(t2) {
		t.Fatalf("ls: modes and times not kept by put: %+v", rows)
	}
	if out := u.must(t, "fs", "ls", U+"/up/tree"); !strings.Contains(out, "-rwxr-x--- ") || !strings.Contains(out, "2001-09-09 01:46:40") {
		t.Fatalf("ls:\n%s", out)
	}
	if _, code := u.run(t, "fs", "stat", U+"/up/missing"); code != 1 {
		t.Fatalf("stat of a missing path exited %d, want 1", code)
	}
	dst := t.TempDir()
	u.must(t, "fs", "get", U+"/up/tree", dst)
	if got, _ := os.ReadFile(filepath.Join(dst, "tree", "big.bin")); !bytes.Equal(got, big) {
		t.Fatal("get: big.bin differs")
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "tree", "sub", "small.txt")); string(got) != "hello\n" {
		t.Fatalf("get: small.txt = %q", got)
	}
	for p, want := range map[string]struct {
		mode os.FileMode
		t    time.Time
	}{"big.bin": {0o750, t1}, "sub": {os.ModeDir | 0o700, t2}} {
		if fi, err := os.Stat(filepath.Join(dst, "tree", p)); err != nil || fi.Mode() != want.mode || !fi.ModTime().Equal(want.t) {
			t.Fatalf("get: %s: %v %v %v, want %v %v", p, err, fi.Mode(), fi.ModTime(), want.mode, want.t)
		}
	}
	u.must(t, "fs", "mv", U+"/up/tree/big.bin", U+"/up/moved.bin")
	if _, code := u.run(t, "fs", "rm", U+"/up/tree"); code == 0 {
		t.Fatal("rm of a non-empty directory succeeded")
	}
	u.must(t, "fs", "rm", "-r", U+"/up/tree")
	if df := dfCheck(t, u, U); df.Files != 1 || df.Bytes != int64(len(big)) {
		t.Fatalf("df: %+v", df)
	}

	// Kill a metadata server process in the middle of creates, renames
	// and removes: every operation takes effect exactly once.
	metaKillTest(t, u)

	// A dataset on the cluster.
	samples := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 1500; i++ {
		b := make([]byte, 500+rng.IntN(8000))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		os.WriteFile(filepath.Join(samples, fmt.Sprintf("s%05d.bin", i)), b, 0o644)
	}
	u.must(t, "pack", samples, "-o", U+"/ds", "--shard-size", "2M")
	u.must(t, "verify", U+"/ds")

	// Kill a storage process; the data is still all there and good.
	if err := syscall.Kill(u.pids["storage-2"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	out := u.must(t, "verify", U+"/ds")
	if !strings.Contains(out, "1500 samples") {
		t.Fatalf("verify after the kill: %s", out)
	}
	var load struct {
		Samples int64 `json:"samples"`
	}
	lo := u.must(t, "--json", "load", U+"/ds", "--batch-size", "64", "--shuffle", "--seed", "3")
	if err := json.Unmarshal([]byte(lo), &load); err != nil {
		t.Fatalf("load --json: %v: %s", err, lo)
	}
	if load.Samples != 1500 {
		t.Fatalf("load delivered %d samples, want 1500: %s", load.Samples, lo)
	}
	// Writes go on too: the cluster reconfigured around the dead process.
	u.must(t, "fs", "put", filepath.Join(src, "tree", "big.bin"), U+"/after-kill.bin")
	got := filepath.Join(t.TempDir(), "back.bin")
	u.must(t, "fs", "get", U+"/after-kill.bin", got)
	if b, _ := os.ReadFile(got); !bytes.Equal(b, big) {
		t.Fatal("a file written after the kill reads back different")
	}
}

// dfCheck runs `fs df --json` and checks what holds at any time: six
// targets, each with a measured capacity, free <= capacity, and totals
// that add up.
func dfCheck(t *testing.T, u *upCluster, url string) dfReport {
	t.Helper()
	var df dfReport
	if err := json.Unmarshal([]byte(u.must(t, "--json", "fs", "df", url)), &df); err != nil {
		t.Fatal(err)
	}
	if len(df.Targets) != 6 || df.Capacity <= 0 || df.Free > df.Capacity {
		t.Fatalf("df: %+v", df)
	}
	var used int64
	for _, tg := range df.Targets {
		if tg.Capacity <= 0 || tg.Free < 0 || tg.Free > tg.Capacity || tg.Used < 0 || tg.Chain == 0 || tg.State != "serving" || tg.AgeSec < 0 {
			t.Fatalf("df: target %+v", tg)
		}
		used += tg.Used
	}
	if used != df.Used {
		t.Fatalf("df: total used %d, targets sum to %d", df.Used, used)
	}
	return df
}

func metaKillTest(t *testing.T, u *upCluster) {
	t.Helper()
	ctx := context.Background()
	tok, err := os.ReadFile(filepath.Join(u.dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := clusterfs.Open(ctx, strings.TrimPrefix(u.url, "ffkit://"), clusterfs.Options{Token: strings.TrimSpace(string(tok)), RetryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u.mu.Lock()
	victim := u.metaPids["meta-1"]
	u.mu.Unlock()
	if victim == 0 {
		t.Fatal("fs up did not report the metadata servers' pids")
	}
	fstest.Churn{Prefix: "/mk", Workers: 3}.Run(t, f, func() {
		time.Sleep(time.Second)
		if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	})
}
