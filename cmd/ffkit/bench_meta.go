package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/bench"
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
		mountDir    string
		localDir    string
		threadsStr  string
		entries     int
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
ratio is metadata ops/s over that. Temporary stores live under $TMPDIR.

With --mount DIR, measure POSIX metadata calls through a mounted file
system ('ffkit fs mount') instead, beside the same calls on a local
directory (--local, default $TMPDIR) in the same run: --entries files
created (open O_CREAT|O_WRONLY, as mdtest, and close, then fsync of each directory),
stated, listed (one listing of the fresh directory) and unlinked (then
fsync of each directory): creates and unlinks a mount answered early
are counted until they are stored, by each thread count of --threads. One
thread works in one directory; with several, each thread has its own
directory (as mdtest's unique-directory mode) and the entries are split
among them. The ratio is mount over local.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if mountDir != "" {
				threads, err := bench.ParseInts(threadsStr)
				if err != nil {
					return err
				}
				if entries < 1 {
					return usagef("--entries must be positive")
				}
				if localDir == "" {
					localDir = os.TempDir()
				}
				return benchMetaMount(cmd.Context(), mountDir, localDir, threads, entries)
			}
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
	c.Flags().StringVar(&mountDir, "mount", "", "a mounted file system ('ffkit fs mount'): measure POSIX metadata calls through it against --local")
	c.Flags().StringVar(&localDir, "local", "", "the local-disk directory of the --mount baseline (default $TMPDIR)")
	c.Flags().StringVar(&threadsStr, "threads", "1,16", "thread counts of the --mount rows")
	c.Flags().IntVar(&entries, "entries", 5000, "files per --mount row")
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

// benchMetaMountRow is one (threads, operation) figure of --mount.
type benchMetaMountRow struct {
	Threads     int     `json:"threads"`
	Op          string  `json:"op"`
	Entries     int     `json:"entries"`
	LocalPerSec float64 `json:"local_per_s"`
	MountPerSec float64 `json:"mount_per_s"`
	Ratio       float64 `json:"ratio"` // mount over local
}

// benchMetaMount runs the POSIX metadata rows on mnt and local, for each
// thread count, local first then the mount for every operation.
func benchMetaMount(ctx context.Context, mnt, local string, threads []int, entries int) error {
	for _, d := range []string{mnt, local} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return usagef("%s is not a directory (%v)", d, err)
		}
	}
	tag := fmt.Sprintf("ffkit-bench-meta-%d-%x", os.Getpid(), rand.Uint32())
	var rows []benchMetaMountRow
	for _, n := range threads {
		if n < 1 {
			return usagef("--threads: %d", n)
		}
		var res [2]map[string]float64
		for i, root := range []string{local, mnt} {
			fmt.Fprintf(os.Stderr, "bench meta: %d thread(s) on %s...\n", n, root)
			base := filepath.Join(root, fmt.Sprintf("%s-t%d", tag, n))
			r, err := benchMetaPOSIX(ctx, base, n, entries)
			os.RemoveAll(base)
			if err != nil {
				return fmt.Errorf("bench meta on %s: %w", root, err)
			}
			res[i] = r
		}
		for _, op := range []string{"create", "stat", "list", "unlink"} {
			l, m := res[0][op], res[1][op]
			rows = append(rows, benchMetaMountRow{Threads: n, Op: op, Entries: entries, LocalPerSec: l, MountPerSec: m, Ratio: m / l})
		}
	}
	if jsonOut {
		return printJSON(rows)
	}
	w := human()
	fmt.Fprintf(w, "%-7s %-7s %12s %12s %9s\n", "THREADS", "OP", "LOCAL/S", "MOUNT/S", "RATIO")
	for _, r := range rows {
		fmt.Fprintf(w, "%-7d %-7s %12.0f %12.0f %9.4f\n", r.Threads, r.Op, r.LocalPerSec, r.MountPerSec, r.Ratio)
	}
	fmt.Fprintf(w, "(%d entries per row; list: entries/s of one listing of each fresh directory; local: %s, mount: %s, same run)\n", entries, local, mnt)
	return nil
}

// benchMetaPOSIX creates, stats, lists and unlinks entries files under
// base with n threads (one directory each) and returns each operation's
// rate per second.
func benchMetaPOSIX(ctx context.Context, base string, n, entries int) (map[string]float64, error) {
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = filepath.Join(base, fmt.Sprintf("t%02d", i))
		if err := os.MkdirAll(dirs[i], 0o755); err != nil {
			return nil, err
		}
	}
	name := func(t, i int) string { return filepath.Join(dirs[t], fmt.Sprintf("f%07d", i)) }
	each := func(op func(t, i int) error) (float64, error) {
		start := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		for t := range n {
			g.Go(func() error {
				for i := t; i < entries; i += n {
					if err := gctx.Err(); err != nil {
						return err
					}
					if err := op(t, i); err != nil {
						return err
					}
				}
				return nil
			})
		}
		err := g.Wait()
		return float64(entries) / time.Since(start).Seconds(), err
	}
	out := map[string]float64{}
	var err error
	createStart := time.Now()
	if _, err = each(func(t, i int) error {
		f, err := os.OpenFile(name(t, i), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}); err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	// As for unlinks below: creates a mount answered early count until
	// fsync of each directory says they are stored.
	for _, d := range dirs {
		if err := syncDir(d); err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
	}
	out["create"] = float64(entries) / time.Since(createStart).Seconds()
	if out["stat"], err = each(func(t, i int) error {
		_, err := os.Stat(name(t, i))
		return err
	}); err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	start := time.Now()
	g, _ := errgroup.WithContext(ctx)
	for t := range n {
		g.Go(func() error {
			ents, err := os.ReadDir(dirs[t])
			if err == nil && len(ents) != (entries-t+n-1)/n {
				err = fmt.Errorf("listing of %s has %d entries, want %d", dirs[t], len(ents), (entries-t+n-1)/n)
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	out["list"] = float64(entries) / time.Since(start).Seconds()
	// A mount may answer unlinks before they reach the storage: the row
	// ends when fsync of each directory says they all have.
	start = time.Now()
	if _, err = each(func(t, i int) error { return os.Remove(name(t, i)) }); err != nil {
		return nil, fmt.Errorf("unlink: %w", err)
	}
	for _, d := range dirs {
		if err := syncDir(d); err != nil {
			return nil, fmt.Errorf("unlink: %w", err)
		}
	}
	out["unlink"] = float64(entries) / time.Since(start).Seconds()
	return out, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
