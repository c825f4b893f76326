package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/etcdkv"
	"github.com/ffkit/ffkit/fs/kv/lease"
	_ "github.com/ffkit/ffkit/fs/kv/memkv" // the "mem:" store spec
	"github.com/ffkit/ffkit/fs/mgmtd"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/fs/trust"
	"github.com/ffkit/ffkit/internal/errkind"
	"github.com/ffkit/ffkit/internal/units"
)

func init() { registerFS(newFSMgmtdCmd) }

// clusterTimers are the timer flags shared by fs mgmtd, fs storage and fs up.
type clusterTimers struct {
	heartbeat, failTimeout time.Duration
}

func (t *clusterTimers) flags(c *cobra.Command) {
	c.Flags().DurationVar(&t.heartbeat, "heartbeat", time.Second, "heartbeat interval of the storage services")
	c.Flags().DurationVar(&t.failTimeout, "fail-timeout", 4*time.Second, "a storage service silent this long is declared dead (it stops serving itself after half of it without mgmtd)")
}

func (t *clusterTimers) validate() error {
	if t.heartbeat <= 0 || t.failTimeout < 2*t.heartbeat {
		return usagef("--fail-timeout (%v) must be at least twice --heartbeat (%v), both > 0", t.failTimeout, t.heartbeat)
	}
	return nil
}

// ensureToken returns the cluster token kept in dir/token, creating it
// (mode 0600) on first use.
func ensureToken(dir string) (string, string, error) {
	p := filepath.Join(dir, "token")
	if t, err := client.ReadTokenFile(p); err == nil {
		if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o077 != 0 {
			return "", "", fmt.Errorf("token file %s is readable by others (mode %v); chmod 600 it", p, st.Mode().Perm())
		}
		return t, p, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", "", err
	}
	t, err := client.NewToken()
	if err != nil {
		return "", "", err
	}
	if err := privateDir(dir); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(p, []byte(t+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("write token file: %w", err)
	}
	return t, p, nil
}

// clusterToken finds the token for commands that talk to a cluster:
// --token-file, else FFKIT_TOKEN, else the user's token file for the URL.
func clusterToken(tokenFile, authority string) (string, error) {
	if tokenFile != "" {
		return client.ReadTokenFile(tokenFile)
	}
	return client.LookupToken(authority)
}

// parseClusterURL turns ffkit://h:p[,h:p][/path] or h:p[,h:p] into the
// authority and the mgmtd addresses, with the one address parser of every
// ffkit:// path (fs.ParseAuthority): a malformed URL is a usage error.
func parseClusterURL(u string) (authority string, addrs []string, err error) {
	rest := u
	if fs.IsURL(u) {
		scheme, auth, _, err := fs.SplitURL(u)
		if err != nil {
			return "", nil, err
		}
		if scheme != fs.ClusterScheme {
			return "", nil, usagef("%q is not a cluster URL: want ffkit://HOST:PORT", u)
		}
		rest = auth
	} else if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	addrs, err = fs.ParseAuthority(rest)
	if err != nil {
		return "", nil, fmt.Errorf("%w (in %q)", err, u)
	}
	return rest, addrs, nil
}

// parseBytes parses a positive size with the suffixes of every ffkit
// flag (units.ParseSize): "4MiB", "64K", "1048576".
func parseBytes(flag, s string) (int64, error) {
	n, err := units.ParseSize(s)
	if err != nil {
		return 0, usagef("%s: %v", flag, err)
	}
	if n <= 0 {
		return 0, usagef("%s: %q is not a positive size (want e.g. 4MiB)", flag, s)
	}
	return n, nil
}

// serveMetrics serves a registry at http://addr/metrics until ctx ends.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry) (string, error) {
	if addr == "" {
		return "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	go func() { <-ctx.Done(); srv.Close() }()
	return ln.Addr().String(), nil
}

// openMgmtdStore opens mgmtd's store: "embedded" (an embedded
// single-member etcd in dir/etcd) or any kv spec (mem:, etcd://...).
//
// The embedded etcd serves TLS only and requires a client certificate
// from the cluster CA (b's member certificate): no other process reads or
// writes the metadata. The returned spec carries the files' paths.
func openMgmtdStore(ctx context.Context, spec, dir string, b *trust.Bundle) (kv.Store, string, error) {
	if spec == "" || spec == "embedded" {
		if b == nil || b.Cert == nil {
			return nil, "", fmt.Errorf("embedded etcd in %s: %w", dir, trust.ErrNoTrust)
		}
		for _, d := range []string{dir, filepath.Join(dir, "etcd")} {
			if err := privateDir(d); err != nil {
				return nil, "", err
			}
		}
		st, srv, err := etcdkv.OpenEmbedded(ctx, filepath.Join(dir, "etcd"), "", etcdFiles(b), etcdkv.Options{})
		if err != nil {
			return nil, "", errkind.Wrap(errkind.Unavailable, fmt.Errorf("embedded etcd in %s: %w", dir, err))
		}
		return st, srv.Spec(), nil
	}
	st, err := kv.Open(ctx, spec)
	if err != nil {
		return nil, "", err
	}
	return st, spec, nil
}

func newFSMgmtdCmd() *cobra.Command {
	var (
		dir, listen, kvSpec, tokenFile, metrics, chunkSize string
		replicas, expect                                   int
		timers                                             clusterTimers
		leaseTTL                                           time.Duration
		tlsLoopback                                        bool
	)
	c := &cobra.Command{
		Use:   "mgmtd --dir DIR",
		Short: "Run the cluster manager (chain table, target states, failure detection)",
		Long: `Run mgmtd, the cluster manager of the ffkit file system, in the foreground.

Storage services register and heartbeat to it; it builds the chain table
once --expect-targets targets have registered (--replicas targets per
chain, no two on one storage service), detects failures, moves failed
targets to the end of their chain and drives resyncs. Its state lives in
--kv: "embedded" (default: a single-member etcd in DIR/etcd), "mem:" (lost
on exit), or etcd://HOST:PORT,... for an external etcd cluster.

The cluster token is --token-file, else $FFKIT_TOKEN, else DIR/token
(created with mode 0600). It is recorded for the printed URL in the user's
~/.config/ffkit/tokens.json so that local commands find it. The first line
on stdout is the cluster URL, ffkit://HOST:PORT, once mgmtd serves.

mgmtd serves only while it holds the primary lease in its store (renewed
continuously, re-checked inside every write). Started on the same shared
store (--kv etcd://...), a second 'fs mgmtd' is a standby: it waits, takes
over --lease-ttl after the primary stops renewing, resumes the persisted
state and then prints its URL. List both addresses in cluster URLs
(ffkit://h1:p1,h2:p2) so that clients find whichever serves.`,
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
			ctx := cmd.Context()
			var token string
			switch {
			case tokenFile != "":
				token, err = client.ReadTokenFile(tokenFile)
			case os.Getenv("FFKIT_TOKEN") != "":
				token = strings.TrimSpace(os.Getenv("FFKIT_TOKEN"))
			default:
				token, _, err = ensureToken(dir)
			}
			if err != nil {
				return err
			}
			// The cluster identity: the trust directory beside the token
			// file, $FFKIT_TLS_DIR, else DIR/tls (created on first start).
			tb, err := clusterTrust(tokenFile, "")
			if err != nil {
				return err
			}
			if tb == nil || tb.Cert == nil {
				if tb, err = ensureClusterTrust(dir); err != nil {
					return err
				}
			} else if err := privateDir(dir); err != nil {
				return err
			}
			store, kvDesc, err := openMgmtdStore(ctx, kvSpec, dir, tb)
			if err != nil {
				return err
			}
			defer store.Close()
			// Primary election: mgmtd serves only while it holds the lease in
			// the store, and every write re-checks it (fencing); a second
			// 'fs mgmtd' on the same store is a standby that takes over when
			// the primary stops renewing (package fs/kv/lease).
			// The candidate id is this host and DIR: a mgmtd restarted on
			// the same DIR takes its lease back at once (a new epoch fences
			// its dead predecessor); a standby runs with another DIR.
			host, _ := os.Hostname()
			absDir, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			id := host + ":" + absDir
			le, err := lease.New(store, lease.Options{Key: []byte("mgmtd/lease"), ID: id, TTL: leaseTTL})
			if err != nil {
				return err
			}
			if rec, ok, err := lease.Read(ctx, store, []byte("mgmtd/lease")); err == nil && ok && rec.Holder != id && time.Now().UnixNano() < rec.Expires {
				fmt.Fprintf(os.Stderr, "mgmtd: standby: %s holds the primary lease; waiting to take over\n", rec.Holder)
			}
			printed := false
			return lease.Serve(ctx, le, func(lctx context.Context) error {
				reg := prometheus.NewRegistry()
				m, err := mgmtd.Start(lctx, mgmtd.Options{Listen: listen, Token: token, Trust: tb, TLSLoopback: tlsLoopback, Store: store, Replicas: replicas,
					ExpectTargets: expect, ChunkSize: cs, HeartbeatInterval: timers.heartbeat, FailTimeout: timers.failTimeout, Registry: reg,
					Fence: le.Fence, Holding: le.Held,
					// A new primary (a start, a takeover) gives every
					// storage service a whole fail timeout to report
					// before it judges anyone.
					Freeze: timers.failTimeout,
					Faults: transport.FaultsFromEnv()})
				if err != nil {
					return err
				}
				defer m.Close()
				if err := client.RecordToken(m.Addr(), token, tb); err != nil {
					warnf("could not record the token: %v", err)
				}
				maddr, err := serveMetrics(lctx, metrics, reg)
				if err != nil {
					return err
				}
				if !printed {
					fmt.Fprintf(cmd.OutOrStdout(), "ffkit://%s\n", m.Addr())
					printed = true
				}
				fmt.Fprintf(os.Stderr, "mgmtd: primary (lease epoch %d), serving on %s, state in %s, metrics on %s\n", le.Epoch(), m.Addr(), kvDesc, maddr)
				<-lctx.Done()
				if ctx.Err() == nil {
					fmt.Fprintf(os.Stderr, "mgmtd: lost the primary lease; standing by\n")
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "directory for mgmtd's state and token (required)")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "address to serve on")
	c.Flags().StringVar(&kvSpec, "kv", "embedded", `state store: "embedded", "mem:", or etcd://HOST:PORT[,HOST:PORT]`)
	c.Flags().StringVar(&tokenFile, "token-file", "", "file holding the cluster token (default: $FFKIT_TOKEN, else DIR/token)")
	c.Flags().StringVar(&metrics, "metrics-listen", "127.0.0.1:0", `Prometheus /metrics address ("" to disable)`)
	c.Flags().StringVar(&chunkSize, "chunk-size", "4MiB", "default chunk size announced to clients")
	c.Flags().IntVar(&replicas, "replicas", 3, "targets per chain")
	c.Flags().DurationVar(&leaseTTL, "lease-ttl", 3*time.Second, "primary lease: a standby takes over this long after the primary stops renewing")
	c.Flags().IntVar(&expect, "expect-targets", 0, "build the chain table once this many targets registered (0: never)")
	timers.flags(c)
	tlsLoopbackFlag(c, &tlsLoopback)
	return c
}
