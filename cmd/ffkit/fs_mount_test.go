package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/internal/testbin"

	"github.com/ffkit/ffkit/fs/fuse"
)

// fsMountTestBinary builds the ffkit binary once for the mount CLI tests.
func fsMountTestBinary(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	return testbin.Path(t)
}

// startMount runs `ffkit fs mount src mnt` and waits for its ready line.
func startMount(t *testing.T, bin, src, mnt string, extra ...string) *exec.Cmd {
	t.Helper()
	return startMountEnv(t, bin, nil, src, mnt, extra...)
}

// startMountEnv is startMount with the environment env (nil: this one's).
func startMountEnv(t *testing.T, bin string, env []string, src, mnt string, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"fs", "mount", src, mnt}, extra...)...)
	cmd.Env = env
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if fuse.IsMounted(mnt) {
			fuse.Unmount(mnt, true)
		}
		cmd.Process.Kill()
		cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- line
	}()
	select {
	case line := <-ready:
		if !strings.HasPrefix(line, "mounted ") {
			t.Fatalf("first line of fs mount: %q", line)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("fs mount did not report ready in 2 min")
	}
	return cmd
}

func waitExit(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("fs mount exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fs mount did not exit after the unmount")
	}
}

func TestFSMountUmountCLI(t *testing.T) {
	bin := fsMountTestBinary(t)
	src, mnt := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "hello"), []byte("hi"), 0o644)

	// Unmounted from outside with `ffkit fs umount`.
	cmd := startMount(t, bin, src, mnt)
	if got, err := os.ReadFile(filepath.Join(mnt, "hello")); err != nil || string(got) != "hi" {
		t.Fatalf("read through the mount: %q %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "new"), []byte("through fuse"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "fs", "umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("fs umount: %v\n%s", err, out)
	}
	waitExit(t, cmd)
	if fuse.IsMounted(mnt) {
		t.Fatal("still mounted after fs umount")
	}
	if got, _ := os.ReadFile(filepath.Join(src, "new")); string(got) != "through fuse" {
		t.Fatalf("file written through the mount: %q", got)
	}

	// Unmounted cleanly on SIGTERM and on SIGINT.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd = startMount(t, bin, src, mnt, "--read-only")
		if err := os.WriteFile(filepath.Join(mnt, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
			t.Errorf("write on a --read-only mount: %v", err)
		}
		cmd.Process.Signal(sig)
		waitExit(t, cmd)
		if fuse.IsMounted(mnt) {
			t.Fatalf("still mounted after %v", sig)
		}
	}

	// Usage errors exit 2.
	for _, args := range [][]string{
		{"fs", "umount", mnt},                               // not a mount
		{"fs", "mount", filepath.Join(src, "missing"), mnt}, // no such source
		{"fs", "mount", src, filepath.Join(mnt, "nope")},    // no such mount point
		{"fs", "mount", src, mnt, "--max-request", "1K"},    // nonsense size
		{"bench", "fs", "--mount", src, "--size", "4M"},     // not a FUSE mount
	} {
		err := exec.Command(bin, args...).Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("ffkit %v: %v, want exit status 2", args, err)
		}
	}
}

func TestBenchFSCLI(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed")
	}
	bin := fsMountTestBinary(t)
	src, mnt, dev, nat := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	cmd := startMount(t, bin, src, mnt, "--direct")
	out, err := exec.Command(bin, "bench", "fs", "--json", "--local-dir", dev, "--mount", mnt, "--cluster", nat,
		"--size", "8M", "--duration", "1s", "--threads", "1,2").Output()
	if err != nil {
		t.Fatalf("bench fs: %v\n%s", err, out)
	}
	var rep fsBenchReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("bench fs --json: %v\n%s", err, out)
	}
	if len(rep.Rows) != 10 {
		t.Fatalf("%d rows, want 10 (4 sequential kinds x 2 thread counts + 2 random)", len(rep.Rows))
	}
	for _, r := range rep.Rows {
		for name, s := range map[string]*fsSide{"device": r.Device, "fuse": r.FUSE, "native": r.Native} {
			if s == nil || s.Error != "" || s.MiBPerSec <= 0 || s.IOPS <= 0 {
				t.Errorf("%s %d threads, %s: %+v", r.Test, r.Threads, name, s)
			}
		}
		if r.FUSERatio <= 0 || r.NativeRatio <= 0 {
			t.Errorf("%s: ratios %v %v", r.Test, r.FUSERatio, r.NativeRatio)
		}
	}
	if rep.Rows[0].ThreeFSRatio != 0.42 || rep.Rows[len(rep.Rows)-2].ThreeFSRatio != 0.09 {
		t.Errorf("3FS ratios not on the 128 KiB 1-thread read and the 4 KiB random read rows")
	}
	entries, _ := os.ReadDir(dev)
	if len(entries) != 0 {
		t.Errorf("bench fs left %d files in --local-dir", len(entries))
	}
	exec.Command(bin, "fs", "umount", mnt).Run()
	waitExit(t, cmd)
}
