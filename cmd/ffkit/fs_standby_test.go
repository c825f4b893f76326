package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv/etcdkv"
)

// Two `ffkit fs mgmtd` processes on one three-member etcd cluster: the
// first is primary, the second a standby. SIGKILL the primary: the standby
// takes over, and a client given both addresses carries on.
func TestMgmtdStandbyProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an etcd cluster and mgmtd processes")
	}
	ctx := context.Background()
	cl, err := etcdkv.StartCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	spec := "etcd://" + strings.Join(cl.Endpoints(), ",") + "/standby/"
	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "FFKIT_TOKEN=")
	tf := filepath.Join(home, "token")
	os.WriteFile(tf, []byte("sekrit\n"), 0o600)
	addrA, _ := etcdkv.FreeAddr()
	addrB, _ := etcdkv.FreeAddr()

	start := func(name, addr string) (*exec.Cmd, chan string) {
		cmd := exec.Command(clusterBinary(t), "fs", "mgmtd", "--dir", filepath.Join(home, name), "--kv", spec, "--listen", addr,
			"--lease-ttl", "1s", "--metrics-listen", "", "--token-file", tf, "--heartbeat", "200ms", "--fail-timeout", "1s")
		cmd.Env = env
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 4)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, lines
	}
	wait := func(lines chan string, d time.Duration) string {
		select {
		case l := <-lines:
			return l
		case <-time.After(d):
			return ""
		}
	}
	a, aLines := start("a", addrA)
	if u := wait(aLines, 30*time.Second); u != "ffkit://"+addrA {
		t.Fatalf("primary printed %q", u)
	}
	_, bLines := start("b", addrB)
	if u := wait(bLines, 2*time.Second); u != "" {
		t.Fatalf("the standby serves while the primary is alive: %q", u)
	}
	status := func() uint64 {
		cmd := exec.Command(clusterBinary(t), "--json", "fs", "status", "--cluster", "ffkit://"+addrA+","+addrB, "--token-file", tf)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("fs status: %v", err)
		}
		var st struct {
			Version uint64 `json:"routing_version"`
		}
		json.Unmarshal(out, &st)
		return st.Version
	}
	v1 := status()
	a.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	if u := wait(bLines, 20*time.Second); u != "ffkit://"+addrB {
		t.Fatalf("standby did not take over: %q", u)
	}
	t.Logf("standby serving %v after the primary was killed", time.Since(killed).Round(time.Millisecond))
	if v2 := status(); v2 < v1 {
		t.Fatalf("routing version went back: %d after the takeover, %d before", v2, v1)
	}
}
