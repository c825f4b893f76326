package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/proto"
)

func init() { registerFS(newFSStatusCmd) }

// fsStatus is the JSON shape of `ffkit fs status --json`.
type fsStatus struct {
	Cluster        string        `json:"cluster"`
	RoutingVersion uint64        `json:"routing_version"`
	ChunkSize      int64         `json:"chunk_size"`
	Chains         []proto.Chain `json:"chains"`
	Nodes          []proto.Node  `json:"nodes"`
	// Space is every target's latest space report (see fs df).
	Space []proto.TargetUsage `json:"space"`
}

func newFSStatusCmd() *cobra.Command {
	var cluster, tokenFile string
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "status ffkit://HOST:PORT",
		Short: "Show the routing version and every chain's targets and states",
		Long: `Show the cluster's routing as mgmtd publishes it: the routing version and,
for each chain, its version and its targets in chain order (head first)
with their storage node and state (serving, syncing, waiting, lastsrv,
offline). With --json: {"routing_version": N, "chains": [{"id", "version",
"targets": [{"id", "node", "state"}]}], "nodes": [{"id", "addr"}],
"space": [{"id", "node", "used", "capacity", "free", "fs", "reported_ns"}]}
(space: each target's latest heartbeat report; see fs df).
The cluster URL is the argument, as for every fs command (--cluster URL is
the old spelling, still accepted).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 1 && cluster != "" && args[0] != cluster:
				return usagef("two cluster URLs: %s and --cluster %s", args[0], cluster)
			case len(args) == 1:
				cluster = args[0]
			case cluster == "":
				return usagef("fs status needs the cluster URL: ffkit fs status ffkit://HOST:PORT")
			}
			auth, addrs, err := parseClusterURL(cluster)
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
			ctx := cmd.Context()
			cl, err := client.Dial(ctx, addrs, client.Options{Token: token, Trust: tb, RequestTimeout: timeout, RetryTimeout: timeout})
			if err != nil {
				return err
			}
			defer cl.Close()
			sr, err := cl.Status(ctx)
			if err != nil {
				return err
			}
			r := sr.Routing
			st := fsStatus{Cluster: "ffkit://" + auth, RoutingVersion: r.Version, ChunkSize: r.ChunkSize, Chains: r.Chains, Nodes: r.Nodes, Space: sr.Targets}
			if st.Chains == nil {
				st.Chains = []proto.Chain{}
			}
			if jsonOut {
				return printJSON(st)
			}
			w := human()
			fmt.Fprintf(w, "cluster %s  routing version %d  chunk size %d\n", st.Cluster, st.RoutingVersion, st.ChunkSize)
			if len(st.Chains) == 0 {
				fmt.Fprintln(w, "no chains yet (waiting for storage targets to register)")
			}
			for _, ch := range st.Chains {
				var parts []string
				for _, t := range ch.Targets {
					parts = append(parts, fmt.Sprintf("%d@node%d %s", t.ID, t.Node, t.State))
				}
				fmt.Fprintf(w, "chain %d  v%d  %s\n", ch.ID, ch.Version, strings.Join(parts, " -> "))
			}
			for _, n := range st.Nodes {
				fmt.Fprintf(w, "node %d  %s\n", n.ID, n.Addr)
			}
			return nil
		},
	}
	c.Flags().StringVar(&cluster, "cluster", "", "old spelling of the URL argument")
	_ = c.Flags().MarkDeprecated("cluster", "pass the cluster URL as the argument: ffkit fs status ffkit://HOST:PORT")
	c.Flags().StringVar(&tokenFile, "token-file", "", "file holding the cluster token (default: $FFKIT_TOKEN, else ~/.config/ffkit/tokens.json)")
	c.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for mgmtd")
	return c
}
