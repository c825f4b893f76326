package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/fs/trust"
	"github.com/ffkit/ffkit/internal/errkind"
)

func init() { registerFS(newFSUpCmd) }

// FSUpCluster describes the cluster `ffkit fs up` runs, for hooks.
type FSUpCluster struct {
	Dir       string   // the cluster directory
	MgmtdAddr string   // host:port of mgmtd, then of its standby: "h:p,h:p"
	Token     string   // the cluster token
	TokenFile string   // DIR/token
	Store     kv.Store // mgmtd's store (the embedded etcd), shareable
	KVSpec    string   // how other processes reach that store ("etcd://127.0.0.1:PORT")
	Exe       string   // this ffkit binary, to start child processes
	Timers    clusterTimers
	// Log is where a hook's children should log (DIR/logs).
	LogDir string
	// Trust is the cluster's CA and member certificate (DIR/tls);
	// TLSLoopback: children use TLS on loopback too (--tls-loopback).
	Trust       *trust.Bundle
	TLSLoopback bool
	// Pids: a hook adds its processes (name, pid); fs up prints them on
	// stdout with the others ("pid NAME PID").
	Pids []UpPid
}

// UpPid is one process of `ffkit fs up`.
type UpPid struct {
	Name string
	Pid  int
}

// FSUpHook starts one more service inside `ffkit fs up` after the data
// plane is ready and before the URL is printed (issue 6: the metadata
// service). It returns a function that stops it; `fs up` calls the stops
// in reverse order on shutdown. Register from an init() with
// registerFSUpHook; a hook that fails aborts `fs up`.
type FSUpHook func(ctx context.Context, c *FSUpCluster) (stop func() error, err error)

var fsUpHooks []FSUpHook

func registerFSUpHook(h FSUpHook) { fsUpHooks = append(fsUpHooks, h) }

// upConfig is DIR/cluster.json: the shape of the cluster, fixed at its
// first start, so that a later `fs up` on DIR brings the same cluster back.
type upConfig struct {
	MgmtdAddr         string `json:"mgmtd_addr"`
	StandbyAddr       string `json:"mgmtd_standby_addr,omitempty"`
	Storage           int    `json:"storage"`
	TargetsPerStorage int    `json:"targets_per_storage"`
	Replicas          int    `json:"replicas"`
	ChunkSize         int64  `json:"chunk_size"`
}

func newFSUpCmd() *cobra.Command {
	var (
		dir, listen, chunkSize, metrics string
		cfg                             upConfig
		timers                          clusterTimers
		readyTimeout                    time.Duration
		tlsLoopback                     bool
	)
	c := &cobra.Command{
		Use:   "up --dir DIR",
		Short: "Start a whole cluster on this machine (mgmtd and its standby, metadata and storage processes) until Ctrl-C",
		Long: `Start a local ffkit cluster: the cluster's store (an embedded etcd under
DIR/mgmtd, served by this process), two mgmtd processes on it (a primary and
a standby that takes over through the lease in the store when the primary
freezes or dies), two metadata servers, and --storage storage services, each
its own child process ('ffkit fs storage') with --targets-per-storage target
directories under DIR/storage-N, chains of --replicas targets.

The first line on stdout is the cluster URL, ffkit://HOST:PORT,HOST:PORT
(both mgmtd addresses), printed only once the cluster is ready (every target
serving, every service answering); then one line per process, "pid NAME
PID" (mgmtd, storage-N, mgmtd-2, meta-N). A mgmtd or metadata server that
dies is started again (logged on stderr); a storage process is not. Ctrl-C
or SIGTERM stops everything. A later
'ffkit fs up --dir DIR' brings the same cluster back with its data, on the
same URL (the shape flags are then taken from DIR/cluster.json).

The cluster token is created in DIR/token (mode 0600) and recorded for the
URL in ~/.config/ffkit/tokens.json, so commands on this machine find it;
elsewhere pass --token-file or set FFKIT_TOKEN. Logs go to DIR/logs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usagef("--dir is required")
			}
			if err := timers.validate(); err != nil {
				return err
			}
			cs, err := parseBytes("--chunk-size", chunkSize)
			if err != nil {
				return err
			}
			cfg.ChunkSize = cs
			if cfg.Storage < 1 || cfg.TargetsPerStorage < 1 || cfg.Replicas < 1 || cfg.Replicas > cfg.Storage {
				return usagef("need --storage >= --replicas >= 1 and --targets-per-storage >= 1 (got %d, %d, %d)", cfg.Storage, cfg.Replicas, cfg.TargetsPerStorage)
			}
			return runFSUp(cmd, dir, listen, metrics, cfg, timers, readyTimeout, tlsLoopback)
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "cluster directory (required; created if missing)")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "mgmtd address on the first start (the standby takes another port on its host; later starts reuse both)")
	c.Flags().IntVar(&cfg.Storage, "storage", 3, "storage processes")
	c.Flags().IntVar(&cfg.TargetsPerStorage, "targets-per-storage", 2, "target directories per storage process")
	c.Flags().IntVar(&cfg.Replicas, "replicas", 3, "replicas per chain")
	c.Flags().StringVar(&chunkSize, "chunk-size", "4MiB", "default chunk size")
	c.Flags().StringVar(&metrics, "metrics-listen", "127.0.0.1:0", `mgmtd's Prometheus /metrics address ("" to disable; each storage service logs its own)`)
	c.Flags().DurationVar(&readyTimeout, "ready-timeout", 60*time.Second, "give up if the cluster is not ready within this")
	timers.flags(c)
	tlsLoopbackFlag(c, &tlsLoopback)
	return c
}

func runFSUp(cmd *cobra.Command, dir, listen, metrics string, cfg upConfig, timers clusterTimers, readyTimeout time.Duration, tlsLoopback bool) error {
	ctx := cmd.Context()
	// Everything under DIR is private to its owner; a cluster made by an
	// older ffkit is tightened here (storage targets tighten their own).
	if err := privateDir(dir); err != nil {
		return err
	}
	if err := privateDir(filepath.Join(dir, "logs")); err != nil {
		return err
	}
	if err := tightenFiles(dir); err != nil {
		return err
	}
	tb, err := ensureClusterTrust(dir)
	if err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "cluster.json")
	if b, err := os.ReadFile(cfgPath); err == nil {
		var saved upConfig
		if err := json.Unmarshal(b, &saved); err != nil {
			return errkind.Wrap(errkind.Data, fmt.Errorf("%s is corrupt: %w", cfgPath, err))
		}
		if saved.Storage != cfg.Storage || saved.TargetsPerStorage != cfg.TargetsPerStorage || saved.Replicas != cfg.Replicas {
			warnf("%s exists: using its shape (%d storage, %d targets each, %d replicas)", cfgPath, saved.Storage, saved.TargetsPerStorage, saved.Replicas)
		}
		cfg = saved
		listen = saved.MgmtdAddr
	}
	token, tokenFile, err := ensureToken(dir)
	if err != nil {
		return err
	}
	store, kvSpec, err := openMgmtdStore(ctx, "embedded", filepath.Join(dir, "mgmtd"), tb)
	if err != nil {
		return err
	}
	defer store.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Two mgmtd processes on the embedded store served by this process:
	// the primary holds the lease in the store, the standby takes over
	// when it stops renewing (frozen, killed); each is restarted when it
	// dies (fs_up_mgmtd.go). Their addresses are fixed at the first start.
	if cfg.MgmtdAddr == "" {
		if cfg.MgmtdAddr, err = freeAddr(listen); err != nil {
			return err
		}
	}
	if cfg.StandbyAddr == "" {
		if cfg.StandbyAddr, err = freeAddr(net.JoinHostPort(hostOf(cfg.MgmtdAddr), "0")); err != nil {
			return err
		}
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return err
	}
	mg := &upMgmtd{dir: dir, exe: exe, kvSpec: kvSpec, tokenFile: tokenFile, token: token, trust: tb, tlsLoopback: tlsLoopback,
		addrs: []string{cfg.MgmtdAddr, cfg.StandbyAddr}, cfg: cfg, timers: timers, metrics: metrics}
	if err := mg.start(ctx); err != nil {
		mg.stop()
		return err
	}
	defer mg.stop()
	authority := strings.Join(mg.addrs, ",")
	if err := client.RecordToken(authority, token, tb); err != nil {
		warnf("could not record the token in the user's config: %v", err)
	}
	// Storage children. Pdeathsig: if this process dies, they die too.
	type child struct {
		name string
		cmd  *exec.Cmd
		done chan error
	}
	var children []*child
	stopChildren := func() {
		for _, ch := range children {
			ch.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, ch := range children {
			select {
			case <-ch.done:
			case <-time.After(10 * time.Second):
				ch.cmd.Process.Kill()
				<-ch.done
			}
		}
	}
	defer stopChildren()
	for i := 1; i <= cfg.Storage; i++ {
		args := []string{"fs", "storage", "--mgmtd", "ffkit://" + authority, "--node", strconv.Itoa(i), "--token-file", tokenFile,
			"--heartbeat", timers.heartbeat.String(), "--fail-timeout", timers.failTimeout.String()}
		if tlsLoopback {
			args = append(args, "--tls-loopback")
		}
		if err := privateDir(filepath.Join(dir, fmt.Sprintf("storage-%d", i))); err != nil {
			return err
		}
		for j := 1; j <= cfg.TargetsPerStorage; j++ {
			args = append(args, "--target", filepath.Join(dir, fmt.Sprintf("storage-%d", i), fmt.Sprintf("target-%d", j)))
		}
		logf, err := os.OpenFile(filepath.Join(dir, "logs", fmt.Sprintf("storage-%d.log", i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		cmd := exec.Command(exe, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return fmt.Errorf("start storage %d: %w", i, err)
		}
		ch := &child{name: fmt.Sprintf("storage-%d", i), cmd: cmd, done: make(chan error, 1)}
		go func() { ch.done <- cmd.Wait(); logf.Close() }()
		children = append(children, ch)
	}
	// Ready: every target serving and every storage service answering.
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	pool := transport.NewPool(transport.Options{Token: token, Trust: tb, TLSLoopback: tlsLoopback, Name: "fs-up"})
	defer pool.Close()
	for {
		if st := mg.status(rctx, pool); st != nil && st.Ready && upReady(rctx, st.Routing, cfg, pool) {
			break
		}
		for _, ch := range children {
			select {
			case err := <-ch.done:
				ch.done <- err
				return errkind.Wrap(errkind.Unavailable, fmt.Errorf("%s exited during start-up (%v); see %s", ch.name, err, filepath.Join(dir, "logs", ch.name+".log")))
			default:
			}
		}
		select {
		case <-rctx.Done():
			if ctx.Err() != nil {
				return nil
			}
			return errkind.Wrap(errkind.Unavailable, fmt.Errorf("cluster not ready within %v; see %s", readyTimeout, filepath.Join(dir, "logs")))
		case <-time.After(50 * time.Millisecond):
		}
	}
	mg.watch()
	info := &FSUpCluster{Dir: dir, MgmtdAddr: authority, Token: token, TokenFile: tokenFile, Store: store, KVSpec: kvSpec,
		Exe: exe, Timers: timers, LogDir: filepath.Join(dir, "logs"), Trust: tb, TLSLoopback: tlsLoopback}
	var stops []func() error
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			if err := stops[i](); err != nil {
				warnf("stop: %v", err)
			}
		}
	}()
	for _, h := range fsUpHooks {
		stop, err := h(ctx, info)
		if err != nil {
			return err
		}
		if stop != nil {
			stops = append(stops, stop)
		}
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "ffkit://%s\n", authority)
	fmt.Fprintf(out, "pid mgmtd %d\n", mg.kids[0].pid())
	for _, ch := range children {
		fmt.Fprintf(out, "pid %s %d\n", ch.name, ch.cmd.Process.Pid)
	}
	fmt.Fprintf(out, "pid mgmtd-2 %d\n", mg.kids[1].pid())
	for _, p := range info.Pids {
		fmt.Fprintf(out, "pid %s %d\n", p.Name, p.Pid)
	}
	if f, ok := out.(*os.File); ok {
		f.Sync()
	}
	// Run until a signal; report children that die meanwhile.
	cases := make(chan string, len(children))
	for _, ch := range children {
		go func() {
			select {
			case err := <-ch.done:
				ch.done <- err
				cases <- fmt.Sprintf("%s exited: %v", ch.name, err)
			case <-ctx.Done():
			}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "ffkit fs up: stopping")
			return nil
		case msg := <-cases:
			warnf("%s (the cluster carries on with the others; see %s)", msg, filepath.Join(dir, "logs"))
		}
	}
}

// upReady reports whether every expected target serves and every storage
// node answers a request.
func upReady(ctx context.Context, r *proto.Routing, cfg upConfig, pool *transport.Pool) bool {
	if len(r.Chains) == 0 || len(r.Nodes) < cfg.Storage {
		return false
	}
	for _, ch := range r.Chains {
		for _, t := range ch.Targets {
			if t.State != proto.Serving {
				return false
			}
		}
	}
	for _, n := range r.Nodes {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pool.Get(actx, n.Addr)
		if err == nil {
			_, err = conn.Call(actx, proto.MBatchRead, proto.BatchReadReq{}, nil, nil)
		}
		cancel()
		if err != nil {
			return false
		}
	}
	return !errors.Is(ctx.Err(), context.Canceled)
}
