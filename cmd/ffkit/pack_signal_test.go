package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A SIGTERM while pack is writing a large sample stops it promptly (the
// old writer ignored it for minutes), with exit 4 and one line naming the
// cancellation once (it was repeated once per worker), and nothing at OUT
// opens as data: verify fails cleanly and the next run cleans up.
func TestCLIPackSIGTERMDuringLargeSample(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "a"), []byte("small"), 0o644)
	// a sparse 2 GiB sample: pack copies it through the staging window
	f, err := os.Create(filepath.Join(src, "b"))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("mark"), 1<<30)
	f.Truncate(2 << 30)
	f.Close()
	out := filepath.Join(dir, "out")
	staged := func() int64 {
		ms, _ := filepath.Glob(filepath.Join(dir, ".out.ffkit-staging-*", "*PART_*"))
		var n int64
		for _, m := range ms {
			if st, err := os.Stat(m); err == nil {
				n += st.Size()
			}
		}
		return n
	}
	cmd := exec.Command(ffrBinary(t), "pack", src, "-o", out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// writing: the staged shard has grown since it was first seen
	first := int64(-1)
	waitFor(t, "pack to write the large sample", func() bool {
		if len(exited) > 0 {
			t.Fatalf("pack ended before it was signalled: %s", stderr.String())
		}
		n := staged()
		if first < 0 && n > 0 {
			first = n
		}
		return first >= 0 && n > first
	})
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("pack did not stop within 60 s of SIGTERM; stderr: %s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != exitOther {
		t.Fatalf("exit %d after SIGTERM, want %d; stderr: %s", code, exitOther, stderr.String())
	}
	msg := stderr.String()
	if n := strings.Count(msg, "context canceled"); n != 1 {
		t.Fatalf("the cancellation is named %d times, want once: %s", n, msg)
	}
	if _, err := datasetSamples(out); err == nil {
		t.Fatal("a dataset opens at the output of a stopped pack")
	}
	if r := ffr(t, "verify", out); r.code == 0 || r.code == exitOther {
		t.Fatalf("verify of a stopped pack's output: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	ffrMust(t, 0, "pack", "--clean", "-o", out)
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("left beside the output after --clean: %v", ents)
	}
}
