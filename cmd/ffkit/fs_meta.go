package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/kv"
	_ "github.com/ffkit/ffkit/fs/kv/etcdkv" // etcd://... store specs
	_ "github.com/ffkit/ffkit/fs/kv/memkv"  // mem: store spec
	"github.com/ffkit/ffkit/fs/meta"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/internal/errkind"
)

func init() { registerFS(newFSMetaCmd) }

// metaToken reads --token-file, else $FFKIT_TOKEN, else the user's token file.
func metaToken(tokenFile, authority string) (string, error) {
	if tokenFile != "" {
		return client.ReadTokenFile(tokenFile)
	}
	t, err := client.LookupToken(authority)
	if err != nil {
		return "", errkind.Wrap(errkind.Usage, fmt.Errorf("%w (pass --token-file or set FFKIT_TOKEN)", err))
	}
	return t, nil
}

func newFSMetaCmd() *cobra.Command {
	var (
		mgmtdURL, kvSpec, listen, tokenFile, metrics string
		stripe                                       int
		gcInterval                                   time.Duration
		tlsLoopback                                  bool
	)
	c := &cobra.Command{
		Use:   "meta --mgmtd ffkit://HOST:PORT --kv SPEC",
		Short: "Run a metadata server (files and directories; stateless, run several)",
		Long: `Run a metadata server of the ffkit file system in the foreground.

Metadata servers keep no state of their own: inodes, directory entries,
layouts, write sessions and the garbage-collection queue live in the store
named by --kv (the same store as mgmtd's: etcd://HOST:PORT[,HOST:PORT]
for the embedded etcd of 'ffkit fs up' or an etcd cluster, mem: for a
throw-away store, fdb:CLUSTER_FILE when built with -tags fdb). Run several
for availability: each registers itself in the store, mgmtd tells clients
about the live ones, and a client whose server dies retries on another.
Create, mkdir, rename, remove and commit are idempotent under retries.

The first line on stdout is the server's address once it serves. Ctrl-C
or SIGTERM stops it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if mgmtdURL == "" || kvSpec == "" {
				return usagef("--mgmtd and --kv are required")
			}
			auth, addrs, err := parseClusterURL(mgmtdURL)
			if err != nil {
				return err
			}
			token, err := metaToken(tokenFile, auth)
			if err != nil {
				return err
			}
			tb, err := clusterTrust(tokenFile, auth)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			store, err := kv.Open(ctx, kvSpec)
			if err != nil {
				return err
			}
			defer store.Close()
			chunks, err := client.Dial(ctx, addrs, client.Options{Token: token, Trust: tb, Name: "meta"})
			if err != nil {
				return err
			}
			defer chunks.Close()
			svc, err := meta.NewService(ctx, meta.Options{Store: store, Chunks: chunks, Stripe: stripe})
			if err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			srv, err := meta.StartServer(ctx, svc, meta.ServerOptions{Listen: listen, Token: token, Trust: tb, TLSLoopback: tlsLoopback, GCInterval: gcInterval,
				Registry: reg, Faults: transport.FaultsFromEnv(),
				Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }})
			if err != nil {
				return err
			}
			defer srv.Close()
			if metrics != "" {
				ln, err := net.Listen("tcp", metrics)
				if err != nil {
					return fmt.Errorf("metrics listener: %w", err)
				}
				mux := http.NewServeMux()
				mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
				hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
				go hs.Serve(ln)
				defer hs.Close()
				fmt.Fprintf(os.Stderr, "meta: metrics on http://%s/metrics\n", ln.Addr())
			}
			fmt.Fprintln(cmd.OutOrStdout(), srv.Addr())
			<-ctx.Done()
			return nil
		},
	}
	c.Flags().StringVar(&mgmtdURL, "mgmtd", "", "the cluster's mgmtd, ffkit://HOST:PORT[,HOST:PORT] (required)")
	c.Flags().StringVar(&kvSpec, "kv", "", "the metadata store: etcd://HOST:PORT[,...][/PREFIX], mem:, fdb:CLUSTER_FILE (required)")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "address to serve on")
	c.Flags().StringVar(&tokenFile, "token-file", "", "file holding the cluster token (default $FFKIT_TOKEN, then the user's token file)")
	c.Flags().StringVar(&metrics, "metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9102)")
	c.Flags().IntVar(&stripe, "stripe", 8, "chains a new file's chunks rotate over")
	c.Flags().DurationVar(&gcInterval, "gc-interval", time.Second, "how often the garbage collector runs")
	tlsLoopbackFlag(c, &tlsLoopback)
	return c
}
