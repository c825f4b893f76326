package systest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// netnet is a set of network namespaces joined by a bridge, one per
// emulated host: host i has address 10.231.0.(i+1) on its eth0. The
// bridge lives in a hub namespace of its own, so nothing is added to the
// test machine's own network; every name carries a random suffix so
// concurrent or leftover runs never collide. Close removes them all.
type netnet struct {
	t     *testing.T
	hub   string
	hosts []string
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func newNetnet(t *testing.T, n int) *netnet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	b := make([]byte, 3)
	rand.Read(b)
	sfx := hex.EncodeToString(b)
	nn := &netnet{t: t, hub: "ffk-" + sfx + "-hub"}
	if err := ipCmd("netns", "add", nn.hub); err != nil {
		t.Skipf("cannot create network namespaces: %v", err)
	}
	t.Cleanup(nn.close)
	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("-n", nn.hub, "link", "add", "br0", "type", "bridge")
	must("-n", nn.hub, "link", "set", "br0", "up")
	for i := 0; i < n; i++ {
		h := fmt.Sprintf("ffk-%s-h%d", sfx, i)
		must("netns", "add", h)
		nn.hosts = append(nn.hosts, h)
		p := fmt.Sprintf("p%d", i)
		must("-n", nn.hub, "link", "add", p, "type", "veth", "peer", "name", "eth0", "netns", h)
		must("-n", nn.hub, "link", "set", p, "master", "br0")
		must("-n", nn.hub, "link", "set", p, "up")
		must("-n", h, "addr", "add", nn.ip(i)+"/24", "dev", "eth0")
		must("-n", h, "link", "set", "eth0", "up")
		must("-n", h, "link", "set", "lo", "up")
	}
	return nn
}

func (nn *netnet) ip(i int) string { return fmt.Sprintf("10.231.0.%d", i+1) }

// cmd runs ffkit on host i (its network namespace, this mount namespace).
func (nn *netnet) cmd(i int, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + nn.hosts[i], ffkitBin}, args...)...)
}

func (nn *netnet) close() {
	for _, h := range append(nn.hosts, nn.hub) {
		if err := ipCmd("netns", "del", h); err != nil {
			nn.t.Errorf("cleanup: %v", err)
		}
	}
}

// nsProc is a service running on an emulated host.
type nsProc struct {
	cmd   *exec.Cmd
	done  chan struct{}
	ready chan struct{} // closed once first is set (or stdout ended)
	first string        // the first line on stdout
	ok    bool          // a first line came
}

func startNS(t *testing.T, cmd *exec.Cmd, logPath string) *nsProc {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &nsProc{cmd: cmd, done: make(chan struct{}), ready: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			p.first, p.ok = sc.Text(), true
		}
		close(p.ready)
		io.Copy(io.Discard, out)
		cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	select {
	case <-p.ready:
		if !p.ok {
			<-p.done
			b, _ := os.ReadFile(logPath)
			t.Fatalf("%v exited before serving:\n%s", cmd.Args, b)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("%v did not start", cmd.Args)
	}
	return p
}

func (p *nsProc) line() string { return p.first }

func (p *nsProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// TestMultiHostTLS (issue 15, test 6): mgmtd, a metadata server, three
// storage services and a client each in their own network namespace,
// talking over a bridge, so every connection is non-loopback and uses
// TLS: put, get, a FUSE mount, a storage service killed and brought back
// (resync), and a client without the cluster CA refused.
func TestMultiHostTLS(t *testing.T) {
	nn := newNetnet(t, 6) // 0 mgmtd + meta, 1..3 storage, 4 client, 5 spare
	dir := openTempDir(t)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	t.Setenv("FFKIT_TOKEN", "")
	cdir := filepath.Join(dir, "cluster")
	mg := startNS(t, nn.cmd(0, "fs", "mgmtd", "--dir", cdir, "--listen", nn.ip(0)+":7000", "--replicas", "3",
		"--expect-targets", "3", "--heartbeat", "100ms", "--fail-timeout", "1s", "--chunk-size", "1MiB"), filepath.Join(dir, "mgmtd.log"))
	url := mg.line()
	if url != "ffkit://"+nn.ip(0)+":7000" {
		t.Fatalf("mgmtd URL %q", url)
	}
	tokenFile := filepath.Join(cdir, "token")
	// The metadata store's spec, from mgmtd's log line.
	var spec string
	re := regexp.MustCompile(`state in (\S+),`)
	deadline := time.Now().Add(time.Minute)
	for spec == "" && time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(dir, "mgmtd.log"))
		if m := re.FindSubmatch(b); m != nil {
			spec = string(m[1])
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(spec, "cacert=") {
		t.Fatalf("metadata store spec %q: want TLS files", spec)
	}
	stor := map[int]*nsProc{}
	startStorage := func(i int) {
		stor[i] = startNS(t, nn.cmd(i, "fs", "storage", "--mgmtd", url, "--node", fmt.Sprint(i), "--token-file", tokenFile,
			"--listen", nn.ip(i)+":0", "--heartbeat", "100ms", "--fail-timeout", "1s", "--no-local-reads",
			"--target", filepath.Join(dir, fmt.Sprintf("storage-%d", i))), filepath.Join(dir, fmt.Sprintf("storage-%d.log", i)))
	}
	for i := 1; i <= 3; i++ {
		startStorage(i)
	}
	startNS(t, nn.cmd(0, "fs", "meta", "--mgmtd", url, "--kv", spec, "--token-file", tokenFile, "--listen", nn.ip(0)+":0"),
		filepath.Join(dir, "meta.log"))

	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := nn.cmd(4, args...)
		cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("client %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	allServing := func() {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			out, err := nn.cmd(4, "--json", "fs", "status", "--cluster", url, "--token-file", tokenFile).Output()
			var st struct {
				Chains []struct {
					Targets []struct{ State string }
				}
			}
			ok := err == nil && json.Unmarshal(out, &st) == nil && len(st.Chains) > 0
			for _, ch := range st.Chains {
				for _, tg := range ch.Targets {
					ok = ok && tg.State == "serving"
				}
				ok = ok && len(ch.Targets) == 3
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not all serving: %v %s", err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	allServing()

	data := make([]byte, 3<<20+12345)
	rand.Read(data)
	src := filepath.Join(dir, "data.bin")
	os.WriteFile(src, data, 0o600)
	// The metadata server learns the chain table on its next routing
	// refresh: retry the first put until it has.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		out, err := nn.cmd(4, "fs", "put", "--token-file", tokenFile, src, url+"/a.bin").CombinedOutput()
		if err == nil {
			break
		}
		if !strings.Contains(string(out), "no chains yet") || time.Now().After(deadline) {
			t.Fatalf("fs put: %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	got := filepath.Join(dir, "got.bin")
	run("fs", "get", "--token-file", tokenFile, url+"/a.bin", got)
	if b, _ := os.ReadFile(got); !bytes.Equal(b, data) {
		t.Fatal("get returned other bytes than put")
	}

	// A client without the CA is refused off loopback, before it sends
	// anything (the token alone is not enough).
	cmd := nn.cmd(4, "fs", "status", "--cluster", url)
	cmd.Env = append(os.Environ(), "FFKIT_TOKEN=whatever", "XDG_CONFIG_HOME="+filepath.Join(dir, "empty"))
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "no cluster CA") {
		t.Fatalf("client without the CA: %v %s", err, out)
	}

	// Kill a storage service, write while it is down, bring it back: it
	// resyncs and every target serves again.
	stor[3].kill()
	data2 := make([]byte, 2<<20)
	rand.Read(data2)
	src2 := filepath.Join(dir, "data2.bin")
	os.WriteFile(src2, data2, 0o600)
	run("fs", "put", "--token-file", tokenFile, src2, url+"/b.bin")
	startStorage(3)
	allServing()
	for name, want := range map[string][]byte{"a.bin": data, "b.bin": data2} {
		out := filepath.Join(dir, "got-"+name)
		run("fs", "get", "--token-file", tokenFile, url+"/"+name, out)
		if b, _ := os.ReadFile(out); !bytes.Equal(b, want) {
			t.Fatalf("%s after the resync: other bytes", name)
		}
	}

	// A FUSE mount from the client host.
	if _, err := os.Stat("/dev/fuse"); err == nil {
		mnt := filepath.Join(dir, "mnt")
		os.Mkdir(mnt, 0o755)
		m := startNS(t, nn.cmd(4, "fs", "mount", url+"/", mnt), filepath.Join(dir, "mount.log"))
		t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
		if l := m.line(); !strings.HasPrefix(l, "mounted ") {
			t.Fatalf("fs mount: %q", l)
		}
		b, err := os.ReadFile(filepath.Join(mnt, "b.bin"))
		if err != nil || !bytes.Equal(b, data2) {
			t.Fatalf("read through the mount: %v", err)
		}
		exec.Command(ffkitBin, "fs", "umount", mnt).Run()
	}
}
