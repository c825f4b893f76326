package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ffkit/ffkit/fs/meta"
)

// `ffkit fs up` starts two metadata servers (child processes running
// `ffkit fs meta` on the cluster's store), so that a client survives the
// death of one; it waits until both are registered before the cluster
// URL is printed, and restarts one that dies (fs_up_supervise.go).
func init() { registerFSUpHook(startUpMeta) }

const upMetaServers = 2

func startUpMeta(ctx context.Context, c *FSUpCluster) (func() error, error) {
	// Each metadata server runs under fs up's supervisor: one that dies
	// is started again (on a new port; clients find it through mgmtd's
	// routing) and the restart is logged (fs_up_supervise.go).
	sup := newSupervisor(upLogf)
	stop := func() error { sup.stop(); return nil }
	var kids []*supKid
	for i := 1; i <= upMetaServers; i++ {
		name := fmt.Sprintf("meta-%d", i)
		k, err := sup.add(name, metaStarter(c, i), func(pid, restarts int) {
			fmt.Fprintf(os.Stderr, "ffkit: metadata server %s pid %d (restart %d)\n", name, pid, restarts)
		})
		if err != nil {
			stop()
			return nil, err
		}
		kids = append(kids, k)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		live, err := meta.LiveServers(ctx, c.Store)
		if err == nil && len(live) >= upMetaServers {
			fmt.Fprintf(os.Stderr, "ffkit: metadata servers at %s\n", strings.Join(live, ", "))
			for i, k := range kids {
				fmt.Fprintf(os.Stderr, "ffkit: metadata server meta-%d pid %d\n", i+1, k.pid())
				c.Pids = append(c.Pids, UpPid{fmt.Sprintf("meta-%d", i+1), k.pid()})
			}
			sup.watch()
			return stop, nil
		}
		for i, k := range kids {
			if gone, err := k.exited(); gone {
				stop()
				return nil, fmt.Errorf("metadata server %d exited during start-up (%v); see %s", i+1, err, filepath.Join(c.LogDir, fmt.Sprintf("meta-%d.log", i+1)))
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, fmt.Errorf("metadata servers not registered within 30s; see %s", c.LogDir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metaStarter starts metadata server i of the cluster (a child process,
// logging to DIR/logs/meta-i.log, killed if fs up dies).
func metaStarter(c *FSUpCluster, i int) supStart {
	return func() (*exec.Cmd, <-chan struct{}, *error, error) {
		logPath := filepath.Join(c.LogDir, fmt.Sprintf("meta-%d.log", i))
		logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, nil, nil, err
		}
		args := []string{"fs", "meta", "--mgmtd", "ffkit://" + c.MgmtdAddr, "--kv", c.KVSpec, "--token-file", c.TokenFile,
			"--metrics", "127.0.0.1:0"}
		if c.TLSLoopback {
			args = append(args, "--tls-loopback")
		}
		return startLogged(c.Exe, args, logf, fmt.Sprintf("meta %d", i))
	}
}

// startLogged starts a supervised child process of fs up: stderr and
// stdout (each line prefixed "stdout:") go to logf, which is closed when
// the process ends; the child is killed if fs up dies. what names it in
// errors.
func startLogged(exe string, args []string, logf *os.File, what string) (*exec.Cmd, <-chan struct{}, *error, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, nil, nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, nil, fmt.Errorf("start %s: %w", what, err)
	}
	done := make(chan struct{})
	var werr error
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Fprintln(logf, "stdout:", sc.Text())
		}
		werr = cmd.Wait()
		logf.Close()
		close(done)
	}()
	return cmd, done, &werr, nil
}
