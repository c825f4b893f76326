package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBenchStorageOnCluster runs every storage benchmark on an ffkit://
// path of a real cluster (`ffkit fs up`: mgmtd, three storage processes,
// metadata servers) and checks the figures and the cleanup.
func TestBenchStorageOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	bin := storageBenchBinary(t)
	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "FFKIT_TOKEN=")
	up := exec.Command(bin, "fs", "up", "--dir", t.TempDir(), "--chunk-size", "1MiB")
	up.Env = env
	stdout, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var upErr bytes.Buffer
	up.Stderr = &upErr
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	urls := make(chan string, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "ffkit://") {
				urls <- l
			}
		}
		up.Wait()
	}()
	t.Cleanup(func() {
		up.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			up.Process.Kill()
			<-exited
		}
	})
	var url string
	select {
	case url = <-urls:
	case <-exited:
		t.Fatalf("fs up exited: %s", upErr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("fs up not ready in 90s: %s", upErr.String())
	}

	run := func(v any, args ...string) {
		t.Helper()
		cmd := exec.Command(bin, append(args, "--json", "--fio=false")...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("ffkit %s: %v\n%s", strings.Join(args, " "), err, errb.String())
		}
		if err := json.Unmarshal(out.Bytes(), v); err != nil {
			t.Fatalf("ffkit %s: stdout is not one JSON document: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
	base := url + "/benchtest/run"
	var ck checkpointDoc
	run(&ck, "bench", "checkpoint", base+"/ck", "--size", "3M", "--runs", "1")
	if ck.Write.MiBPerSec.Mean <= 0 || ck.Read.MiBPerSec.Mean <= 0 || ck.Read.Latency.Count != 3 {
		t.Errorf("checkpoint on the cluster: %+v", ck)
	}
	var pw parallelWriteDoc
	run(&pw, "bench", "parallel-write", base+"/pw", "--procs", "2", "--size-per-proc", "2M", "--runs", "1")
	if pw.AggregateMiBPerSec <= 0 || pw.NaiveSumMiBPerSec < pw.AggregateMiBPerSec*(1-1e-9) {
		t.Errorf("parallel-write on the cluster: %+v", pw)
	}
	var ml modelLoadDoc
	run(&ml, "bench", "model-load", base+"/ml", "--generate", "2x2M", "--clients", "2", "--runs", "1")
	if ml.Files != 2 || ml.AggregateMiBPerSec.Mean <= 0 {
		t.Errorf("model-load on the cluster: %+v", ml)
	}
	var sw sweepDoc
	run(&sw, "bench", "sweep", base+"/sw", "--block-sizes", "64K", "--queue-depths", "4", "--threads", "2", "--size", "2M",
		"--duration", "50ms", "--warmup", "10ms", "--runs", "1", "--save-config", "")
	if len(sw.Points) != 1 || sw.Points[0].MiBPerSec.Mean <= 0 || sw.Points[0].Latency.Count == 0 {
		t.Errorf("sweep on the cluster: %+v", sw)
	}
	// Everything the benchmarks created is gone, directories included.
	cmd := exec.Command(bin, "fs", "stat", url+"/benchtest")
	cmd.Env = env
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitBadData {
		t.Errorf("fs stat %s/benchtest after the benchmarks: %v (want exit 1: it does not exist)", url, err)
	}
}
