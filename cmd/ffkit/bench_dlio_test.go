package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"testing"
)

// TestBenchDLIOMountCLI runs `bench dlio` on a mount of a local directory:
// both workloads, both sides, every run, the files checked and removed.
func TestBenchDLIOMountCLI(t *testing.T) {
	bin := fsMountTestBinary(t)
	src, mnt, local := t.TempDir(), t.TempDir(), t.TempDir()
	cmd := startMount(t, bin, src, mnt)
	out, err := exec.Command(bin, "bench", "dlio", "--json", "--mount", mnt, "--local-dir", local,
		"--files", "6", "--file-size", "3M", "--runs", "2", "--compute", "1ms").Output()
	if err != nil {
		t.Fatalf("bench dlio: %v\n%s", err, out)
	}
	var rep dlioReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("bench dlio --json: %v\n%s", err, out)
	}
	if len(rep.Rows) != 2 {
		t.Fatalf("%d rows, want 2 (unet3d, cat)", len(rep.Rows))
	}
	for _, r := range rep.Rows {
		if len(r.Local) != 2 || len(r.Mount) != 2 || r.LocalMedian <= 0 || r.MountMedian <= 0 || r.Ratio <= 0 {
			t.Errorf("%s: %+v", r.Workload, r)
		}
	}
	for _, d := range []string{src, local} {
		if entries, _ := os.ReadDir(d); len(entries) != 0 {
			t.Errorf("bench dlio left %d entries in %s", len(entries), d)
		}
	}
	exec.Command(bin, "fs", "umount", mnt).Run()
	waitExit(t, cmd)
}
