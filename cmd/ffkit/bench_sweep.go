package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
)

func init() { registerBench(newBenchSweepCmd) }

type sweepOpts struct {
	storageFlags
	blockSizes, queueDepths, threads string
	read, write, seq                 bool
	size                             string
	saveConfig                       string
}

// sweepPoint is one configuration's figures.
type sweepPoint struct {
	BlockSize         int64         `json:"block_size"`
	QueueDepth        int           `json:"queue_depth"`
	Threads           int           `json:"threads"`
	MiBPerSec         bench.Spread  `json:"mib_s"`
	IOPS              bench.Spread  `json:"iops"`
	NaiveSumMiBPerSec float64       `json:"naive_sum_mib_s"`
	Latency           bench.Latency `json:"latency"`
	Fio               *fioFigure    `json:"fio,omitempty"`
	FioError          string        `json:"fio_error,omitempty"`
	RatioVsFio        float64       `json:"ratio_vs_fio,omitempty"`
}

type sweepDoc struct {
	Benchmark   string           `json:"benchmark"`
	Path        string           `json:"path"`
	Mode        string           `json:"mode"`
	Pattern     string           `json:"pattern"`
	Direct      bool             `json:"direct"`
	Cache       bench.CacheState `json:"cache"`
	FileSize    int64            `json:"file_size"`
	Runs        int              `json:"runs"`
	DurationS   float64          `json:"duration_s"`
	WarmupS     float64          `json:"warmup_s"`
	Points      []sweepPoint     `json:"points"`
	Best        sweepPoint       `json:"best"`
	IOConfig    string           `json:"io_config_file,omitempty"`
	FioNote     string           `json:"fio_note,omitempty"`
	LatencyNote string           `json:"latency_note"`
}

func newBenchSweepCmd() *cobra.Command {
	o := &sweepOpts{}
	c := &cobra.Command{
		Use:   "sweep PATH",
		Short: "Sweep block sizes x queue depths x threads (DeepSpeed-style) and save the best I/O configuration",
		Long: `Measures read (default) or write throughput for every combination of block
size, queue depth and thread count on PATH (a directory, local or ffkit://,
created if missing), prints the table and the best configuration, and saves
that configuration as JSON for 'ffkit load --io-config FILE'.

Reads: one file of --size is written first (not measured); each thread
issues batches of QUEUE_DEPTH reads of BLOCK_SIZE bytes (one fs.ReadBatch)
at random block-aligned offsets (--seq: sequentially through its own part
of the file). Writes: every thread keeps QUEUE_DEPTH sequential writer
streams of its own files; each run ends with flush + fsync, counted in the
time. Every point runs --runs times after a warm-up; the table shows the
mean, the spread and fio's figure for the same row (same file, same block
size, iodepth and numjobs).`,
		Example: `  ffkit bench sweep /mnt/nvme/bench --block-sizes 4K,64K,1M,4M --queue-depths 1,8,32 --threads 1,4 --direct
  ffkit bench sweep /data/b --write --report sweep.html --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runSweep(cmd.Context(), o, args[0]) },
	}
	o.add(c, 2, true)
	fl := c.Flags()
	fl.StringVar(&o.blockSizes, "block-sizes", "4K,64K,1M", "comma-separated block sizes")
	fl.StringVar(&o.queueDepths, "queue-depths", "1,16", "comma-separated queue depths (reads in flight per thread; writer streams per thread)")
	fl.StringVar(&o.threads, "threads", "1,4", "comma-separated thread counts")
	fl.BoolVar(&o.read, "read", false, "measure reads (the default)")
	fl.BoolVar(&o.write, "write", false, "measure writes")
	fl.BoolVar(&o.seq, "seq", false, "sequential reads instead of random")
	fl.StringVar(&o.size, "size", "256M", "size of the file read (reads); writes roll over to a new file at this size")
	fl.StringVar(&o.saveConfig, "save-config", "ffkit-io-config.json", "write the best configuration to this local `FILE` (\"\" to skip)")
	c.MarkFlagsMutuallyExclusive("read", "write")
	return c
}

func runSweep(ctx context.Context, o *sweepOpts, path string) error {
	if err := o.validate(); err != nil {
		return err
	}
	bss, err := bench.ParseSizes(o.blockSizes)
	if err != nil {
		return usagef("--block-sizes: %w", err)
	}
	qds, err := bench.ParseInts(o.queueDepths)
	if err != nil {
		return usagef("--queue-depths: %w", err)
	}
	ths, err := bench.ParseInts(o.threads)
	if err != nil {
		return usagef("--threads: %w", err)
	}
	size, err := bench.ParseSize(o.size)
	if err != nil {
		return usagef("--size: %w", err)
	}
	mode := "read"
	if o.write {
		mode = "write"
	}
	for _, bs := range bss {
		if bs > 1<<30 {
			return usagef("--block-sizes: %s is larger than 1G", bench.FormatSize(bs))
		}
		if mode == "read" && bs > size {
			return usagef("--block-sizes: %s is larger than the file (--size %s)", bench.FormatSize(bs), o.size)
		}
		if o.direct && mode == "read" && bs%localfs.Align != 0 {
			warnf("--direct with block size %d: not a multiple of %d, reads go through an aligned bounce buffer", bs, localfs.Align)
		}
	}

	// Every (thread, depth slot) holds a buffer of the largest block.
	const maxBuffers = 4 << 30
	if mem := int64(slices.Max(ths)) * int64(slices.Max(qds)) * slices.Max(bss); mem > maxBuffers {
		return usagef("threads x queue depth x block size needs %s of buffers (max %s): use fewer threads, a lower depth or smaller blocks",
			bench.FormatBytes(mem), bench.FormatBytes(maxBuffers))
	}
	w, fw, fioNote, closeDirs, err := o.openWorkdirs(ctx, path)
	if err != nil {
		return err
	}
	defer closeDirs()
	useFio := fw != nil

	doc := sweepDoc{Benchmark: "sweep", Path: path, Mode: mode, Pattern: "random", Direct: o.direct,
		Runs: o.runs, DurationS: o.duration.Seconds(), WarmupS: o.warmup.Seconds(), FioNote: fioNote}
	if o.seq || mode == "write" {
		doc.Pattern = "sequential"
	}
	const dataName = "ffkit-sweep.dat"
	if mode == "read" {
		size -= size % max(bss[len(bss)-1], localfs.Align)
		statusf("sweep: writing the %s test file", bench.FormatBytes(size))
		if err := w.WriteFile(ctx, dataName, nil, size, 4<<20); err != nil {
			return err
		}
		doc.FileSize = size
		doc.LatencyNote = "latency is per batch of queue_depth reads (one fs.ReadBatch)"
	} else {
		doc.LatencyNote = "latency is per write call of block_size bytes (buffered); throughput includes the final fsync"
		doc.Cache = "writes buffered, fsynced at the end of each run (counted)"
	}

	total := len(bss) * len(qds) * len(ths)
	k := 0
	for _, bs := range bss {
		for _, qd := range qds {
			for _, th := range ths {
				k++
				statusf("sweep: point %d/%d: bs %s qd %d threads %d", k, total, bench.FormatSize(bs), qd, th)
				var rep *bench.Repeated
				var cache bench.CacheState
				if mode == "read" {
					rep, cache, err = sweepRead(ctx, o, w, dataName, size, bs, qd, th)
				} else {
					rep, err = sweepWrite(ctx, o, w, size, bs, qd, th)
				}
				if err != nil {
					return fmt.Errorf("sweep point bs %s qd %d threads %d: %w", bench.FormatSize(bs), qd, th, err)
				}
				if cache != "" {
					doc.Cache = cache
				}
				p := sweepPoint{BlockSize: bs, QueueDepth: qd, Threads: th, MiBPerSec: rep.MiBPerSec,
					NaiveSumMiBPerSec: rep.NaiveSumMiBPerSec, Latency: rep.Latency}
				var iops []float64
				for _, r := range rep.Runs {
					perOp := float64(qd)
					if mode == "write" {
						perOp = 1
					}
					iops = append(iops, r.OpsPerSec*perOp)
				}
				p.IOPS = bench.SpreadOf(iops)
				if useFio {
					statusf("sweep: point %d/%d: fio", k, total)
					var perStream int64 // fio writes as much per job as each of our streams did
					for _, r := range rep.Runs {
						perStream += r.Bytes / int64(len(rep.Runs)*th*qd)
					}
					p.Fio, p.FioError = sweepFio(ctx, o, w, fw, mode, dataName, size, bs, qd, th, perStream)
					if p.Fio != nil {
						p.RatioVsFio = bench.Compare("MiB/s", p.MiBPerSec.Mean, p.Fio.MiBPerSec, "fio").Ratio
					}
				}
				doc.Points = append(doc.Points, p)
			}
		}
	}
	statusDone()
	best := doc.Points[0]
	for _, p := range doc.Points {
		if p.MiBPerSec.Mean > best.MiBPerSec.Mean {
			best = p
		}
	}
	doc.Best = best
	if o.saveConfig != "" {
		cfg := bench.IOConfig{Mode: mode, BlockSize: best.BlockSize, QueueDepth: best.QueueDepth, Threads: best.Threads,
			Direct: o.direct, MiBPerSec: best.MiBPerSec.Mean, IOPS: best.IOPS.Mean, Path: path,
			MeasuredAt: time.Now().UTC().Truncate(time.Second), Source: "ffkit bench sweep"}
		if err := bench.WriteIOConfig(o.saveConfig, cfg); err != nil {
			return err
		}
		doc.IOConfig = o.saveConfig
	}
	tables, report := sweepOutput(&doc, useFio)
	return emit(&o.storageFlags, doc, tables, report)
}

// sweepRead measures one read configuration: th workers, each one
// fs.ReadBatch of qd reads of bs bytes per op.
func sweepRead(ctx context.Context, o *sweepOpts, w *bench.Workdir, name string, size, bs int64, qd, th int) (*bench.Repeated, bench.CacheState, error) {
	var cache bench.CacheState
	rep, err := bench.RepeatFunc(ctx, o.runs, func(ctx context.Context, run int) (*bench.Result, error) {
		var err error
		if cache, err = w.Cold(o.direct, name); err != nil {
			warnf("could not make the file cold: %v", err)
		}
		files := make([]fs.File, th)
		defer func() {
			for _, f := range files {
				if f != nil {
					f.Close()
				}
			}
		}()
		bufs := make([][][]byte, th)
		rngs := make([]*rand.Rand, th)
		reqs := make([][]fs.ReadRequest, th)
		for t := range th {
			if files[t], err = w.FS.Open(ctx, w.Join(name), fs.OpenOptions{Direct: o.direct}); err != nil {
				return nil, err
			}
			rngs[t] = rand.New(rand.NewPCG(uint64(run), uint64(t)))
			reqs[t] = make([]fs.ReadRequest, qd)
			for range qd {
				bufs[t] = append(bufs[t], localfs.AlignedBuffer(int(bs)))
			}
		}
		blocks := size / bs
		region := max(1, blocks/int64(th))
		op := func(ctx context.Context, t int, seq int64) (int64, error) {
			rq := reqs[t]
			for q := range qd {
				var blk int64
				if o.seq {
					blk = (int64(t)*region + (seq*int64(qd)+int64(q))%region) % blocks
				} else {
					blk = rngs[t].Int64N(blocks)
				}
				rq[q] = fs.ReadRequest{File: files[t], Off: blk * bs, Buf: bufs[t][q]}
			}
			if err := w.FS.ReadBatch(ctx, rq); err != nil {
				return 0, err
			}
			return int64(qd) * bs, nil
		}
		return bench.Run(ctx, bench.Options{Workers: th, Duration: o.duration, Warmup: o.warmup, WarmupCount: 1}, op)
	})
	return rep, cache, err
}

// sweepWrite measures one write configuration: th*qd sequential writer
// streams, each to its own files, flushed and fsynced at the end (counted).
// A stream that reaches maxSize commits its file and goes on in a new one
// (the commit counts in that write's time), so a fast device never runs
// out of file before --duration ends.
func sweepWrite(ctx context.Context, o *sweepOpts, w *bench.Workdir, maxSize, bs int64, qd, th int) (*bench.Repeated, error) {
	streams := th * qd
	// One pattern per stream: Chunk stamps the shared block, so streams
	// must not share one.
	pats := make([]*bench.Pattern, streams)
	for i := range pats {
		pats[i] = bench.NewPattern(int(bs), uint64(i+1))
	}
	maxSize = max(maxSize, bs)
	return bench.RepeatFunc(ctx, o.runs, func(ctx context.Context, run int) (*bench.Result, error) {
		writers := make([]fs.Writer, streams)
		written := make([]int64, streams)
		files := make([]int, streams)
		var names [][]string = make([][]string, streams)
		defer func() {
			for i, wr := range writers {
				if wr != nil {
					wr.Close()
				}
				if !o.keep {
					for _, n := range names[i] {
						w.Remove(context.WithoutCancel(ctx), n)
					}
				}
			}
		}()
		open := func(ctx context.Context, s int) error {
			name := fmt.Sprintf("ffkit-sweep-w%s-q%d-t%d-r%d-s%d-%d.dat", bench.FormatSize(bs), qd, th, run, s, files[s])
			files[s]++
			wr, err := w.FS.Create(ctx, w.Join(name))
			if err != nil {
				return err
			}
			w.Track(name)
			names[s] = append(names[s], name)
			writers[s], written[s] = wr, 0
			return nil
		}
		for s := range streams {
			if err := open(ctx, s); err != nil {
				return nil, err
			}
		}
		op := func(ctx context.Context, s int, seq int64) (int64, error) {
			if written[s]+bs > maxSize {
				err := writers[s].Commit()
				writers[s].Close()
				writers[s] = nil
				if err != nil {
					return 0, err
				}
				if err := open(ctx, s); err != nil {
					return 0, err
				}
			}
			if _, err := writers[s].Write(pats[s].Chunk(written[s], int(bs))); err != nil {
				return 0, err
			}
			written[s] += bs
			return bs, nil
		}
		finish := func(ctx context.Context, s int) error { return writers[s].Commit() }
		return bench.Run(ctx, bench.Options{Workers: streams, Duration: o.duration, Warmup: o.warmup, WarmupCount: 1, Finish: finish}, op)
	})
}

// sweepFio runs fio for one point in fw: on our own data file when fw is
// the benchmark's directory, else on a file of the same size that fio lays
// out in --fio-dir (once, kept for the other points).
func sweepFio(ctx context.Context, o *sweepOpts, w, fw *bench.Workdir, mode, name string, size, bs int64, qd, th int, perStream int64) (*fioFigure, string) {
	job := bench.FioJob{BlockSize: bs, Direct: o.direct, Runtime: o.duration, RampTime: o.warmup}
	if mode == "read" {
		if fw != w {
			name = "ffkit-sweep-fio.dat"
			fw.Track(name)
		}
		p, _ := fw.LocalPath(name)
		job.Filenames, job.IODepth, job.NumJobs, job.Size = []string{p}, qd, th, size
		job.RW = "randread"
		if o.seq {
			job.RW = "read"
		}
		return runFio(ctx, job)
	}
	const prefix = "ffkit-sweep-fio"
	defer removeFioFiles(context.WithoutCancel(ctx), fw, prefix)
	job.Name, job.Directory, job.RW, job.NumJobs, job.EndFsync = prefix, fw.Dir, "write", th*qd, true
	// Ours writes buffered and fsyncs at the end; so does fio, moving the
	// same bytes per stream (not time-based: a time-based fio job would
	// rewrite one small file in the page cache and fsync it once).
	job.Direct, job.Runtime, job.RampTime = false, 0, 0
	job.Size = max(bs, perStream/bs*bs)
	return runFio(ctx, job)
}

func sweepOutput(doc *sweepDoc, useFio bool) ([]bench.Table, *bench.Report) {
	t := bench.Table{
		Title:  fmt.Sprintf("ffkit bench sweep %s: %s %s, %s", doc.Path, doc.Pattern, doc.Mode, doc.Cache),
		Header: []string{"block", "qd", "threads", "MiB/s (mean ±sd (min-max, n))", "IOPS", "p50 us", "p99 us", "naive-sum MiB/s"},
	}
	if useFio {
		t.Header = append(t.Header, "fio MiB/s", "fio IOPS", "fio p99 us", "ratio")
	}
	for _, p := range doc.Points {
		row := []string{bench.FormatSize(p.BlockSize), fmt.Sprint(p.QueueDepth), fmt.Sprint(p.Threads), mibFmt(p.MiBPerSec),
			bench.FormatFloat(p.IOPS.Mean, 0), bench.FormatFloat(p.Latency.P50US, 0), bench.FormatFloat(p.Latency.P99US, 0),
			bench.FormatFloat(p.NaiveSumMiBPerSec, 1)}
		if useFio {
			if p.Fio != nil {
				row = append(row, bench.FormatFloat(p.Fio.MiBPerSec, 1), bench.FormatFloat(p.Fio.IOPS, 0),
					bench.FormatFloat(p.Fio.Latency.P99US, 0), bench.FormatRatio(p.RatioVsFio))
			} else {
				row = append(row, "-", "-", "-", "-")
			}
		}
		t.AddRow(row...)
	}
	b := doc.Best
	t.Notes = append(t.Notes,
		fmt.Sprintf("%d run(s) per point, %.1fs each after %.1fs warm-up (excluded); %s.", doc.Runs, doc.DurationS, doc.WarmupS, doc.LatencyNote),
		"MiB/s is total bytes over (last thread end - first thread start); naive-sum adds per-thread rates.",
		"fio: 1 run per point on the same file, or one of the same size in --fio-dir (reads: iodepth = qd, numjobs = threads; writes: the same bytes per job, end_fsync=1); ratio = ffkit / fio.",
		fmt.Sprintf("best: block %s, queue depth %d, threads %d: %.1f MiB/s", bench.FormatSize(b.BlockSize), b.QueueDepth, b.Threads, b.MiBPerSec.Mean))
	if doc.IOConfig != "" {
		t.Notes = append(t.Notes, fmt.Sprintf("saved to %s (use: ffkit load --io-config %s)", doc.IOConfig, doc.IOConfig))
	}
	if doc.FioNote != "" {
		t.Notes = append(t.Notes, doc.FioNote)
	}
	for _, p := range doc.Points {
		if p.FioError != "" {
			t.Notes = append(t.Notes, fmt.Sprintf("fio failed for bs %s qd %d threads %d: %s", bench.FormatSize(p.BlockSize), p.QueueDepth, p.Threads, p.FioError))
		}
	}

	// Charts: bandwidth by block size (one series per depth x threads),
	// ffkit vs fio per point, and latency percentiles per point.
	var cats []string
	seen := map[int64]bool{}
	for _, p := range doc.Points {
		if !seen[p.BlockSize] {
			seen[p.BlockSize] = true
			cats = append(cats, bench.FormatSize(p.BlockSize))
		}
	}
	type combo struct{ qd, th int }
	var combos []combo
	vals := map[combo][]float64{}
	for _, p := range doc.Points {
		c := combo{p.QueueDepth, p.Threads}
		if _, ok := vals[c]; !ok {
			combos = append(combos, c)
			vals[c] = make([]float64, len(cats))
			for i := range vals[c] {
				vals[c][i] = math.NaN()
			}
		}
		for i, cat := range cats {
			if cat == bench.FormatSize(p.BlockSize) {
				vals[c][i] = p.MiBPerSec.Mean
			}
		}
	}
	bw := bench.Chart{Title: "Bandwidth by block size, queue depth and threads (MiB/s)", XLabel: "block size", YLabel: "MiB/s", Categories: cats}
	for _, c := range combos {
		bw.Series = append(bw.Series, bench.Series{Name: fmt.Sprintf("qd %d x %d threads", c.qd, c.th), Values: vals[c]})
	}
	var labels []string
	ours := bench.Series{Name: "ffkit"}
	fio := bench.Series{Name: "fio"}
	p50 := bench.Series{Name: "p50"}
	p90 := bench.Series{Name: "p90"}
	p99 := bench.Series{Name: "p99"}
	for _, p := range doc.Points {
		labels = append(labels, fmt.Sprintf("%s q%d t%d", bench.FormatSize(p.BlockSize), p.QueueDepth, p.Threads))
		ours.Values = append(ours.Values, p.MiBPerSec.Mean)
		f := math.NaN()
		if p.Fio != nil {
			f = p.Fio.MiBPerSec
		}
		fio.Values = append(fio.Values, f)
		p50.Values = append(p50.Values, p.Latency.P50US)
		p90.Values = append(p90.Values, p.Latency.P90US)
		p99.Values = append(p99.Values, p.Latency.P99US)
	}
	vs := bench.Chart{Title: "ffkit vs fio, same rows (MiB/s)", XLabel: "block size, queue depth, threads", YLabel: "MiB/s", Categories: labels, Series: []bench.Series{ours}}
	if useFio {
		vs.Series = append(vs.Series, fio)
	}
	lat := bench.Chart{Title: "Latency percentiles (us; " + doc.LatencyNote + ")", Scale: bench.ScaleAuto, XLabel: "block size, queue depth, threads", YLabel: "us",
		Categories: labels, Series: []bench.Series{p50, p90, p99}}
	rep := &bench.Report{
		Title: "ffkit bench sweep", Data: doc,
		Meta: reportMeta(fmt.Sprintf("path %s, %s %s, cache: %s", doc.Path, doc.Pattern, doc.Mode, doc.Cache)),
		Sections: []bench.Section{
			{Heading: "Bandwidth", Charts: []bench.Chart{bw, vs}},
			{Heading: "Latency", Charts: []bench.Chart{lat}},
			{Heading: "All points", Tables: []bench.Table{t}},
		},
	}
	return []bench.Table{t}, rep
}
