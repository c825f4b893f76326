package scan

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	pq "github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding"
	"golang.org/x/sync/errgroup"
)

// BenchOptions configure Bench.
type BenchOptions struct {
	// Rows of generated data. Default 5,000,000.
	Rows int64
	// Dir holds the generated data and outputs. Default: a temporary
	// directory, removed afterwards.
	Dir string
	// Workers for ffkit and threads for DuckDB. Default: CPUs.
	Workers int
	// Runs per measurement; the median is reported. Default 5.
	Runs int
	// Partitions of the hash repartition. Default 16.
	Partitions int
	// RepartitionBytes, if set, times the hash repartition on a separate
	// generated input of about this many uncompressed bytes (the same
	// columns, more rows), streamed from disk; 0 repartitions the main data.
	RepartitionBytes int64
	// RepartitionRuns per engine on that input. Default 1.
	RepartitionRuns int
	// MemoryLimit is DuckDB's memory_limit while it generates and
	// repartitions the big input (ffkit's own buffers are bounded by its
	// row-group byte caps). Default "2GB".
	MemoryLimit string
	// Only, if set, limits the measurements to these: filter, pruned,
	// groupby, repartition, memory.
	Only []string
	// Log, if set, receives progress lines.
	Log func(format string, args ...any)
}

// BenchQueries are the names BenchOptions.Only accepts.
var BenchQueries = []string{"filter", "pruned", "groupby", "repartition", "memory"}

// BenchRow is one measurement: ffkit's median time next to the baseline's
// from the same run. Ratio is baseline time / ffkit time (above 1: ffkit
// is faster).
type BenchRow struct {
	Name         string  `json:"name"`
	What         string  `json:"what"`
	FFkitSeconds float64 `json:"ffkit_seconds"`
	Baseline     string  `json:"baseline"`
	BaseSeconds  float64 `json:"baseline_seconds"`
	Ratio        float64 `json:"ratio"`
	// CPU seconds (user+system of the process, which runs both engines)
	// are less sensitive to a busy shared machine than wall time.
	FFkitCPU      float64 `json:"ffkit_cpu_seconds"`
	BaseCPU       float64 `json:"baseline_cpu_seconds"`
	CPURatio      float64 `json:"cpu_ratio"`
	Goal          float64 `json:"goal,omitempty"`
	FFkitRowsOut  int64   `json:"ffkit_rows_out"`
	BaseRowsOut   int64   `json:"baseline_rows_out"`
	BytesRead     int64   `json:"ffkit_bytes_read,omitempty"`
	SkippedGroups int     `json:"row_groups_skipped,omitempty"`
}

// BenchResult is the whole benchmark.
type BenchResult struct {
	Rows             int64      `json:"rows"`
	RowGroups        int        `json:"row_groups"`
	FileBytes        int64      `json:"file_bytes"`
	UncompressedSize int64      `json:"uncompressed_bytes"`
	Workers          int        `json:"workers"`
	Runs             int        `json:"runs"`
	DuckDBVersion    string     `json:"duckdb_version"`
	Results          []BenchRow `json:"results"`
	// Repartition throughput, uncompressed input MiB per second per core.
	RepartitionMiBsPerCore       float64 `json:"repartition_mib_s_per_core"`
	DuckDBRepartitionMiBsPerCore float64 `json:"duckdb_repartition_mib_s_per_core"`
	// The same per CPU second the process used (user+system): what a core
	// does when it is not shared with other work.
	RepartitionMiBsPerCPUSecond       float64 `json:"repartition_mib_per_cpu_second"`
	DuckDBRepartitionMiBsPerCPUSecond float64 `json:"duckdb_repartition_mib_per_cpu_second"`
	// The repartition's input: uncompressed and file bytes, rows.
	RepartitionInputBytes int64 `json:"repartition_input_uncompressed_bytes"`
	RepartitionFileBytes  int64 `json:"repartition_input_file_bytes"`
	RepartitionRows       int64 `json:"repartition_input_rows"`
	// MaxRSSBytes is the process's peak resident set (both engines).
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	// SmallPond's GraySort: 110.5 TiB in 30 min 14 s on 50 x 192 cores.
	GraySortMiBsPerCore float64 `json:"smallpond_graysort_mib_s_per_core"`
}

// GraySortMiBsPerCore is SmallPond's published GraySort rate per core.
func graySortMiBsPerCore() float64 {
	return 110.5 * (1 << 20) / (30*60 + 14) / (50 * 192)
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// Bench generates data with DuckDB and times ffkit against DuckDB (through
// duckdb-go, same thread count) on the same files in the same run:
// a selective filter+projection, a filter that row-group statistics
// prune, group-by aggregates, and a hash repartition; plus the raw scan
// of ffkit's reader next to parquet-go's page-level reader.
func Bench(ctx context.Context, o BenchOptions) (*BenchResult, error) {
	if o.Rows <= 0 {
		o.Rows = 5_000_000
	}
	if o.Workers <= 0 {
		o.Workers = defaultWorkers()
	}
	if o.Runs <= 0 {
		o.Runs = 5
	}
	if o.Partitions <= 0 {
		o.Partitions = 16
	}
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "ffkit-scan-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench scan: %w", err)
	}
	db, err := sql.Open("duckdb", "")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, fmt.Sprintf("SET threads=%d", o.Workers)); err != nil {
		return nil, err
	}
	res := &BenchResult{Rows: o.Rows, Workers: o.Workers, Runs: o.Runs, GraySortMiBsPerCore: graySortMiBsPerCore()}
	db.QueryRowContext(ctx, "SELECT version()").Scan(&res.DuckDBVersion)
	in := filepath.Join(dir, "data.parquet")
	if _, err := os.Stat(in); err != nil {
		logf("generating %d rows with DuckDB into %s", o.Rows, in)
		gen := fmt.Sprintf(`COPY (SELECT i AS key, hash(i) / 18446744073709551615.0 AS value,
			'category_' || (i %% 16)::VARCHAR AS category,
			(DATE '2020-01-01' + (i * 365 // %d)::INTEGER) AS day,
			(i %% 100000)::INTEGER AS user_id
			FROM range(%d) t(i)) TO '%s' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)`, o.Rows, o.Rows, in)
		if _, err := db.ExecContext(ctx, gen); err != nil {
			return nil, fmt.Errorf("generate: %w", err)
		}
	}
	pf, err := OpenFile(ctx, in, nil)
	if err != nil {
		return nil, err
	}
	res.RowGroups = pf.NumRowGroups()
	res.FileBytes = pf.Size
	for rg := 0; rg < pf.NumRowGroups(); rg++ {
		res.UncompressedSize += pf.meta.RowGroup(rg).TotalByteSize()
	}
	pf.Close()

	duckCopy := duckCopier(ctx, db)
	var lastSum *Summary
	ours := func(j Job) func() (int64, error) {
		return func() (int64, error) {
			os.RemoveAll(j.Output)
			j.Inputs, j.Workers = []string{in}, o.Workers
			s, err := Run(ctx, j)
			if err != nil {
				return 0, err
			}
			lastSum = s
			return s.RowsOut, nil
		}
	}
	measureN := func(row BenchRow, runs int, warm bool, ffkit, base func() (int64, error)) error {
		var ft, bt, fc, bc []float64
		if warm {
			// one untimed run of each: both read the file from the page
			// cache and start with warm allocators
			if _, err := ffkit(); err != nil {
				return fmt.Errorf("%s (ffkit): %w", row.Name, err)
			}
			if _, err := base(); err != nil {
				return fmt.Errorf("%s (%s): %w", row.Name, row.Baseline, err)
			}
		}
		runFF := func() error {
			t0, c0 := time.Now(), cpuSeconds()
			n, err := ffkit()
			if err != nil {
				return fmt.Errorf("%s (ffkit): %w", row.Name, err)
			}
			ft, fc = append(ft, time.Since(t0).Seconds()), append(fc, cpuSeconds()-c0)
			row.FFkitRowsOut = n
			return nil
		}
		runBase := func() error {
			t0, c0 := time.Now(), cpuSeconds()
			n, err := base()
			if err != nil {
				return fmt.Errorf("%s (%s): %w", row.Name, row.Baseline, err)
			}
			bt, bc = append(bt, time.Since(t0).Seconds()), append(bc, cpuSeconds()-c0)
			row.BaseRowsOut = n
			return nil
		}
		for r := 0; r < runs; r++ {
			// interleaved, so a noisy neighbour hits both alike, and the
			// order alternates (ABBA...), so neither always goes first
			first, second := runFF, runBase
			if r%2 == 1 {
				first, second = runBase, runFF
			}
			if err := first(); err != nil {
				return err
			}
			if err := second(); err != nil {
				return err
			}
		}
		row.FFkitSeconds, row.BaseSeconds = median(ft), median(bt)
		row.Ratio = row.BaseSeconds / row.FFkitSeconds
		row.FFkitCPU, row.BaseCPU = median(fc), median(bc)
		row.CPURatio = row.BaseCPU / row.FFkitCPU
		if lastSum != nil {
			row.BytesRead, row.SkippedGroups = lastSum.BytesRead, lastSum.RowGroupsSkipped
			lastSum = nil
		}
		logf("%-28s ffkit %.3fs (cpu %.3fs)  %s %.3fs (cpu %.3fs)  ratio %.2fx (cpu %.2fx)", row.Name, row.FFkitSeconds, row.FFkitCPU,
			row.Baseline, row.BaseSeconds, row.BaseCPU, row.Ratio, row.CPURatio)
		res.Results = append(res.Results, row)
		return nil
	}
	want := func(q string) bool { return len(o.Only) == 0 || slices.Contains(o.Only, q) }
	skip := func(q string) func(BenchRow, func() (int64, error), func() (int64, error)) error {
		if want(q) {
			return func(row BenchRow, ffkit, base func() (int64, error)) error {
				return measureN(row, o.Runs, true, ffkit, base)
			}
		}
		return func(BenchRow, func() (int64, error), func() (int64, error)) error { return nil }
	}
	for _, q := range o.Only {
		if !slices.Contains(BenchQueries, q) {
			return nil, fmt.Errorf("%w: no benchmark query %q (have %v)", ErrUsage, q, BenchQueries)
		}
	}
	src := fmt.Sprintf("read_parquet('%s')", in)
	out := func(n string) string { return filepath.Join(dir, n) }

	// 1. selective filter + projection, written to Parquet
	if err := skip("filter")(BenchRow{Name: "filter+project", What: "key, value WHERE value > 0.99 -> parquet", Baseline: "duckdb", Goal: 1},
		ours(Job{Where: "value > 0.99", Columns: "key, value", Output: out("q1.parquet")}),
		duckCopy("SELECT key, value FROM "+src+" WHERE value > 0.99", out("q1-duck.parquet"), "")); err != nil {
		return nil, err
	}
	// 2. a filter on a clustered column: row groups pruned by statistics
	if err := skip("pruned")(BenchRow{Name: "filter, pruned row groups", What: "key, day WHERE day >= '2020-12-01' -> parquet", Baseline: "duckdb", Goal: 1},
		ours(Job{Where: "day >= DATE '2020-12-01'", Columns: "key, day", Output: out("q2.parquet")}),
		duckCopy("SELECT key, day FROM "+src+" WHERE day >= DATE '2020-12-01'", out("q2-duck.parquet"), "")); err != nil {
		return nil, err
	}
	// 3. group-by aggregates, low and high cardinality
	if err := skip("groupby")(BenchRow{Name: "group-by 16 groups", What: "category: count, sum, mean, min, max", Baseline: "duckdb", Goal: 0.5},
		ours(Job{GroupBy: []string{"category"}, Aggs: "count(*), sum(key), mean(value), min(value), max(value)", Output: out("q3.parquet")}),
		duckCopy("SELECT category, count(*), sum(key), avg(value), min(value), max(value) FROM "+src+" GROUP BY category", out("q3-duck.parquet"), "")); err != nil {
		return nil, err
	}
	if err := skip("groupby")(BenchRow{Name: "group-by 100k groups", What: "user_id: count, sum, mean", Baseline: "duckdb", Goal: 0.5},
		ours(Job{GroupBy: []string{"user_id"}, Aggs: "count(*), sum(key), mean(value)", Output: out("q4.parquet")}),
		duckCopy("SELECT user_id, count(*), sum(key), avg(value) FROM "+src+" GROUP BY user_id", out("q4-duck.parquet"), "")); err != nil {
		return nil, err
	}
	// 4. hash repartition into N parquet partitions
	if want("repartition") {
		if err := benchRepartition(ctx, db, o, res, in, src, dir, ours, measureN, &lastSum, logf); err != nil {
			return nil, err
		}
	}

	// 5. the raw scan path: ffkit's reader (Arrow batches) vs parquet-go's
	// page-level reader (typed slices), both filtering value > 0.99 and
	// summing key, with the same worker count
	var ourSum, pgSum int64
	if err := skip("memory")(BenchRow{Name: "scan to memory", What: "count, sum(key) WHERE value > 0.99 (ffkit reader vs parquet-go pages)", Baseline: "parquet-go"},
		func() (int64, error) {
			var rows atomic.Int64
			ourSum = 0
			_, err := Scan(ctx, []string{in}, ScanOptions{Columns: "key", Where: "value > 0.99", Workers: o.Workers}, func(r arrow.RecordBatch) error {
				for _, k := range r.Column(0).(*array.Int64).Int64Values() {
					ourSum += k
				}
				rows.Add(r.NumRows())
				return nil
			})
			return rows.Load(), err
		},
		func() (int64, error) {
			n, s, err := parquetGoScan(ctx, in, o.Workers)
			pgSum = s
			return n, err
		}); err != nil {
		return nil, err
	}
	if ourSum != pgSum {
		return nil, fmt.Errorf("scan bench: checksums differ: ffkit %d, parquet-go %d", ourSum, pgSum)
	}
	var duckSum int64
	if err := skip("memory")(BenchRow{Name: "scan to memory (duckdb)", What: "sum(key) WHERE value > 0.99 into memory", Baseline: "duckdb"},
		func() (int64, error) {
			ourSum = 0
			_, err := Scan(ctx, []string{in}, ScanOptions{Columns: "key", Where: "value > 0.99", Workers: o.Workers}, func(r arrow.RecordBatch) error {
				for _, k := range r.Column(0).(*array.Int64).Int64Values() {
					ourSum += k
				}
				return nil
			})
			return ourSum, err
		},
		func() (int64, error) {
			err := db.QueryRowContext(ctx, "SELECT sum(key)::BIGINT FROM "+src+" WHERE value > 0.99").Scan(&duckSum)
			return duckSum, err
		}); err != nil {
		return nil, err
	}
	if ourSum != duckSum {
		return nil, fmt.Errorf("scan bench: sums differ: ffkit %d, DuckDB %d", ourSum, duckSum)
	}
	res.MaxRSSBytes = maxRSS()
	return res, nil
}

func maxRSS() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Maxrss << 10 // KiB on Linux
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// parquetGoScan is the comparison reader: parquet-go's page API, one
// *parquet.File per worker, row groups spread over workers.
func parquetGoScan(ctx context.Context, path string, workers int) (int64, int64, error) {
	f0, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f0.Close()
	st, _ := f0.Stat()
	pf, err := pq.OpenFile(f0, st.Size())
	if err != nil {
		return 0, 0, err
	}
	keyCol, okK := pf.Schema().Lookup("key")
	valCol, okV := pf.Schema().Lookup("value")
	if !okK || !okV {
		return 0, 0, fmt.Errorf("parquet-go: columns not found")
	}
	var rows, sum atomic.Int64
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for _, rg := range pf.RowGroups() {
		g.Go(func() error {
			cc := rg.ColumnChunks()
			vals, err := readColumn(cc[valCol.ColumnIndex], (*encoding.Values).Double)
			if err != nil {
				return err
			}
			keys, err := readColumn(cc[keyCol.ColumnIndex], (*encoding.Values).Int64)
			if err != nil {
				return err
			}
			var n, s int64
			for i, v := range vals {
				if v > 0.99 {
					n++
					s += keys[i]
				}
			}
			rows.Add(n)
			sum.Add(s)
			return nil
		})
	}
	err = g.Wait()
	return rows.Load(), sum.Load(), err
}

// readColumn decodes every page of c with values (encoding.Values's Double,
// Int64, ...) and appends the results.
func readColumn[T any](c pq.ColumnChunk, values func(*encoding.Values) []T) ([]T, error) {
	pages := c.Pages()
	defer pages.Close()
	var out []T
	for {
		p, err := pages.ReadPage()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		d := p.Data()
		out = append(out, values(&d)...)
		pq.Release(p)
	}
}

// duckCopier returns a maker of timed DuckDB runs: each writes query q's
// result to out as zstd Parquet (extra: more COPY options) and returns the
// rows written.
func duckCopier(ctx context.Context, db *sql.DB) func(q, out, extra string) func() (int64, error) {
	return func(q, out, extra string) func() (int64, error) {
		return func() (int64, error) {
			os.RemoveAll(out)
			var n int64
			err := db.QueryRowContext(ctx, fmt.Sprintf("COPY (%s) TO '%s' (FORMAT parquet, COMPRESSION zstd%s)", q, out, extra)).Scan(&n)
			return n, err
		}
	}
}

// benchRepartition times the hash repartition (on the main data, or on a
// separate input of o.RepartitionBytes) and fills res's repartition figures.
func benchRepartition(ctx context.Context, db *sql.DB, o BenchOptions, res *BenchResult, in, src, dir string,
	ours func(Job) func() (int64, error), measureN func(BenchRow, int, bool, func() (int64, error), func() (int64, error)) error,
	lastSum **Summary, logf func(string, ...any)) error {
	out := func(n string) string { return filepath.Join(dir, n) }
	duckCopy := duckCopier(ctx, db)
	n := o.Partitions
	rin, rsrc, rbytes, rruns, rwarm := in, src, res.UncompressedSize, o.Runs, true
	res.RepartitionRows, res.RepartitionFileBytes = res.Rows, res.FileBytes
	if o.RepartitionBytes > 0 {
		rruns, rwarm = max(o.RepartitionRuns, 1), false
		if o.MemoryLimit == "" {
			o.MemoryLimit = "2GB"
		}
		// the same columns, as many rows as make RepartitionBytes
		rows := int64(float64(o.RepartitionBytes) / (float64(res.UncompressedSize) / float64(res.Rows)))
		rin = filepath.Join(dir, fmt.Sprintf("repartition-%d.parquet", rows))
		rsrc = fmt.Sprintf("read_parquet('%s')", rin)
		for _, q := range []string{fmt.Sprintf("SET memory_limit='%s'", o.MemoryLimit),
			fmt.Sprintf("SET temp_directory='%s'", filepath.Join(dir, "duckdb-tmp"))} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		if _, err := os.Stat(rin); err != nil {
			logf("generating %d rows (~%.1f GiB uncompressed) with DuckDB into %s", rows, float64(o.RepartitionBytes)/(1<<30), rin)
			gen := fmt.Sprintf(`COPY (SELECT i AS key, hash(i) / 18446744073709551615.0 AS value,
				'category_' || (i %% 16)::VARCHAR AS category,
				(DATE '2020-01-01' + (i * 365 // %d)::INTEGER) AS day,
				(i %% 100000)::INTEGER AS user_id
				FROM range(%d) t(i)) TO '%s' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)`, rows, rows, rin+".tmp")
			if _, err := db.ExecContext(ctx, gen); err != nil {
				return fmt.Errorf("generate: %w", err)
			}
			if err := os.Rename(rin+".tmp", rin); err != nil {
				return err
			}
		}
		rf, err := OpenFile(ctx, rin, nil)
		if err != nil {
			return err
		}
		rbytes = 0
		for rg := 0; rg < rf.NumRowGroups(); rg++ {
			rbytes += rf.meta.RowGroup(rg).TotalByteSize()
		}
		res.RepartitionRows, res.RepartitionFileBytes = rf.Rows, rf.Size
		rf.Close()
		logf("repartition input: %d rows, %.2f GiB uncompressed, %.2f GiB parquet", res.RepartitionRows, float64(rbytes)/(1<<30), float64(res.RepartitionFileBytes)/(1<<30))
	}
	res.RepartitionInputBytes = rbytes
	oursOn := func(j Job) func() (int64, error) {
		f := ours(j)
		return func() (int64, error) {
			if rin == in {
				return f()
			}
			os.RemoveAll(j.Output)
			j.Inputs, j.Workers = []string{rin}, o.Workers
			s, err := Run(ctx, j)
			if err != nil {
				return 0, err
			}
			*lastSum = s
			return s.RowsOut, nil
		}
	}
	if err := measureN(BenchRow{Name: fmt.Sprintf("hash repartition x%d", n), What: fmt.Sprintf("all columns by hash(key) -> N parquet partitions (%d rows)", res.RepartitionRows), Baseline: "duckdb"},
		rruns, rwarm,
		oursOn(Job{PartitionBy: "hash:key", Partitions: n, Output: out("q5")}),
		duckCopy(fmt.Sprintf("SELECT *, hash(key) %% %d AS p FROM %s", n, rsrc), out("q5-duck"), ", PARTITION_BY (p)")); err != nil {
		return err
	}
	if rin != in {
		// the multi-GiB outputs go; the input stays for a rerun with the same --dir
		os.RemoveAll(out("q5"))
		os.RemoveAll(out("q5-duck"))
		os.RemoveAll(filepath.Join(dir, "duckdb-tmp"))
	}
	last := res.Results[len(res.Results)-1]
	mib := float64(rbytes) / (1 << 20)
	res.RepartitionMiBsPerCore = mib / last.FFkitSeconds / float64(o.Workers)
	res.DuckDBRepartitionMiBsPerCore = mib / last.BaseSeconds / float64(o.Workers)
	res.RepartitionMiBsPerCPUSecond = mib / last.FFkitCPU
	res.DuckDBRepartitionMiBsPerCPUSecond = mib / last.BaseCPU
	return nil
}
