package main

import (
	"fmt"
	"log"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage"
	"github.com/ffkit/ffkit/fs/transport"
)

func init() { registerFS(newFSStorageCmd) }

// storageProfile writes a CPU profile of this storage process when
// FFKIT_STORAGE_CPUPROFILE names a file prefix (PREFIX.node<N>.pprof), for
// FFKIT_STORAGE_CPUPROFILE_SECONDS (default 60) or until the process
// stops, whichever comes first: benchmarks kill storage processes with
// SIGKILL, so the profile is finished on a timer. Returns the stop
// function, or nil when not profiling.
func storageProfile(node uint32, logger *log.Logger) func() {
	prefix := os.Getenv("FFKIT_STORAGE_CPUPROFILE")
	if prefix == "" {
		return nil
	}
	secs, err := strconv.Atoi(os.Getenv("FFKIT_STORAGE_CPUPROFILE_SECONDS"))
	if err != nil || secs <= 0 {
		secs = 60
	}
	name := fmt.Sprintf("%s.node%d.pprof", prefix, node)
	f, err := os.Create(name)
	if err != nil {
		logger.Printf("cpu profile: %v", err)
		return nil
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		logger.Printf("cpu profile: %v", err)
		f.Close()
		return nil
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
			logger.Printf("cpu profile written to %s", name)
		})
	}
	t := time.AfterFunc(time.Duration(secs)*time.Second, stop)
	return func() { t.Stop(); stop() }
}

func newFSStorageCmd() *cobra.Command {
	var (
		mgmtdURL, listen, tokenFile, metrics string
		node                                 uint32
		targets                              []string
		timers                               clusterTimers
		noLocal, tlsLoopback                 bool
	)
	c := &cobra.Command{
		Use:   "storage --mgmtd ffkit://HOST:PORT --node N --target DIR [--target DIR ...]",
		Short: "Run a storage service holding chunk replicas in target directories",
		Long: `Run a storage service in the foreground. Each --target is a directory of
chunks (one replica of one chain); "ID=DIR" names the target id, plain DIR
gets id N*100+i. The service registers with mgmtd and heartbeats to it,
replicates writes along its chains (CRAQ), resyncs returning replicas, and
stops serving by itself if mgmtd is unreachable for half the fail timeout.

Durability: a write is acknowledged only after every replica has fsynced
the new chunk version and made it current (rename + directory fsync), so
acknowledged data survives kill -9 and power loss of any replica.

Short-circuit reads: a client on this host (same boot and mount namespace)
reading 64 KiB or more gets the committed chunk file's path and block CRCs
instead of the bytes, and reads and checks the file itself (committed files
never change). --no-local-reads refuses this; a client turns it off with
FFKIT_LOCAL_READS=0.

The token is --token-file, else $FFKIT_TOKEN, else the user's token file
entry for the mgmtd URL. The first line on stdout is the service's address.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if node == 0 {
				return usagef("--node N (> 0) is required")
			}
			if len(targets) == 0 {
				return usagef("at least one --target DIR is required")
			}
			if err := timers.validate(); err != nil {
				return err
			}
			auth, addrs, err := parseClusterURL(mgmtdURL)
			if err != nil {
				return err
			}
			token, err := clusterToken(tokenFile, auth)
			if err != nil {
				return err
			}
			tb, err := clusterTrust(tokenFile, auth)
			if err != nil {
				return err
			}
			var tcs []storage.TargetConfig
			for i, t := range targets {
				id := uint64(node)*100 + uint64(i+1)
				dir := t
				if k, v, ok := strings.Cut(t, "="); ok {
					if id, err = strconv.ParseUint(k, 10, 32); err != nil || id == 0 {
						return usagef("--target %q: bad target id %q", t, k)
					}
					dir = v
				}
				tcs = append(tcs, storage.TargetConfig{ID: proto.TargetID(id), Dir: dir})
			}
			logger := log.New(os.Stderr, "", log.LstdFlags|log.Lmicroseconds)
			if stop := storageProfile(node, logger); stop != nil {
				defer stop()
			}
			s, err := storage.Start(storage.Config{Node: proto.NodeID(node), Targets: tcs, Mgmtd: addrs, Token: token, Trust: tb, TLSLoopback: tlsLoopback,
				Listen: listen, MetricsListen: metrics, HeartbeatInterval: timers.heartbeat, FailTimeout: timers.failTimeout,
				Faults: transport.FaultsFromEnv(), Logf: logger.Printf, NoLocalReads: noLocal})
			if err != nil {
				return err
			}
			defer s.Close()
			fmt.Fprintln(cmd.OutOrStdout(), s.Addr())
			logger.Printf("storage node %d: serving on %s, metrics on %s, %d targets", node, s.Addr(), s.MetricsAddr(), len(tcs))
			<-cmd.Context().Done()
			return nil
		},
	}
	c.Flags().StringVar(&mgmtdURL, "mgmtd", "", "mgmtd address, ffkit://HOST:PORT[,HOST:PORT] (required)")
	c.Flags().Uint32Var(&node, "node", 0, "this service's node id, unique in the cluster (required)")
	c.Flags().StringArrayVar(&targets, "target", nil, "target directory, DIR or ID=DIR (repeat)")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "address to serve on")
	c.Flags().StringVar(&tokenFile, "token-file", "", "file holding the cluster token")
	c.Flags().StringVar(&metrics, "metrics-listen", "127.0.0.1:0", `Prometheus /metrics address ("" to disable)`)
	c.Flags().BoolVar(&noLocal, "no-local-reads", false, "send every read's bytes over the connection, even to a client on this host")
	timers.flags(c)
	tlsLoopbackFlag(c, &tlsLoopback)
	return c
}
