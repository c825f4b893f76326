package systest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/client"
)

// fsUp runs `ffkit fs up` and returns its output lines once the URL and
// the pids are printed.
func fsUp(t *testing.T, dir string) (*exec.Cmd, []string, chan struct{}) {
	t.Helper()
	cmd := exec.Command(ffkitBin, "fs", "up", "--dir", dir, "--heartbeat", "100ms", "--fail-timeout", "1s", "--chunk-size", "1MiB")
	cmd.Stderr, _ = os.Create(filepath.Join(dir + ".log"))
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		cmd.Wait()
		close(done)
	}()
	var got []string
	deadline := time.After(60 * time.Second)
	for len(got) < 5 {
		select {
		case l, ok := <-lines:
			if !ok {
				b, _ := os.ReadFile(dir + ".log")
				t.Fatalf("fs up exited: %q\n%s", got, b)
			}
			got = append(got, l)
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("fs up not ready: %q", got)
		}
	}
	return cmd, got, done
}

func stopUp(t *testing.T, cmd *exec.Cmd, lines []string, done chan struct{}) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("fs up did not stop on SIGTERM")
	}
	for _, l := range lines[1:] {
		var name string
		var pid int
		fmt.Sscanf(l, "pid %s %d", &name, &pid)
		if pid > 0 && syscall.Kill(pid, 0) == nil {
			t.Errorf("%s (pid %d) still running after fs up stopped", name, pid)
		}
	}
}

// TestFsUpStatusRestart: `fs up` prints the URL only when ready, then the
// pids; the token is private and recorded for the URL; `fs status --json`
// has the documented shape; SIGTERM stops every process; a second `fs up`
// on the same directory brings the same cluster, URL and data back.
func TestFsUpStatusRestart(t *testing.T) {
	base := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(base, "config"))
	t.Setenv("FFKIT_TOKEN", "")
	dir := filepath.Join(base, "cluster")
	cmd, lines, done := fsUp(t, dir)
	url := lines[0]
	if !strings.HasPrefix(url, "ffkit://127.0.0.1:") || !strings.HasPrefix(lines[1], "pid mgmtd ") || !strings.HasPrefix(lines[2], "pid storage-1 ") {
		t.Fatalf("fs up output: %q", lines)
	}
	st, err := os.Stat(filepath.Join(dir, "token"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", err, st.Mode())
	}
	auth := strings.TrimPrefix(url, "ffkit://")
	token, err := client.LookupToken(auth)
	if err != nil {
		t.Fatalf("token not recorded for %s: %v", url, err)
	}
	out, err := exec.Command(ffkitBin, "--json", "fs", "status", "--cluster", url).Output()
	if err != nil {
		t.Fatalf("fs status: %v", err)
	}
	var status struct {
		RoutingVersion uint64 `json:"routing_version"`
		Chains         []struct {
			ID      uint32 `json:"id"`
			Version uint64 `json:"version"`
			Targets []struct {
				ID    uint32 `json:"id"`
				Node  uint32 `json:"node"`
				State string `json:"state"`
			} `json:"targets"`
		} `json:"chains"`
	}
	if err := json.Unmarshal(out, &status); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out)
	}
	if status.RoutingVersion == 0 || len(status.Chains) != 2 {
		t.Fatalf("status: %s", out)
	}
	for _, ch := range status.Chains {
		if len(ch.Targets) != 3 {
			t.Fatalf("chain %d has %d targets", ch.ID, len(ch.Targets))
		}
		for _, tg := range ch.Targets {
			if tg.State != "serving" {
				t.Fatalf("target %d is %s after fs up printed its URL", tg.ID, tg.State)
			}
		}
	}
	// A wrong token is refused.
	if _, err := client.Dial(context.Background(), strings.Split(auth, ","), client.Options{Token: "wrong", RequestTimeout: time.Second}); err == nil {
		t.Fatal("a wrong token was accepted")
	}
	cl, err := client.Dial(context.Background(), strings.Split(auth, ","), client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("survives a restart of the whole cluster")
	if err := cl.WriteChunk(context.Background(), 2, client.ChunkID{Inode: 3, Index: 4}, 100, data); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	stopUp(t, cmd, lines, done)

	start := time.Now()
	cmd, lines2, done := fsUp(t, dir)
	t.Logf("restarted cluster ready in %v", time.Since(start).Round(time.Millisecond))
	if lines2[0] != url {
		t.Fatalf("restart came back on %s, not %s", lines2[0], url)
	}
	cl, err = client.Dial(context.Background(), strings.Split(auth, ","), client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	rd := []client.ChunkRead{{Chain: 2, Chunk: client.ChunkID{Inode: 3, Index: 4}, Off: 100, Buf: make([]byte, len(data))}}
	if err := cl.ReadChunks(context.Background(), rd); err != nil || string(rd[0].Buf) != string(data) {
		t.Fatalf("data after restart: %v %q", err, rd[0].Buf)
	}
	cl.Close()
	stopUp(t, cmd, lines2, done)
}
