package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/etcdkv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/meta"
	"github.com/ffkit/ffkit/fs/proto"
)

func init() { registerBench(newBenchMetaCmd) }

// benchMetaRow is one (store, operation) figure.
type benchMetaRow struct {
	Store     string  `json:"store"`
	Op        string  `json:"op"`
	Ops       int64   `json:"ops"`
	OpsPerSec float64 `json:"ops_per_s"`
	// Baseline: single-key read-modify-write transactions per second on
	// the same store at the same concurrency (the store's own rate).
	BaselineTxnPerSec float64 `json:"baseline_txn_per_s"`
	Ratio             float64 `json:"ratio"`
}

// fixedChains is the chain table the benchmark's layouts are drawn from:
// metadata operations never touch the data plane, except for garbage
// collection, which the benchmark does not run.
type fixedChains struct{}

func (fixedChains) Chains() []proto.ChainID { return []proto.ChainID{1, 2, 3, 4, 5, 6, 7, 8} }
func (fixedChains) ChunkSize() int64        { return proto.DefaultChunkSize }
func (fixedChains) RemoveChunks(context.Context, proto.ChainID, uint64, uint64) error {
	return fmt.Errorf("bench meta: no data plane")
}
func (fixedChains) TruncateChunk(context.Context, proto.ChainID, proto.ChunkID, int64) error {
	return fmt.Errorf("bench meta: no data plane")
}

func newBenchMetaCmd() *cobra.Command {
	var (
		stores      string
		duration    time.Duration
		concurrency int
		dirSize     int
	)
	c := &cobra.Command{
		Use:   "meta",
		Short: "Metadata operations per second (create, stat, readdir) on the KV backends",
		Long: `Measure the metadata service: a metadata server (in this process, over
the cluster transport on loopback) and --concurrency clients doing creates
(exclusive, new names), stats of existing files, and listings of a
--dir-size-entry directory, for --duration each, on each store of --stores:

  embedded  a single-member etcd embedded in this process (the default of 'fs up')
  etcd3     a real three-member etcd cluster started on loopback
  mem       the in-memory store (no durability: the ceiling of the service logic)

Baseline, measured in the same run on the same store at the same
concurrency: single-key read-modify-write kv transactions per second; the
ratio is metadata ops/s over that. Temporary stores live under $TMPDIR.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if concurrency < 1 || duration <= 0 || dirSize < 1 {
				return usagef("--concurrency, --duration and --dir-size must be positive")
			}
			ctx := cmd.Context()
			var rows []benchMetaRow
			for _, name := range strings.Split(stores, ",") {
				name = strings.TrimSpace(name)
				store, closeStore, err := benchMetaStore(ctx, name)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "bench meta: %s...\n", name)
				r, err := benchMetaOn(ctx, name, store, duration, concurrency, dirSize)
				closeStore()
				if err != nil {
					return fmt.Errorf("bench meta on %s: %w", name, err)
				}
				rows = append(rows, r...)
			}
			if jsonOut {
				return printJSON(rows)
			}
			w := human()
			fmt.Fprintf(w, "%-9s %-8s %10s %14s %10s\n", "STORE", "OP", "OPS/S", "KV TXN/S", "RATIO")
			for _, r := range rows {
				fmt.Fprintf(w, "%-9s %-8s %10.0f %14.0f %10.2f\n", r.Store, r.Op, r.OpsPerSec, r.BaselineTxnPerSec, r.Ratio)
			}
			fmt.Fprintf(w, "(%d clients; baseline: single-key read-modify-write kv transactions/s on the same store, same run)\n", concurrency)
			return nil
		},
	}
	c.Flags().StringVar(&stores, "stores", "embedded,etcd3", "stores to measure: embedded, etcd3, mem (comma-separated)")
	c.Flags().DurationVar(&duration, "duration", 3*time.Second, "how long each operation runs")
	c.Flags().IntVar(&concurrency, "concurrency", 8, "concurrent clients")
	c.Flags().IntVar(&dirSize, "dir-size", 100, "entries in the listed directory")
	return c
}

func benchMetaStore(ctx context.Context, name string) (kv.Store, func(), error) {
	switch name {
	case "mem":
		s := memkv.New(memkv.Options{})
		return s, func() { s.Close() }, nil
	case "embedded":
		dir, err := os.MkdirTemp("", "ffkit-bench-meta")
		if err != nil {
			return nil, nil, err
		}
		s, _, err := etcdkv.OpenEmbedded(ctx, dir, "", nil, etcdkv.Options{})
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
		return s, func() { s.Close(); os.RemoveAll(dir) }, nil
	case "etcd3":
		dir, err := os.MkdirTemp("", "ffkit-bench-meta")
		if err != nil {
			return nil, nil, err
		}
		cl, err := etcdkv.StartCluster(ctx, dir, 3)
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
		s, err := etcdkv.Open(ctx, cl.Endpoints(), etcdkv.Options{})
		if err != nil {
			cl.Close()
			os.RemoveAll(dir)
			return nil, nil, err
		}
		return s, func() { s.Close(); cl.Close(); os.RemoveAll(dir) }, nil
	}
	return nil, nil, usagef("unknown store %q (want embedded, etcd3 or mem)", name)
}

// runFor runs op from n goroutines for d and returns the operations done.
func runFor(ctx context.Context, n int, d time.Duration, op func(ctx context.Context, worker int, i int64) error) (int64, float64, error) {
	var count atomic.Int64
	start := time.Now()
	deadline := start.Add(d)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(n)
	for w := 0; w < n; w++ {
		g.Go(func() error {
			for i := int64(0); time.Now().Before(deadline); i++ {
				if err := op(gctx, w, i); err != nil {
					return err
				}
				count.Add(1)
			}
			return nil
		})
	}
	err := g.Wait()
	secs := time.Since(start).Seconds()
	return count.Load(), float64(count.Load()) / secs, err
}

func benchMetaOn(ctx context.Context, name string, store kv.Store, d time.Duration, n, dirSize int) ([]benchMetaRow, error) {
	// Baseline: the store's own transaction rate.
	_, base, err := runFor(ctx, n, d, func(ctx context.Context, w int, i int64) error {
		k := []byte(fmt.Sprintf("bench/txn/%d/%d", w, i%64))
		return store.Update(ctx, func(tx kv.Txn) error {
			v, _, err := tx.Get(ctx, k)
			if err != nil {
				return err
			}
			tx.Set(k, append(v[:len(v):len(v)], 'x')[:min(len(v)+1, 16)])
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	svc, err := meta.NewService(ctx, meta.Options{Store: store, Chunks: fixedChains{}})
	if err != nil {
		return nil, err
	}
	token := fmt.Sprintf("bench-%x", rand.Uint64())
	srv, err := meta.StartServer(ctx, svc, meta.ServerOptions{Token: token, GCInterval: -1, Logf: func(string, ...any) {}})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	cl, err := meta.NewClient(meta.ClientOptions{Token: token, Servers: []string{srv.Addr()}})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	run := fmt.Sprintf("/bench-%x", rand.Uint32())
	if _, err := cl.Mkdir(ctx, run+"/create", true); err != nil {
		return nil, err
	}
	if _, err := cl.Mkdir(ctx, run+"/list", true); err != nil {
		return nil, err
	}
	row := func(op string, ops int64, rate float64) benchMetaRow {
		return benchMetaRow{Store: name, Op: op, Ops: ops, OpsPerSec: rate, BaselineTxnPerSec: base, Ratio: rate / base}
	}
	var rows []benchMetaRow
	perWorker := make([]atomic.Int64, n) // files each worker created
	created, rate, err := runFor(ctx, n, d, func(ctx context.Context, w int, i int64) error {
		_, err := cl.Create(ctx, fmt.Sprintf("%s/create/w%d-%d", run, w, i), true)
		if err == nil {
			perWorker[w].Add(1)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	rows = append(rows, row("create", created, rate))
	ops, rate, err := runFor(ctx, n, d, func(ctx context.Context, w int, i int64) error {
		_, err := cl.Stat(ctx, fmt.Sprintf("%s/create/w%d-%d", run, w, i%max(perWorker[w].Load(), 1)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	rows = append(rows, row("stat", ops, rate))
	for i := 0; i < dirSize; i++ {
		if _, err := cl.Create(ctx, fmt.Sprintf("%s/list/f%05d", run, i), true); err != nil {
			return nil, err
		}
	}
	ops, rate, err = runFor(ctx, n, d, func(ctx context.Context, w int, i int64) error {
		es, err := cl.Readdir(ctx, run+"/list")
		if err == nil && len(es) != dirSize {
			err = fmt.Errorf("listing has %d entries, want %d", len(es), dirSize)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("readdir: %w", err)
	}
	rows = append(rows, row(fmt.Sprintf("readdir%d", dirSize), ops, rate))
	return rows, nil
}
