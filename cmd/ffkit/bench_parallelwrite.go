package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/fs"
)

func init() {
	registerBench(newBenchParallelWriteCmd)
	registerBench(newBenchParallelWriteWorkerCmd)
}

type parallelWriteOpts struct {
	storageFlags
	procs       int
	sizePerProc string
	block       string
}

// pwProc is what one worker process reports (one JSON line on stdout).
type pwProc struct {
	StartNS   int64   `json:"start_ns"` // wall clock, Unix nanoseconds
	EndNS     int64   `json:"end_ns"`
	Bytes     int64   `json:"bytes"`
	Writes    int64   `json:"writes"`
	FsyncNS   int64   `json:"fsync_ns"`
	LatencyNS []int64 `json:"latency_ns"` // per write call
}

type pwRun struct {
	AggregateMiBPerSec float64 `json:"aggregate_mib_s"`
	NaiveSumMiBPerSec  float64 `json:"naive_sum_mib_s"`
	Seconds            float64 `json:"seconds"`
	StartSkewSeconds   float64 `json:"start_skew_seconds"`
	SlowestProcSeconds float64 `json:"slowest_proc_seconds"`
	FastestProcSeconds float64 `json:"fastest_proc_seconds"`
}

type parallelWriteDoc struct {
	Benchmark   string `json:"benchmark"`
	Path        string `json:"path"`
	Procs       int    `json:"procs"`
	SizePerProc int64  `json:"size_per_proc"`
	Block       int64  `json:"block"`
	Runs        int    `json:"runs"`
	// AggregateMiBPerSec: total bytes over (last end - first start), mean over runs.
	AggregateMiBPerSec float64 `json:"aggregate_mib_s"`
	// NaiveSumMiBPerSec: the sum of per-process rates, mean over runs.
	NaiveSumMiBPerSec float64       `json:"naive_sum_mib_s"`
	AggregateSpread   bench.Spread  `json:"aggregate_spread"`
	PerRun            []pwRun       `json:"per_run"`
	WriteLatency      bench.Latency `json:"write_latency"`
	Fio               *fioFigure    `json:"fio,omitempty"`
	FioError          string        `json:"fio_error,omitempty"`
	RatioVsFio        float64       `json:"ratio_vs_fio,omitempty"`
	FioNote           string        `json:"fio_note,omitempty"`
	Note              string        `json:"note"`
}

func newBenchParallelWriteCmd() *cobra.Command {
	o := &parallelWriteOpts{}
	c := &cobra.Command{
		Use:   "parallel-write PATH",
		Short: "N processes write their own files at once; honest aggregate bandwidth next to the naive sum",
		Long: `Starts --procs real OS processes (this ffkit binary, re-executed), each of
which writes its own file of --size-per-proc bytes in PATH (a directory,
local or ffkit://) in --block writes and commits it (flush + fsync, counted).
The processes start together (each is ready, then all are released at
once; process start-up is not timed). The aggregate bandwidth is total
bytes over (last process end - first process start); the naive sum of
per-process rates, which an MPI-style script often reports, is printed next
to it (JSON keys aggregate_mib_s and naive_sum_mib_s). fio runs the same
job (numjobs = --procs, end_fsync=1) for comparison.`,
		Example: `  ffkit bench parallel-write /mnt/nvme/pw --procs 8 --size-per-proc 1G
  ffkit bench parallel-write ffkit://127.0.0.1:9000/pw --procs 4 --size-per-proc 256M --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runParallelWrite(cmd.Context(), o, args[0]) },
	}
	o.add(c, 2, false)
	fl := c.Flags()
	fl.IntVar(&o.procs, "procs", 4, "writer processes")
	fl.StringVar(&o.sizePerProc, "size-per-proc", "256M", "bytes each process writes")
	fl.StringVar(&o.block, "block", "1M", "size of each write call")
	return c
}

func runParallelWrite(ctx context.Context, o *parallelWriteOpts, path string) error {
	if err := o.validate(); err != nil {
		return err
	}
	if o.procs < 1 || o.procs > 1024 {
		return usagef("--procs %d: want 1..1024", o.procs)
	}
	size, err := bench.ParseSize(o.sizePerProc)
	if err != nil || size <= 0 {
		return usagef("--size-per-proc %q: want a positive size such as 1G", o.sizePerProc)
	}
	block, err := bench.ParseSize(o.block)
	if err != nil || block <= 0 || block > 1<<30 {
		return usagef("--block %q: want a size from 1 to 1G", o.block)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("parallel-write: find the ffkit binary to start workers: %w", err)
	}
	w, fw, fioNote, closeDirs, err := o.openWorkdirs(ctx, path)
	if err != nil {
		return err
	}
	defer closeDirs()
	useFio := fw != nil
	doc := parallelWriteDoc{Benchmark: "parallel-write", Path: path, Procs: o.procs, SizePerProc: size, Block: block,
		Runs: o.runs, FioNote: fioNote,
		Note: "writes are buffered and fsynced at commit (counted); --direct does not apply to writes"}

	var results []*bench.Result
	for run := range o.runs {
		statusf("parallel-write: run %d/%d: %d processes x %s", run+1, o.runs, o.procs, bench.FormatBytes(size))
		var names []string
		for i := range o.procs {
			names = append(names, fmt.Sprintf("ffkit-pw-r%d-p%03d.dat", run, i))
		}
		res, err := parallelWriteRun(ctx, exe, w, names, size, block)
		if err != nil {
			return err
		}
		results = append(results, res)
		a := res.Aggregate()
		doc.PerRun = append(doc.PerRun, pwRun{AggregateMiBPerSec: a.AggregateMiBPerSec, NaiveSumMiBPerSec: a.NaiveSumMiBPerSec,
			Seconds: a.Seconds, StartSkewSeconds: a.StartSkewSeconds, SlowestProcSeconds: a.SlowestWorkerSeconds, FastestProcSeconds: a.FastestWorkerSeconds})
		if !o.keep {
			for _, n := range names {
				if err := w.Remove(ctx, n); err != nil {
					return err
				}
			}
		}
	}
	rep := bench.Combine(results)
	doc.AggregateSpread = rep.MiBPerSec
	doc.AggregateMiBPerSec = rep.MiBPerSec.Mean
	doc.NaiveSumMiBPerSec = rep.NaiveSumMiBPerSec
	doc.WriteLatency = rep.Latency

	if useFio {
		statusf("parallel-write: fio")
		const prefix = "ffkit-pw-fio"
		doc.Fio, doc.FioError = runFioRuns(ctx, o.runs, bench.FioJob{Name: prefix, Directory: fw.Dir, RW: "write", BlockSize: block, Size: size,
			NumJobs: o.procs, EndFsync: true}, nil, func() { removeFioFiles(context.WithoutCancel(ctx), fw, prefix) })
		if doc.Fio != nil {
			doc.RatioVsFio = bench.Compare("MiB/s", doc.AggregateMiBPerSec, doc.Fio.MiBPerSec, "fio").Ratio
		}
	}
	statusDone()

	t := bench.Table{
		Title: fmt.Sprintf("ffkit bench parallel-write %s: %d processes x %s in %s writes",
			path, o.procs, bench.FormatBytes(size), bench.FormatSize(block)),
		Header: []string{"run", "aggregate MiB/s", "naive-sum MiB/s", "span s", "start skew ms", "slowest s", "fastest s"},
	}
	for i, r := range doc.PerRun {
		t.AddRow(fmt.Sprint(i+1), bench.FormatFloat(r.AggregateMiBPerSec, 1), bench.FormatFloat(r.NaiveSumMiBPerSec, 1),
			bench.FormatFloat(r.Seconds, 3), fmt.Sprintf("%.1f", r.StartSkewSeconds*1e3), bench.FormatFloat(r.SlowestProcSeconds, 3),
			bench.FormatFloat(r.FastestProcSeconds, 3))
	}
	sum := bench.Table{Header: []string{"", "aggregate MiB/s (mean ±sd (min-max, n))", "naive-sum MiB/s", "write p50 us", "write p99 us"}}
	if useFio {
		sum.Header = append(sum.Header, "fio MiB/s", "ratio")
	}
	row := []string{"ffkit", mibFmt(doc.AggregateSpread), bench.FormatFloat(doc.NaiveSumMiBPerSec, 1),
		bench.FormatFloat(doc.WriteLatency.P50US, 0), bench.FormatFloat(doc.WriteLatency.P99US, 0)}
	if useFio {
		row = append(row, fioFmt(doc.Fio), bench.FormatRatio(doc.RatioVsFio))
	}
	sum.AddRow(row...)
	sum.Notes = append(sum.Notes, "aggregate = total bytes / (last process end - first process start); naive-sum = sum of per-process rates (overstates).",
		doc.Note+"; fio: as many runs, numjobs = procs, end_fsync=1.")
	if fioNote != "" {
		sum.Notes = append(sum.Notes, fioNote)
	}
	if doc.FioError != "" {
		sum.Notes = append(sum.Notes, "fio failed: "+doc.FioError)
	}

	var cats []string
	agg := bench.Series{Name: "aggregate (total / span)"}
	naive := bench.Series{Name: "naive sum of per-process rates"}
	for i, r := range doc.PerRun {
		cats = append(cats, fmt.Sprintf("run %d", i+1))
		agg.Values = append(agg.Values, r.AggregateMiBPerSec)
		naive.Values = append(naive.Values, r.NaiveSumMiBPerSec)
	}
	chart := bench.Chart{Title: "Aggregate vs naive sum (MiB/s)", XLabel: "run", YLabel: "MiB/s", Categories: cats, Series: []bench.Series{agg, naive}}
	charts := []bench.Chart{chart}
	if useFio {
		fv := math.NaN()
		if doc.Fio != nil {
			fv = doc.Fio.MiBPerSec
		}
		charts = append(charts, bench.Chart{Title: "ffkit vs fio (MiB/s)", XLabel: fmt.Sprintf("%d writers", o.procs), YLabel: "MiB/s",
			Categories: []string{"aggregate"}, Series: []bench.Series{{Name: "ffkit", Values: []float64{doc.AggregateMiBPerSec}}, {Name: "fio", Values: []float64{fv}}}})
	}
	lat := bench.Chart{Title: "Write call latency (us)", Kind: bench.Lines, Scale: bench.ScaleAuto, XLabel: "percentile", YLabel: "us", Categories: latencyCategories,
		Series: []bench.Series{{Name: "ffkit write", Values: latencyValues(doc.WriteLatency)}}}
	report := &bench.Report{Title: "ffkit bench parallel-write", Meta: reportMeta(), Data: doc,
		Sections: []bench.Section{{Heading: "Bandwidth", Charts: charts}, {Heading: "Latency", Charts: []bench.Chart{lat}}, {Tables: []bench.Table{t, sum}}}}
	return emit(&o.storageFlags, doc, []bench.Table{t, sum}, report)
}

// parallelWriteRun starts one worker process per name, releases them
// together once all are ready, and collects their spans.
func parallelWriteRun(ctx context.Context, exe string, w *bench.Workdir, names []string, size, block int64) (*bench.Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // kills any worker still running on an early return
	type worker struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		out    *bufio.Reader
		stderr bytes.Buffer
	}
	ws := make([]*worker, len(names))
	defer func() {
		for _, wk := range ws {
			if wk != nil && wk.cmd.Process != nil {
				wk.stdin.Close()
				wk.cmd.Wait()
			}
		}
	}()
	for i, name := range names {
		w.Track(name)
		wk := &worker{cmd: exec.CommandContext(ctx, exe, "bench", "parallel-write-worker",
			"--file", fs.Join(w.Path, name), "--size", fmt.Sprint(size), "--block", fmt.Sprint(block), "--seed", fmt.Sprint(i))}
		wk.cmd.Stderr = &wk.stderr
		var err error
		if wk.stdin, err = wk.cmd.StdinPipe(); err != nil {
			return nil, err
		}
		stdout, err := wk.cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		wk.out = bufio.NewReader(stdout)
		if err := wk.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start worker %d: %w", i, err)
		}
		ws[i] = wk
	}
	failed := func(i int, what string, err error) error {
		ws[i].stdin.Close()
		werr := ws[i].cmd.Wait()
		msg := strings.TrimSpace(ws[i].stderr.String())
		if werr != nil {
			err = fmt.Errorf("%w (%v)", err, werr)
		}
		ws[i] = nil
		return fmt.Errorf("parallel-write worker %d %s: %w: %s", i, what, err, msg)
	}
	for i, wk := range ws {
		line, err := wk.out.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "ready" {
			if err == nil {
				err = fmt.Errorf("unexpected %q", strings.TrimSpace(line))
			}
			return nil, failed(i, "did not get ready", err)
		}
	}
	for i, wk := range ws {
		if _, err := io.WriteString(wk.stdin, "go\n"); err != nil {
			return nil, failed(i, "could not be released", err)
		}
	}
	spans := make([]bench.Span, len(ws))
	var samples []time.Duration
	for i, wk := range ws {
		line, err := wk.out.ReadString('\n')
		var p pwProc
		if err == nil {
			err = json.Unmarshal([]byte(line), &p)
		}
		if err != nil {
			return nil, failed(i, "reported nothing", err)
		}
		wk.stdin.Close()
		if err := wk.cmd.Wait(); err != nil {
			ws[i] = nil
			return nil, fmt.Errorf("parallel-write worker %d: %w: %s", i, err, strings.TrimSpace(wk.stderr.String()))
		}
		ws[i] = nil
		if p.Bytes != size {
			return nil, fmt.Errorf("parallel-write worker %d wrote %d bytes, want %d", i, p.Bytes, size)
		}
		spans[i] = bench.Span{Start: time.Unix(0, p.StartNS), End: time.Unix(0, p.EndNS), Bytes: p.Bytes, Ops: p.Writes}
		for _, l := range p.LatencyNS {
			samples = append(samples, time.Duration(l))
		}
	}
	return bench.ResultOf(spans, samples, 0), nil
}

// newBenchParallelWriteWorkerCmd is the hidden worker that parallel-write
// re-executes: it prepares its file, prints "ready", waits for a line on
// stdin, writes and commits, and prints one pwProc JSON line.
func newBenchParallelWriteWorkerCmd() *cobra.Command {
	var file string
	var size, block, seed int64
	c := &cobra.Command{
		Use:    "parallel-write-worker",
		Short:  "worker process of bench parallel-write (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if file == "" || size <= 0 || block <= 0 {
				return usagef("parallel-write-worker needs --file, --size > 0 and --block > 0")
			}
			f, p, err := fs.Resolve(ctx, file)
			if err != nil {
				return err
			}
			wr, err := f.Create(ctx, p)
			if err != nil {
				return fmt.Errorf("create %s: %w", file, err)
			}
			defer wr.Close()
			pat := bench.NewPattern(int(block), uint64(seed))
			fmt.Fprintln(os.Stdout, "ready")
			line, err := bufio.NewReader(os.Stdin).ReadString('\n')
			if err != nil || strings.TrimSpace(line) != "go" {
				return errors.New("parallel-write-worker: not released (stdin closed)")
			}
			res := pwProc{StartNS: time.Now().UnixNano()}
			for off := int64(0); off < size; {
				n := min(block, size-off)
				t0 := time.Now()
				if _, err := wr.Write(pat.Chunk(off, int(n))); err != nil {
					return err
				}
				res.LatencyNS = append(res.LatencyNS, int64(time.Since(t0)))
				off += n
				res.Bytes += n
				res.Writes++
			}
			t0 := time.Now()
			if err := wr.Commit(); err != nil {
				return err
			}
			res.EndNS = time.Now().UnixNano()
			res.FsyncNS = res.EndNS - t0.UnixNano()
			b, err := json.Marshal(res)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(os.Stdout, "%s\n", b)
			return err
		},
	}
	c.Flags().StringVar(&file, "file", "", "file to write (local path or ffkit:// URL)")
	c.Flags().Int64Var(&size, "size", 0, "bytes to write")
	c.Flags().Int64Var(&block, "block", 1<<20, "bytes per write call")
	c.Flags().Int64Var(&seed, "seed", 0, "data pattern seed")
	return c
}
