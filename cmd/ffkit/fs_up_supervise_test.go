package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/clusterfs"
)

// TestFSUpRestartsMeta (issue 16, item 5): both metadata servers of a
// `fs up` cluster killed with SIGKILL are started again by fs up (on new
// ports), a new command works, and a client opened before the kill finds
// the restarted servers (their list changes at the same routing version).
func TestFSUpRestartsMeta(t *testing.T) {
	u := startUp(t, t.TempDir())
	ctx := context.Background()
	tok, err := os.ReadFile(filepath.Join(u.dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := clusterfs.Open(ctx, strings.TrimPrefix(u.url, "ffkit://"), clusterfs.Options{Token: strings.TrimSpace(string(tok)), RetryTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.MkdirAll(ctx, "/before"); err != nil {
		t.Fatal(err)
	}
	u.mu.Lock()
	old := map[string]int{}
	for k, v := range u.metaPids {
		old[k] = v
	}
	u.mu.Unlock()
	if len(old) != upMetaServers {
		t.Fatalf("metadata server pids %v", old)
	}
	for name, pid := range old {
		t.Logf("SIGKILL %s (pid %d)", name, pid)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	// fs up reports each restart with the new pid.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		u.mu.Lock()
		restarted := 0
		for name, pid := range old {
			if p := u.metaPids[name]; p != 0 && p != pid {
				restarted++
			}
		}
		u.mu.Unlock()
		if restarted == len(old) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fs up did not restart its metadata servers")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A new command retries until a restarted server has registered.
	u.must(t, "fs", "mkdir", u.url+"/after")
	if out := u.must(t, "fs", "ls", u.url+"/"); !strings.Contains(out, "/after") || !strings.Contains(out, "/before") {
		t.Fatalf("fs ls after the restarts:\n%s", out)
	}
	// The client from before the kill: every server it knew is gone.
	if fi, err := f.Stat(ctx, "/after"); err != nil || !fi.IsDir {
		t.Fatalf("old client, stat /after: %+v %v", fi, err)
	}
	if err := f.MkdirAll(ctx, "/after2"); err != nil {
		t.Fatalf("old client, mkdir: %v", err)
	}
}
