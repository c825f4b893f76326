package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/internal/units"
	"github.com/ffkit/ffkit/scan"
)

func init() { registerBench(newBenchScanCmd) }

func newBenchScanCmd() *cobra.Command {
	var o scan.BenchOptions
	var repSize string
	memory := units.Size(2 * units.GiB)
	c := &cobra.Command{
		Use:   "scan",
		Short: "Columnar scan jobs next to DuckDB (duckdb-go) on the same generated data",
		Long: `Generates a Parquet file with DuckDB (key BIGINT, value DOUBLE, category
VARCHAR (16 values), day DATE (sorted), user_id INTEGER (100k values);
122,880-row row groups, zstd) and times, in the same run and interleaved,
ffkit scan against DuckDB with the same thread count:

  filter+project             key, value WHERE value > 0.99, written to Parquet
  filter, pruned row groups  WHERE day >= '2020-12-01' (statistics prune)
  group-by 16 / 100k groups  count, sum, mean, min, max
  hash repartition xN        all columns into N Parquet partitions
  scan to memory             ffkit's reader vs parquet-go's page-level reader
                             and DuckDB, filter + sum into memory

The ratio is the baseline's time over ffkit's (above 1: ffkit is faster);
the cpu ratio is the same for process CPU seconds (both engines run in this
process), which a busy shared machine disturbs less than wall time.
The hash repartition is also reported in uncompressed MiB/s per core next
to SmallPond's GraySort (110.5 TiB in 30 min 14 s on 50 x 192 cores); with
--repartition-size it runs on a separate input of that many uncompressed
bytes (generated once into --dir, streamed by both engines; DuckDB gets
--memory-budget, ffkit's buffers are bounded by its row-group byte caps).
Each measurement starts with one untimed run of each engine, and the order
alternates between runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if repSize != "" {
				n, err := bench.ParseSize(repSize)
				if err != nil || n <= 0 {
					return usagef("--repartition-size %q: want a size such as 4G (%v)", repSize, err)
				}
				o.RepartitionBytes = n
			}
			if memory < 1 {
				return usagef("--memory-budget %s: want a positive size such as 2G", memory.String())
			}
			// DuckDB reads "NB" as N bytes.
			o.MemoryLimit = fmt.Sprintf("%dB", int64(memory))
			scanGC() // as ffkit scan runs
			o.Log = func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), "bench scan: "+format+"\n", a...) }
			res, err := scan.Bench(cmd.Context(), o)
			if err != nil {
				return err
			}
			if jsonOut {
				return printJSON(res)
			}
			w := human()
			fmt.Fprintf(w, "data: %d rows, %d row groups, %.1f MiB parquet (%.1f MiB uncompressed); %d workers / DuckDB %s threads=%d; median of %d interleaved runs\n",
				res.Rows, res.RowGroups, float64(res.FileBytes)/(1<<20), float64(res.UncompressedSize)/(1<<20), res.Workers, res.DuckDBVersion, res.Workers, res.Runs)
			fmt.Fprintf(w, "%-28s %8s %12s %8s %7s %8s %8s %7s %6s\n", "query", "ffkit s", "baseline", "base s", "ratio", "ffkit cpu", "base cpu", "cpu ratio", "goal")
			for _, r := range res.Results {
				goal := ""
				if r.Goal > 0 {
					goal = fmt.Sprintf(">=%.1f", r.Goal)
				}
				fmt.Fprintf(w, "%-28s %8.3f %12s %8.3f %6.2fx %8.3f %8.3f %6.2fx %6s\n", r.Name, r.FFkitSeconds, r.Baseline, r.BaseSeconds, r.Ratio, r.FFkitCPU, r.BaseCPU, r.CPURatio, goal)
			}
			if res.RepartitionInputBytes > 0 {
				fmt.Fprintf(w, "hash repartition of %.2f GiB uncompressed (%d rows, %.2f GiB parquet): ffkit %.1f MiB/s per core, DuckDB %.1f MiB/s per core, SmallPond GraySort %.1f MiB/s per core (110.5 TiB / 30m14s / 9600 cores)\n",
					float64(res.RepartitionInputBytes)/(1<<30), res.RepartitionRows, float64(res.RepartitionFileBytes)/(1<<30),
					res.RepartitionMiBsPerCore, res.DuckDBRepartitionMiBsPerCore, res.GraySortMiBsPerCore)
				fmt.Fprintf(w, "  per CPU second used (user+system): ffkit %.1f MiB, DuckDB %.1f MiB\n", res.RepartitionMiBsPerCPUSecond, res.DuckDBRepartitionMiBsPerCPUSecond)
			}
			fmt.Fprintf(w, "peak RSS of the process (both engines): %.0f MiB\n", float64(res.MaxRSSBytes)/(1<<20))
			return nil
		},
	}
	f := c.Flags()
	f.Int64Var(&o.Rows, "rows", 5_000_000, "rows of generated data")
	f.StringVar(&o.Dir, "dir", "", "directory for the data and outputs (default: a temporary one, removed)")
	f.IntVar(&o.Workers, "workers", 0, "bounds ffkit's parallel tasks and DuckDB's threads alike (0: one per CPU)")
	f.IntVar(&o.Runs, "runs", 5, "runs per engine per measurement, interleaved with alternating order (median reported)")
	f.IntVar(&o.Partitions, "partitions", 16, "partitions of the hash repartition")
	f.StringVar(&repSize, "repartition-size", "", "time the hash repartition on a separate generated input of this uncompressed size (e.g. 4G; default: the --rows data)")
	f.StringSliceVar(&o.Only, "only", nil, "run only these measurements: "+strings.Join(scan.BenchQueries, ", "))
	f.IntVar(&o.RepartitionRuns, "repartition-runs", 1, "runs per engine of the --repartition-size repartition")
	f.Var(&memory, "memory-budget", "bound on DuckDB's memory while it generates and repartitions the --repartition-size input (K, M, G suffixes)")
	f.Var(&memory, "duckdb-memory", "old name of --memory-budget")
	_ = f.MarkDeprecated("duckdb-memory", "use --memory-budget")
	return c
}
