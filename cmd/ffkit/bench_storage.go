package main

// Shared plumbing of the storage benchmarks (bench sweep, checkpoint,
// model-load, parallel-write): common flags, fio beside ours, output as a
// table, JSON and an HTML report. The measuring itself is package bench.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/fs"
)

// storageFlags are the flags every storage benchmark shares.
type storageFlags struct {
	report   string
	keep     bool
	runs     int
	direct   bool
	fio      bool
	fioDir   string
	duration time.Duration
	warmup   time.Duration
	timed    bool // the command has --duration and --warmup
}

func (f *storageFlags) add(c *cobra.Command, runs int, timed bool) {
	fl := c.Flags()
	fl.StringVar(&f.report, "report", "", "also write a self-contained HTML page with charts to `FILE.html`")
	fl.BoolVar(&f.keep, "keep", false, "keep the benchmark's files (default: remove them)")
	fl.IntVar(&f.runs, "runs", runs, "repeat each measurement this many times and show the spread")
	fl.BoolVar(&f.direct, "direct", false, "bypass the page cache (O_DIRECT reads; fio runs with --direct=1)")
	fl.BoolVar(&f.fio, "fio", true, "run fio on the same rows for comparison when fio is installed and the path is local")
	fl.StringVar(&f.fioDir, "fio-dir", "", "run fio in this local `DIR` instead of PATH (the local disk beside an ffkit:// run, or a FUSE mount of it)")
	f.timed = timed
	if timed {
		fl.DurationVar(&f.duration, "duration", 500*time.Millisecond, "measured time of each run")
		fl.DurationVar(&f.warmup, "warmup", 100*time.Millisecond, "warm-up before each run, excluded from the figures")
	}
}

func (f *storageFlags) validate() error {
	if f.runs < 1 {
		return usagef("--runs %d: must be at least 1", f.runs)
	}
	if f.duration < 0 || f.warmup < 0 {
		return usagef("--duration and --warmup must not be negative")
	}
	if f.timed && f.duration == 0 {
		return usagef("--duration must be positive (each run measures for that long)")
	}
	if f.report != "" && !strings.HasSuffix(strings.ToLower(f.report), ".html") {
		return usagef("--report %q: the report is HTML, name it FILE.html", f.report)
	}
	return nil
}

// openWorkdirs opens the benchmark's directory at path (created if
// missing) and, through fioSetup, the one fio runs in (fw nil: no fio;
// fioNote says why). closeDirs removes the benchmark's files from both
// (unless --keep), fio's first; on an error nothing is left open.
func (f *storageFlags) openWorkdirs(ctx context.Context, path string) (w, fw *bench.Workdir, fioNote string, closeDirs func(), err error) {
	w, err = bench.OpenWorkdir(ctx, path, f.keep)
	if err != nil {
		return nil, nil, "", nil, err
	}
	fw, fioNote, fioCleanup, err := f.fioSetup(ctx, w)
	if err != nil {
		w.Cleanup(context.WithoutCancel(ctx))
		return nil, nil, "", nil, err
	}
	return w, fw, fioNote, func() {
		fioCleanup()
		w.Cleanup(context.WithoutCancel(ctx))
	}, nil
}

// fioSetup decides where fio runs beside ours: in the benchmark's own
// directory (the same files), in --fio-dir, or nowhere. It returns the
// directory (nil: no fio) and a note saying which; a --fio-dir directory
// is cleaned up by the caller (cleanup is a no-op for the shared one).
func (f *storageFlags) fioSetup(ctx context.Context, w *bench.Workdir) (fw *bench.Workdir, note string, cleanup func(), err error) {
	cleanup = func() {}
	switch {
	case !f.fio:
		return nil, "fio: not run (--fio=false)", cleanup, nil
	case !bench.FioAvailable():
		return nil, "fio: not installed (apt-get install fio), no fio column", cleanup, nil
	case f.fioDir != "":
		if fs.IsURL(f.fioDir) {
			return nil, "", cleanup, usagef("--fio-dir %q: fio needs a local directory (or a FUSE mount)", f.fioDir)
		}
		fw, err := bench.OpenWorkdir(ctx, f.fioDir, f.keep)
		if err != nil {
			return nil, "", cleanup, err
		}
		return fw, fmt.Sprintf("fio ran in %s (--fio-dir), not on the benchmark's path", f.fioDir),
			func() { fw.Cleanup(context.WithoutCancel(ctx)) }, nil
	case w.Remote:
		return nil, "fio: not run (the path is an ffkit:// URL; give --fio-dir DIR for a local-disk or FUSE-mount baseline)", cleanup, nil
	}
	return w, "", cleanup, nil
}

// fioFigure is fio's figure for a row, as printed and put in JSON.
type fioFigure struct {
	// MiBPerSec is the mean over Runs runs; Spread has the detail.
	MiBPerSec float64       `json:"mib_s"`
	Runs      int           `json:"runs"`
	Spread    bench.Spread  `json:"mib_s_spread"`
	IOPS      float64       `json:"iops"`
	Latency   bench.Latency `json:"latency"`
	Engine    string        `json:"engine"`
	Args      []string      `json:"args"`
}

// runFio runs a fio job and returns its figure for rw, or an error string
// to print (fio failing never fails the benchmark).
func runFio(ctx context.Context, job bench.FioJob) (*fioFigure, string) {
	r, err := bench.RunFio(ctx, job)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err().Error()
		}
		return nil, err.Error()
	}
	s := r.Side(job.RW)
	return &fioFigure{MiBPerSec: s.MiBPerSec, Runs: 1, Spread: bench.SpreadOf([]float64{s.MiBPerSec}),
		IOPS: s.IOPS, Latency: s.Latency, Engine: r.Engine, Args: r.Args}, ""
}

// runFioRuns runs a fio job runs times, calling before and after around
// each run (to evict or remove files), and reports the mean MiB/s and IOPS
// with the spread, as ours is reported. Latency is the first run's.
func runFioRuns(ctx context.Context, runs int, job bench.FioJob, before, after func()) (*fioFigure, string) {
	var first *fioFigure
	var mibs, iops []float64
	for range max(1, runs) {
		if before != nil {
			before()
		}
		f, e := runFio(ctx, job)
		if after != nil {
			after()
		}
		if f == nil {
			return nil, e
		}
		if first == nil {
			first = f
		}
		mibs, iops = append(mibs, f.MiBPerSec), append(iops, f.IOPS)
	}
	first.Runs, first.Spread = len(mibs), bench.SpreadOf(mibs)
	first.MiBPerSec, first.IOPS = first.Spread.Mean, bench.SpreadOf(iops).Mean
	return first, ""
}

// fioFmt formats fio's MiB/s for a table: the spread when it ran more than once.
func fioFmt(f *fioFigure) string {
	if f == nil {
		return "-"
	}
	if f.Runs > 1 {
		return mibFmt(f.Spread)
	}
	return bench.FormatFloat(f.MiBPerSec, 1)
}

// removeFioFiles removes the files fio created in the work directory
// (their names start with prefix), unless --keep.
func removeFioFiles(ctx context.Context, w *bench.Workdir, prefix string) {
	ents, err := w.FS.List(ctx, w.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir && strings.HasPrefix(e.Name, prefix) {
			w.Track(e.Name)
			if !w.Keep {
				w.Remove(ctx, e.Name)
			}
		}
	}
}

// emit prints the result: the JSON document on stdout with --json, else the
// tables; and the HTML report when asked.
func emit(f *storageFlags, doc any, tables []bench.Table, report *bench.Report) error {
	if f.report != "" {
		if err := bench.WriteReportFile(f.report, report); err != nil {
			return err
		}
	}
	if jsonOut {
		return printJSON(doc)
	}
	out := human()
	for i, t := range tables {
		if i > 0 {
			fmt.Fprintln(out)
		}
		if err := t.Write(out); err != nil {
			return err
		}
	}
	if f.report != "" {
		fmt.Fprintf(out, "report: %s\n", f.report)
	}
	return nil
}

// commandLine is the command as typed, for reports.
func commandLine() string { return "ffkit " + strings.Join(os.Args[1:], " ") }

// reportMeta is the header of every report.
func reportMeta(extra ...string) []string {
	host, _ := os.Hostname()
	m := []string{commandLine(), fmt.Sprintf("host %s, %s", host, time.Now().UTC().Format(time.RFC3339))}
	return append(m, extra...)
}

// mibFmt formats a spread of MiB/s.
func mibFmt(s bench.Spread) string { return bench.FormatSpread(s, "%.1f") }

// statusf prints a progress line on stderr (never on stdout).
func statusf(format string, args ...any) {
	if isTerminal() {
		fmt.Fprintf(os.Stderr, "\r\033[K"+format, args...)
	}
}

func statusDone() {
	if isTerminal() {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
}

// latencyValues lists p50, p90, p99 and max for charts.
func latencyValues(l bench.Latency) []float64 { return []float64{l.P50US, l.P90US, l.P99US, l.MaxUS} }

var latencyCategories = []string{"p50", "p90", "p99", "max"}
