package main

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Regression test of issue 14: `fs df` of a one-host cluster counts its
// disk once (not once per storage process), its use% is df(1)'s, and a
// mount of the cluster reports the same capacity to statfs; unmounting a
// busy mount says how to detach it lazily.
func TestClusterDfAndMountStatfs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	dir := t.TempDir()
	u := startUp(t, dir) // waits for every pid line, the metadata servers' too
	u.mu.Lock()
	for name, pid := range u.metaPids {
		if u.pids[name] != pid {
			t.Errorf("fs up: stdout says pid %s %d, stderr %d", name, u.pids[name], pid)
		}
	}
	u.mu.Unlock()
	var disk syscall.Statfs_t
	if err := syscall.Statfs(dir, &disk); err != nil {
		t.Fatal(err)
	}
	bs := int64(disk.Frsize)
	if bs == 0 {
		bs = int64(disk.Bsize)
	}
	capacity := int64(disk.Blocks) * bs
	// Wait (generously) until every target has reported its space.
	var df dfReport
	deadline := time.Now().Add(2 * time.Minute)
	for {
		df = dfCheck(t, u, u.url)
		reported := 0
		for _, tg := range df.Targets {
			if tg.Capacity > 0 {
				reported++
			}
		}
		if reported == len(df.Targets) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if df.Capacity != capacity {
		t.Fatalf("fs df: capacity %d, the one disk under the cluster holds %d (%.1fx)", df.Capacity, capacity, float64(df.Capacity)/float64(capacity))
	}
	// df(1)'s use%: used / (used + avail). The disk is shared with other
	// work, so allow some drift between the two measurements.
	used := float64(disk.Blocks-disk.Bfree) * float64(bs)
	want := 100 * used / (used + float64(disk.Bavail)*float64(bs))
	if math.Abs(df.UsePct-want) > 2 {
		t.Fatalf("fs df: use%% %.2f, df(1) says %.2f", df.UsePct, want)
	}

	// fs put follows cp -r: a missing REMOTE becomes the copy; a missing
	// parent is refused, saying how to create it; an existing directory
	// receives the tree under its own name. Throughput is in MiB/s.
	tree := filepath.Join(t.TempDir(), "tree")
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "sub", "a.txt"), []byte("a"), 0o644)
	if out, code := u.run(t, "fs", "put", tree, u.url+"/missing/deeper/tree"); code != 1 {
		t.Fatalf("fs put into a missing parent: exit %d: %s", code, out)
	}
	cmdPut := exec.Command(clusterBinary(t), "fs", "put", tree, u.url+"/missing/deeper/tree")
	cmdPut.Env = u.env
	if msg, _ := cmdPut.CombinedOutput(); !strings.Contains(string(msg), "fs mkdir") || !strings.Contains(string(msg), "cp -r") {
		t.Fatalf("fs put into a missing parent does not say how to create it: %s", msg)
	}
	if out := u.must(t, "fs", "put", tree, u.url+"/newtree"); !strings.Contains(out, "MiB/s") {
		t.Fatalf("fs put output: %q", out)
	}
	u.must(t, "fs", "stat", u.url+"/newtree/sub/a.txt")
	u.must(t, "fs", "put", tree, u.url+"/newtree")
	u.must(t, "fs", "stat", u.url+"/newtree/tree/sub/a.txt")

	// The mount reports the same capacity to statfs (df on the mount).
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	mnt := t.TempDir()
	startMountEnv(t, clusterBinary(t), u.env, u.url, mnt)
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if got := int64(st.Blocks) * int64(st.Bsize); got != capacity/int64(st.Bsize)*int64(st.Bsize) {
		t.Fatalf("statfs of the mount: %d bytes, the cluster's disk holds %d", got, capacity)
	}
	if st.Bfree < st.Bavail || st.Bavail == 0 {
		t.Fatalf("statfs of the mount: bfree %d, bavail %d", st.Bfree, st.Bavail)
	}

	// A busy mount: fs umount says how to detach it lazily.
	f, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	busy := exec.Command(clusterBinary(t), "fs", "umount", mnt)
	msg, err := busy.CombinedOutput()
	f.Close()
	if err == nil {
		// The kernel let go although a directory was open; nothing to check.
		t.Logf("unmount of a mount with an open directory succeeded")
		return
	}
	if !strings.Contains(string(msg), "--lazy") {
		t.Fatalf("fs umount of a busy mount: %v: %s", err, msg)
	}
	if out, err := exec.Command(clusterBinary(t), "fs", "umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("fs umount once idle: %v: %s", err, out)
	}
}
