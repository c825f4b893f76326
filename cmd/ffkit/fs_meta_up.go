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
// URL is printed.
func init() { registerFSUpHook(startUpMeta) }

const upMetaServers = 2

func startUpMeta(ctx context.Context, c *FSUpCluster) (func() error, error) {
	type child struct {
		cmd  *exec.Cmd
		done chan error
	}
	var kids []*child
	stop := func() error {
		for _, k := range kids {
			k.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, k := range kids {
			select {
			case <-k.done:
			case <-time.After(10 * time.Second):
				k.cmd.Process.Kill()
				<-k.done
			}
		}
		return nil
	}
	for i := 1; i <= upMetaServers; i++ {
		logPath := filepath.Join(c.LogDir, fmt.Sprintf("meta-%d.log", i))
		logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			stop()
			return nil, err
		}
		args := []string{"fs", "meta", "--mgmtd", "ffkit://" + c.MgmtdAddr, "--kv", c.KVSpec, "--token-file", c.TokenFile,
			"--metrics", "127.0.0.1:0"}
		if c.TLSLoopback {
			args = append(args, "--tls-loopback")
		}
		cmd := exec.Command(c.Exe, args...)
		cmd.Stderr = logf
		out, err := cmd.StdoutPipe()
		if err != nil {
			logf.Close()
			stop()
			return nil, err
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			logf.Close()
			stop()
			return nil, fmt.Errorf("start meta %d: %w", i, err)
		}
		k := &child{cmd: cmd, done: make(chan error, 1)}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				fmt.Fprintln(logf, "stdout:", sc.Text())
			}
			k.done <- cmd.Wait()
			logf.Close()
		}()
		kids = append(kids, k)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		live, err := meta.LiveServers(ctx, c.Store)
		if err == nil && len(live) >= upMetaServers {
			fmt.Fprintf(os.Stderr, "ffkit: metadata servers at %s\n", strings.Join(live, ", "))
			for i, k := range kids {
				fmt.Fprintf(os.Stderr, "ffkit: metadata server meta-%d pid %d\n", i+1, k.cmd.Process.Pid)
				c.Pids = append(c.Pids, UpPid{fmt.Sprintf("meta-%d", i+1), k.cmd.Process.Pid})
			}
			return stop, nil
		}
		for i, k := range kids {
			select {
			case err := <-k.done:
				k.done <- err
				stop()
				return nil, fmt.Errorf("metadata server %d exited during start-up (%v); see %s", i+1, err, filepath.Join(c.LogDir, fmt.Sprintf("meta-%d.log", i+1)))
			default:
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, fmt.Errorf("metadata servers not registered within 30s; see %s", c.LogDir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
