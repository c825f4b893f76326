package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ffkit/ffkit/internal/units"
	"github.com/ffkit/ffkit/scan"
)

func init() { register(newScanCmd) }

func newScanCmd() *cobra.Command {
	var (
		job       scan.Job
		groupBy   string
		planFile  string
		task      taskFlags
		shardSize units.Size
		memory    = units.Size(units.GiB)
	)
	c := &cobra.Command{
		Use:   "scan SRC... -o OUT",
		Short: "Run a SmallPond-style columnar job: read Parquet, partition, filter/aggregate/SQL, write",
		Long: `Read Parquet files (files, globs, directories; local or ffkit:// paths),
optionally partition them (by files, rows, or hash of columns into N),
transform each partition (native filter / projection / computed columns,
group-by aggregates, or a DuckDB SQL query with the partition as table
"input"), and write Parquet (zstd), FFRecord, CSV, JSON lines or Arrow IPC.

OUT ending in the format's extension (.parquet, .csv, .jsonl, .arrow) is one
file; otherwise it is a directory of part files, at least one per partition
(part-PPPPP*.EXT). Every task writes to a staging name and is published by
an atomic rename; rerunning the same job skips published tasks, and a
changed job (inputs, query or options) replaces the old output.

--where takes a SQL boolean expression: comparisons, arithmetic, AND/OR/NOT,
IN, BETWEEN, IS [NOT] NULL, LIKE/ILIKE, with SQL null semantics. Row groups
whose statistics rule the filter out are not read.

Examples:
  ffkit scan data/ --where "score > 0.9 AND lang = 'en'" --columns id,text -o out.parquet
  ffkit scan 'logs/*.parquet' --group-by user --agg 'count(*),sum(bytes),mean(latency)' -o agg.parquet
  ffkit scan data/ --partition-by hash:user --partitions 16 -o shuffled/
  ffkit scan a/ --join b/ --partition-by hash:id --partitions 8 \
      --sql 'SELECT * FROM input JOIN input2 USING (id)' -o joined/
  ffkit scan data/ --where 'length(text) > 10' --format ffrecord --sample-column text -o packed/
  ffkit scan --plan pipeline.json

--plan FILE runs a multi-stage plan (JSON; see docs/scan.md): named stages,
each a scan job whose inputs may be other stages' outputs ("@NAME"), run in
dependency order; a rerun recomputes only the stages that changed and the
stages that read them.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if planFile != "" || task.job != "" || task.pending || task.task != "" {
				return nil // runPlan and runJobTask check
			}
			return cobra.MinimumNArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			scanGC()
			if task.job != "" {
				return runJobTask(cmd, args, task)
			}
			if task.pending || task.task != "" {
				return usagef("scan: --pending and --task go with --job FILE")
			}
			if planFile != "" {
				if len(args) > 0 {
					return usagef("scan: --plan takes no SRC (the plan file names the inputs and outputs)")
				}
				var other []string
				for _, name := range []string{"output", "columns", "where", "group-by", "agg", "sql", "join", "partition-by",
					"partitions", "format", "sample-column", "shard-size", "row-group-rows", "memory-budget", "memory-limit", "retries"} {
					if cmd.Flags().Changed(name) {
						other = append(other, "--"+name)
					}
				}
				if len(other) > 0 {
					return usagef("scan: --plan takes only --workers, not %s (set job options per stage in the plan file)", strings.Join(other, ", "))
				}
				return runPlan(cmd, planFile, job.Workers)
			}
			job.Inputs = args
			if groupBy != "" {
				for _, k := range strings.Split(groupBy, ",") {
					if k = strings.TrimSpace(k); k != "" {
						job.GroupBy = append(job.GroupBy, k)
					}
				}
			}
			if job.Output == "" {
				return usagef("scan: -o OUT is required")
			}
			if err := checkScanFlags(cmd.Flags(), &job, shardSize, memory); err != nil {
				return err
			}
			var bar *progressbar.ProgressBar
			var once sync.Once
			if isTerminal() {
				job.Progress = func(done, total int64) {
					once.Do(func() {
						bar = progressbar.NewOptions64(total,
							progressbar.OptionSetWriter(cmd.ErrOrStderr()),
							progressbar.OptionSetDescription("scan"),
							progressbar.OptionShowCount(),
							progressbar.OptionSetItsString("rows"),
							progressbar.OptionShowIts(),
							progressbar.OptionThrottle(100e6),
							progressbar.OptionClearOnFinish())
					})
					if bar.GetMax64() != total {
						bar.ChangeMax64(total)
					}
					bar.Set64(done)
				}
			}
			sum, err := scan.Run(cmd.Context(), job)
			if bar != nil {
				bar.Finish()
			}
			if err != nil {
				return err
			}
			if jsonOut {
				return printJSON(sum)
			}
			w := human()
			state := ""
			if sum.UpToDate {
				state = " (already up to date)"
			}
			fmt.Fprintf(w, "scan: %d files, %s rows in, %s rows out, %s read, %d row groups (%d skipped by statistics, %d pages by page index), %d partitions, %d tasks (%d already done, %d retries), %.2fs%s\n",
				sum.InputFiles, humanize.Comma(sum.RowsIn), humanize.Comma(sum.RowsOut), humanize.IBytes(uint64(sum.BytesRead)),
				sum.RowGroups, sum.RowGroupsSkipped, sum.PagesSkipped, sum.Partitions, sum.Tasks, sum.TasksSkipped, sum.Retries, sum.Seconds, state)
			if len(sum.OutputFiles) == 1 {
				fmt.Fprintf(w, "output: %s\n", sum.OutputFiles[0])
			} else {
				fmt.Fprintf(w, "output: %s (%d files)\n", job.Output, len(sum.OutputFiles))
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&job.Output, "output", "o", "", "output file (ending in the format's extension) or directory")
	f.StringVar(&job.Columns, "columns", "", "output columns and computed expressions: 'a, b, x*2 AS y' (default all)")
	f.StringVar(&job.Where, "where", "", "SQL boolean filter, e.g. \"x > 3 AND name LIKE 'a%'\"")
	f.StringVar(&groupBy, "group-by", "", "group keys, comma-separated (with --agg)")
	f.StringVar(&job.Aggs, "agg", "", "aggregates: 'count(*), sum(x), min(y), max(y), mean(x)'")
	f.StringVar(&job.SQL, "sql", "", "DuckDB SQL run per partition; the partition is the table input (and input2 with --join)")
	f.StringSliceVar(&job.JoinInputs, "join", nil, "second input, hash-partitioned like the first, visible to --sql as input2")
	f.StringVar(&job.PartitionBy, "partition-by", "", "files, rows, hash:COL[,COL...], or column:COL (an integer column holding the partition number)")
	f.IntVar(&job.Partitions, "partitions", 1, "number of partitions N (at least 1)")
	f.IntVar(&job.Workers, "workers", 0, "bounds the tasks run at once and the row groups decoded at once (0: one per CPU)")
	f.StringVar(&job.Format, "format", "parquet", "output format: parquet, ffrecord, csv, jsonl, arrow (Arrow IPC file, memory-mappable)")
	f.StringVar(&job.SampleColumn, "sample-column", "", "with --format ffrecord: the binary/string column packed as one sample per row")
	shardSize = units.Size(256 * units.MiB)
	f.Var(&shardSize, "shard-size", "with --format ffrecord: target shard size (K, M, G suffixes)")
	f.Int64Var(&job.RowGroupRows, "row-group-rows", scan.DefaultRowGroupRows, "rows per Parquet output row group (at least 1)")
	f.Var(&memory, "memory-budget", "bound on DuckDB's memory per --sql task (K, M, G suffixes)")
	f.Var(&memory, "memory-limit", "old name of --memory-budget")
	_ = f.MarkDeprecated("memory-limit", "use --memory-budget")
	f.IntVar(&job.Retries, "retries", 2, "retries of a failed task (0: none)")
	f.StringVar(&planFile, "plan", "", "run the multi-stage plan in this JSON file (local or ffkit://)")
	f.StringVar(&task.job, "job", "", "run the one job in this JSON file (a plan stage's keys; - reads stdin)")
	f.BoolVar(&task.pending, "pending", false, "with --job: print the tasks runnable now as JSON, or finish the job when none is left")
	f.StringVar(&task.task, "task", "", "with --job: run only this task (a name --pending printed)")
	return c
}

// runPlan runs `scan --plan FILE`; workers, if set, applies to a plan
// that sets none.
func runPlan(cmd *cobra.Command, file string, workers int) error {
	p, err := scan.LoadPlan(cmd.Context(), file)
	if err != nil {
		return err
	}
	if p.Workers == 0 {
		p.Workers = workers
	}
	sum, err := scan.RunPlan(cmd.Context(), *p)
	if err != nil {
		return err
	}
	if jsonOut {
		return printJSON(sum)
	}
	w := human()
	for _, s := range sum.Stages {
		state := ""
		if s.UpToDate || s.TasksSkipped == s.Tasks {
			state = " (already up to date)"
		}
		fmt.Fprintf(w, "stage %s: %s rows in, %s rows out, %d tasks (%d already done), %.2fs -> %s%s\n",
			s.Name, humanize.Comma(s.RowsIn), humanize.Comma(s.RowsOut), s.Tasks, s.TasksSkipped, s.Seconds, s.Output, state)
	}
	fmt.Fprintf(w, "plan: %d stages run, %d up to date, %.2fs\n", sum.Ran, sum.Skipped, sum.Seconds)
	return nil
}

// checkScanFlags refuses counts and sizes that make no sense, naming the
// flag (the job would silently take its default for some of them), and
// hands the sizes to the job.
func checkScanFlags(f *pflag.FlagSet, job *scan.Job, shardSize, memory units.Size) error {
	switch {
	case job.Partitions < 1:
		return usagef("--partitions %d: want at least 1", job.Partitions)
	case job.Workers < 0:
		return usagef("--workers %d is negative (0: one per CPU)", job.Workers)
	case job.RowGroupRows < 1:
		return usagef("--row-group-rows %d: want at least 1", job.RowGroupRows)
	case job.Retries < 0:
		return usagef("--retries %d is negative (0: no retries)", job.Retries)
	case shardSize < 1:
		return usagef("--shard-size %s: want a positive size such as 256M", shardSize.String())
	case memory < 1:
		return usagef("--memory-budget %s: want a positive size such as 1G", memory.String())
	}
	if f.Changed("shard-size") && job.Format != scan.FormatFFRecord {
		return usagef("--shard-size applies to --format ffrecord")
	}
	job.ShardSize = int64(shardSize)
	// DuckDB reads "NB" as N bytes.
	job.MemoryLimit = fmt.Sprintf("%dB", int64(memory))
	if job.Retries == 0 {
		// scan.Job reads 0 as its default (2); a negative count is none.
		job.Retries = -1
	}
	return nil
}

// scanGC makes the garbage collector less eager for scan jobs (GOGC=400
// unless GOGC is set): a scan allocates large, short-lived column buffers
// over a small live heap, and the default spends CPU collecting them.
func scanGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}
