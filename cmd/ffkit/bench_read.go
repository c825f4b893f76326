package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
)

func init() { registerBench(newBenchReadCmd) }

type benchReadFlags struct {
	batchSize   int
	duration    time.Duration
	warmup      time.Duration
	direct      bool
	warm        bool
	parallelism int
	inflight    int
	maxInFlight int
	mergeGap    int64
	noVerify    bool
	fio         bool
	seed        uint64
	rounds      int
	report      string
	baseline    string // batches or samples
	cpuProfile  string // hidden: PREFIX.ffkit.N.pprof, PREFIX.baseline.N.pprof per round
}

// benchReadResult is the JSON document of `ffkit bench read`.
type benchReadResult struct {
	Dataset    string `json:"dataset"`
	Samples    int64  `json:"samples"`
	Files      int    `json:"files"`
	MedianSize int64  `json:"median_sample_bytes"`
	BatchSize  int    `json:"batch_size"`
	Direct     bool   `json:"direct"`
	Cache      string `json:"cache"`
	// Warm: the files were read into the page cache before each phase
	// (--warm); CachedReads is the share of ffkit's reads that the
	// page-cache probe (preadv2 RWF_NOWAIT) served without io_uring.
	Warm        bool    `json:"warm"`
	CachedReads float64 `json:"cached_read_share"`
	// CPU time (user + system, this process) per sample of each phase,
	// warm-up included: on a machine shared with other work the samples/s
	// of a phase depend on the CPU it was given, its cost per sample does
	// not. CPURatio = baseline's over ffkit's (above 1: ffkit is cheaper).
	CPUMicrosPerSample         float64 `json:"cpu_us_per_sample"`
	BaselineCPUMicrosPerSample float64 `json:"baseline_cpu_us_per_sample"`
	CPURatio                   float64 `json:"cpu_ratio,omitempty"`
	Verify                     bool    `json:"verify"`
	// ffkit: ReadBatch of random batches
	SamplesPerSec float64       `json:"samples_per_s"`
	MiBPerSec     float64       `json:"mib_s"`
	BatchLatency  bench.Latency `json:"batch_latency"`
	BatchP50MS    float64       `json:"batch_p50_ms"`
	BatchP99MS    float64       `json:"batch_p99_ms"`
	Batches       int64         `json:"batches"`
	Parallelism   int           `json:"parallelism"`
	Inflight      int           `json:"batches_in_flight"`
	MaxInFlight   int           `json:"max_reads_in_flight"`
	// baseline: one plain pread per sample, same number of reads in flight.
	// Baseline "batches" (the default): the same batches as ffkit's, in the
	// same order, each read into its own batch buffer by --parallelism
	// goroutines, --batches-in-flight batches at a time; "samples": each of
	// the reads-in-flight goroutines reads random samples one at a time into
	// one reused buffer (the baseline before 2026-12-05).
	Baseline              string        `json:"baseline"`
	BaselineSamplesPerSec float64       `json:"baseline_samples_per_s"`
	BaselineMiBPerSec     float64       `json:"baseline_mib_s"`
	BaselineReadLatency   bench.Latency `json:"baseline_read_latency"`
	BaselineWorkers       int           `json:"baseline_workers"`
	Ratio                 float64       `json:"ratio"`
	// The storage requests of the ffkit phase, on a file system that counts
	// them (ffkit:// paths): one batch becomes, per storage service, a few
	// requests carrying merged ranges.
	StorageRequestsPerBatch float64 `json:"storage_requests_per_batch,omitempty"`
	BytesPerRequest         float64 `json:"bytes_per_request,omitempty"`
	RangesPerRequest        float64 `json:"ranges_per_request,omitempty"`
	StorageRequests         int64   `json:"storage_requests,omitempty"`
	// LocalShare: the part of those bytes read by short-circuit reads of
	// chunk files on this host.
	LocalShare float64 `json:"local_share,omitempty"`
	// fio random reads of the dataset's median sample size (rounded up
	// to 4 KiB) on its full-size files (--fio): its IOPS are reads of a
	// sample's size, comparable with samples/s, and its MiB/s with ours.
	FioBlockSize int64              `json:"fio_block_bytes,omitempty"`
	FioMiBPerSec float64            `json:"fio_mib_s,omitempty"`
	FioIOPS      float64            `json:"fio_iops,omitempty"`
	FioEngine    string             `json:"fio_engine,omitempty"`
	FioFiles     []string           `json:"fio_files,omitempty"`
	FioRatio     float64            `json:"fio_ratio,omitempty"`
	Seconds      float64            `json:"seconds_per_phase"`
	Rounds       int                `json:"rounds"`
	Comparison   []bench.Comparison `json:"comparisons"`
}

func newBenchReadCmd() *cobra.Command {
	var f benchReadFlags
	c := &cobra.Command{
		Use:   "read PATH...",
		Short: "Random-batch read throughput of an FFRecord dataset vs a plain pread loop",
		Long: `Read random batches of samples from an FFRecord dataset with ReadBatch (sort,
merge, parallel reads, checksum checks) and report samples/s, MiB/s and the
batch latency p50/p99. In the same run, a baseline reads the same batches in
the same order with one plain pread per sample into a batch buffer, with the
same number of batches and reads in flight (--parallelism goroutines per
batch), and checks each sample's stored CRC-32 as ffkit does (not with
--no-verify); the ratio is ffkit's samples/s over the baseline's.
--baseline samples instead reads random samples one at a time into one
reused buffer on each of as many goroutines as reads in flight (no batch is
delivered; the baseline before 2026-12-05). With --fio, fio's random reads of
the dataset's median sample size (rounded up to 4 KiB, so IOPS compare with
samples/s and MiB/s with MiB/s; io_uring, O_DIRECT with --direct, iodepth
64, one job) on the same files are measured too: the dataset's full-size files (at least half the
largest; a small last shard would be a hot spot fio hits as often as the
others), with each read going to one of them at random.
By default 4 batches are in flight with 16 reads each: 64 reads in flight,
as many as the baseline's preads and fio's iodepth. --max-in-flight bounds
the reads of all batches together instead, shared without dividing it (a
batch uses what the others leave while they plan, check checksums or drain
their last reads).

Reads are made cold first: with --direct the page cache is bypassed (O_DIRECT);
otherwise the dataset's files are evicted from the page cache before each
phase, and the cache state is printed next to the figures. --warm does the
opposite: the files are read whole before each phase, so every row measures
reads served by the page cache (ffkit serves those with preadv2 RWF_NOWAIT,
without io_uring's round trip; FFKIT_NO_NOWAIT=1 turns that off).
--report FILE.html also writes the results as a self-contained HTML page.`,
		Example: `  ffkit bench read train/ --duration 5s
  ffkit bench read small4k.ffr --direct --fio --json
  ffkit bench read train/ --warm`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runBenchRead(cmd.Context(), args, f) },
	}
	c.Flags().IntVar(&f.batchSize, "batch-size", 256, "samples per batch")
	c.Flags().DurationVar(&f.duration, "duration", 10*time.Second, "measured time of each phase (ffkit, baseline, fio)")
	c.Flags().DurationVar(&f.warmup, "warmup", 500*time.Millisecond, "warm-up before each phase, not measured")
	c.Flags().BoolVar(&f.direct, "direct", false, "read with O_DIRECT (bypass the page cache)")
	c.Flags().BoolVar(&f.warm, "warm", false, "read the files into the page cache before each phase instead of evicting them (not with --direct)")
	c.Flags().IntVar(&f.parallelism, "parallelism", 16, "reads in flight per batch, at most")
	c.Flags().IntVar(&f.inflight, "batches-in-flight", 4, "batches read concurrently, as a loader prefetches")
	c.Flags().IntVar(&f.maxInFlight, "max-in-flight", 0, "reads in flight in all batches together, shared (0: --parallelism x --batches-in-flight); the baseline keeps as many preads in flight")
	c.Flags().Int64Var(&f.mergeGap, "merge-gap", 0, "merge reads whose gap is at most this many bytes (0 = default, -1 = never)")
	c.Flags().StringVar(&f.baseline, "baseline", "batches", "the pread baseline: batches (the same batches as ffkit, each into its own buffer) or samples (random samples into one reused buffer per goroutine)")
	c.Flags().BoolVar(&f.noVerify, "no-verify", false, "skip the sample checksum checks")
	c.Flags().BoolVar(&f.fio, "fio", false, "also measure fio random reads of the median sample size (io_uring, iodepth 64) on the dataset's full-size files")
	c.Flags().StringVar(&f.report, "report", "", "also write a self-contained HTML page with charts to `FILE.html`")
	c.Flags().StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of each phase to PREFIX.ffkit.ROUND.pprof and PREFIX.baseline.ROUND.pprof")
	c.Flags().MarkHidden("cpuprofile")
	c.Flags().Uint64Var(&f.seed, "seed", 1, "seed of the random batches")
	c.Flags().IntVar(&f.rounds, "rounds", 3, "alternate the phases this many times (each gets duration/rounds per round), so load from other processes falls on all of them alike")
	return c
}

func runBenchRead(ctx context.Context, paths []string, f benchReadFlags) error {
	switch {
	case f.batchSize <= 0:
		return usagef("--batch-size must be positive, got %d", f.batchSize)
	case f.duration <= 0:
		return usagef("--duration must be positive, got %s", f.duration)
	case f.parallelism <= 0 || f.inflight <= 0 || f.rounds <= 0:
		return usagef("--parallelism, --batches-in-flight and --rounds must be positive")
	case f.report != "" && !strings.HasSuffix(strings.ToLower(f.report), ".html"):
		return usagef("--report %q: the report is HTML, name it FILE.html", f.report)
	case f.warm && f.direct:
		return usagef("--warm and --direct contradict each other: O_DIRECT bypasses the page cache")
	case f.maxInFlight < 0:
		return usagef("--max-in-flight must not be negative, got %d", f.maxInFlight)
	case f.baseline != "batches" && f.baseline != "samples":
		return usagef("--baseline %q: want batches or samples", f.baseline)
	}
	slice := f.duration / time.Duration(f.rounds)
	if slice <= 0 {
		slice = f.duration
	}
	r, err := ffrecord.Open(ctx, paths, ffrecord.ReadOptions{Direct: f.direct, NoVerify: f.noVerify,
		Parallelism: f.parallelism, MaxInFlight: f.maxInFlight, MergeGap: f.mergeGap, Warn: func(m string) { warnf("%s", m) }})
	if err != nil {
		return err
	}
	defer r.Close()
	n := r.N()
	if n == 0 {
		return usagef("the dataset has no samples to read")
	}
	files := r.Files()
	var local []string
	remote := false
	largest := files[0]
	for _, fm := range files {
		if fs.IsURL(fm.Path) {
			remote = true
		} else {
			local = append(local, fm.Path)
		}
		if fm.Size > largest.Size {
			largest = fm
		}
	}
	st := r.Stats()
	res := benchReadResult{Dataset: fmt.Sprint(paths), Samples: n, Files: len(files), MedianSize: st.MedianLen,
		BatchSize: f.batchSize, Direct: f.direct, Warm: f.warm, Verify: !f.noVerify, Parallelism: f.parallelism,
		Inflight: f.inflight, MaxInFlight: f.parallelism * f.inflight, Seconds: f.duration.Seconds(), Rounds: f.rounds,
		Baseline: f.baseline}
	if f.maxInFlight > 0 {
		res.MaxInFlight = min(f.maxInFlight, res.MaxInFlight)
	}
	progress := func(msg string) { fmt.Fprintln(human(), "bench read:", msg) }
	if jsonOut {
		progress = func(msg string) {}
	}

	// The phases alternate for f.rounds rounds (ours, baseline, fio), each
	// made cold first, so that load from other processes during the run
	// falls on all of them alike.
	bufs := make([][]byte, f.inflight)
	idx := make([][]int64, f.inflight)
	for w := range idx {
		idx[w] = make([]int64, f.batchSize)
	}
	// Batch b of a round is the same in every phase: ffkit's and the
	// baseline's phases read the same batches in the same order (each
	// phase of a round starts again from the round's first batch).
	var nextBatch atomic.Int64
	batchIndices := func(ix []int64) {
		rng := rand.New(rand.NewPCG(f.seed, uint64(nextBatch.Add(1)-1)))
		for k := range ix {
			ix[k] = rng.Int64N(n)
		}
	}
	var issued atomic.Int64 // batches read, warm-up included (as the request counters)
	oursOp := func(ctx context.Context, w int, seq int64) (int64, error) {
		issued.Add(1)
		ix := idx[w]
		batchIndices(ix)
		size, err := r.BatchSize(ix)
		if err != nil {
			return 0, err
		}
		if int64(cap(bufs[w])) < size {
			bufs[w] = make([]byte, size*2)
		}
		_, err = r.ReadBatchInto(ctx, ix, bufs[w][:size])
		return size, err
	}
	workers := res.MaxInFlight
	res.BaselineWorkers = workers
	baseWorkers := workers // goroutines of the baseline's bench.Run
	if f.baseline == "batches" {
		baseWorkers = f.inflight
	}
	raw := make([]fs.File, len(files))
	var fsyses []fs.FS
	for i, fm := range files {
		fsys, name, err := fs.Resolve(ctx, fm.Path)
		if err != nil {
			return err
		}
		fsyses = append(fsyses, fsys)
		if raw[i], err = fsys.Open(ctx, name, fs.OpenOptions{Direct: f.direct}); err != nil {
			return fmt.Errorf("bench read: %w", err)
		}
		defer raw[i].Close()
	}
	pbufs := make([][]byte, workers)
	prngs := make([]*rand.Rand, workers)
	for w := range prngs {
		prngs[w] = rand.New(rand.NewPCG(f.seed+1, uint64(w)))
	}
	// readOne is the baseline's read of sample i (file, off, l) into b:
	// one pread, then the CRC-32 check ffkit does too.
	readOne := func(i int64, file int, off int64, b []byte) error {
		if _, err := raw[file].ReadAt(b, off); err != nil {
			return err
		}
		if !f.noVerify { // the same work as ffkit's: what a user's pread reader of FFRecord checks
			want, err := r.StoredCRC(i)
			if err != nil {
				return err
			}
			if got := ffrecord.Checksum(b); got != want {
				return fmt.Errorf("sample %d: %w: stored %08x, computed %08x", i, ffrecord.ErrChecksum, want, got)
			}
		}
		return nil
	}
	baseOp := func(ctx context.Context, w int, seq int64) (int64, error) {
		i := prngs[w].Int64N(n)
		file, off, l, err := r.Locate(i)
		if err != nil {
			return 0, err
		}
		if int64(cap(pbufs[w])) < l {
			pbufs[w] = make([]byte, l)
		}
		return l, readOne(i, file, off, pbufs[w][:l])
	}
	if f.baseline == "batches" {
		baseOp = preadBatches(f, res.MaxInFlight, batchIndices, r.Locate, readOne)
	}
	cold := func() {
		if f.warm {
			cache, err := bench.MakeWarm(local...)
			if remote {
				cache = bench.CacheRemote
			}
			res.Cache = string(cache)
			if err != nil {
				warnf("reads may be cold: %v", err)
			}
			return
		}
		cache, err := bench.MakeCold(f.direct, remote, local...)
		res.Cache = string(cache)
		if err != nil {
			warnf("reads may be warm: %v", err)
		}
	}
	fioOK := f.fio && !fs.IsURL(largest.Path)
	var fioFiles []string
	for _, fm := range files {
		if !fs.IsURL(fm.Path) && fm.Size >= largest.Size/2 {
			fioFiles = append(fioFiles, fm.Path)
		}
	}
	if f.fio && !fioOK {
		warnf("--fio needs a local file; skipped")
	}
	var ours, base []*bench.Result
	var reqStats fs.ReadStats // the ffkit phases' storage requests
	var reqBatches int64
	_, counted := fs.SumReadStats(fsyses)
	var fioIOPS []float64
	var cachedHits, cachedMisses int64 // the page-cache probe's, in the ffkit phases
	var oursCPU, baseCPU time.Duration
	var oursSamples, baseSamples int64
	// fio reads one median sample per request, so its IOPS are samples/s.
	fioBS := max((st.MedianLen+4095)/4096*4096, 4096)
	fioName := fmt.Sprintf("fio randread %s", bench.FormatBytes(fioBS))
	for round := range f.rounds {
		cold()
		progress(fmt.Sprintf("round %d/%d: ffkit ReadBatch, %d batches of %d in flight, %s", round+1, f.rounds, f.inflight, f.batchSize, slice))
		before, _ := fs.SumReadStats(fsyses)
		c0, _, m0 := localfs.ReadCounts()
		issued.Store(0)
		nextBatch.Store(int64(round) << 32)
		cpu0 := cpuTime()
		stopProf := startPhaseProfile(f.cpuProfile, "ffkit", round)
		o, err := bench.Run(ctx, bench.Options{Workers: f.inflight, Duration: slice, Warmup: f.warmup}, oursOp)
		stopProf()
		if err != nil {
			return fmt.Errorf("bench read: %w", err)
		}
		oursCPU, oursSamples = oursCPU+cpuTime()-cpu0, oursSamples+(o.Ops+o.WarmupOps)*int64(f.batchSize)
		after, _ := fs.SumReadStats(fsyses)
		reqStats, reqBatches = reqStats.Add(after.Sub(before)), reqBatches+issued.Load()
		c1, _, m1 := localfs.ReadCounts()
		cachedHits, cachedMisses = cachedHits+c1-c0, cachedMisses+m1-m0
		ours = append(ours, o)
		cold()
		progress(fmt.Sprintf("round %d/%d: baseline (%s), one plain pread per sample, %d in flight, %s", round+1, f.rounds, f.baseline, workers, slice))
		cpu0 = cpuTime()
		stopProf = startPhaseProfile(f.cpuProfile, "baseline", round)
		nextBatch.Store(int64(round) << 32)
		b, err := bench.Run(ctx, bench.Options{Workers: baseWorkers, Duration: slice, Warmup: f.warmup}, baseOp)
		stopProf()
		if err != nil {
			return fmt.Errorf("bench read: baseline: %w", err)
		}
		baseOps := b.Ops + b.WarmupOps
		if f.baseline == "batches" {
			baseOps *= int64(f.batchSize)
		}
		baseCPU, baseSamples = baseCPU+cpuTime()-cpu0, baseSamples+baseOps
		base = append(base, b)
		if fioOK {
			progress(fmt.Sprintf("round %d/%d: %s, iodepth 64, on %d file(s) of the dataset", round+1, f.rounds, fioName, len(fioFiles)))
			fr, err := bench.RunFio(ctx, bench.FioJob{Filenames: fioFiles, SpreadFiles: true, RW: "randread",
				BlockSize: fioBS, IODepth: 64, Direct: f.direct, Runtime: slice, RampTime: f.warmup,
				Extra: []string{"--readonly"}})
			if err != nil {
				warnf("fio: %v", err)
				fioOK = false
			} else {
				fioIOPS = append(fioIOPS, fr.Read.IOPS)
				res.FioEngine, res.FioFiles = fr.Engine, fioFiles
			}
		}
	}
	sum := func(rs []*bench.Result) (ops, bytes int64, sec float64) {
		for _, x := range rs {
			ops, bytes, sec = ops+x.Ops, bytes+x.Bytes, sec+x.Seconds
		}
		return
	}
	ops, bytes, sec := sum(ours)
	oc := bench.Combine(ours)
	res.Batches = ops
	if sec > 0 {
		res.SamplesPerSec = float64(ops*int64(f.batchSize)) / sec
		res.MiBPerSec = float64(bytes) / bench.MiB / sec
	}
	res.BatchLatency = oc.Latency
	res.BatchP50MS, res.BatchP99MS = oc.Latency.P50US/1000, oc.Latency.P99US/1000
	ops, bytes, sec = sum(base)
	bc := bench.Combine(base)
	if f.baseline == "batches" {
		ops *= int64(f.batchSize)
	}
	if sec > 0 {
		res.BaselineSamplesPerSec = float64(ops) / sec
		res.BaselineMiBPerSec = float64(bytes) / bench.MiB / sec
	}
	res.BaselineReadLatency = bc.Latency
	if res.BaselineSamplesPerSec > 0 {
		res.Ratio = res.SamplesPerSec / res.BaselineSamplesPerSec
	}
	res.Comparison = append(res.Comparison,
		bench.Compare("samples/s", res.SamplesPerSec, res.BaselineSamplesPerSec, "plain pread per sample"))
	if counted && reqBatches > 0 {
		res.StorageRequests = reqStats.Requests
		res.StorageRequestsPerBatch = float64(reqStats.Requests) / float64(reqBatches)
		res.BytesPerRequest = reqStats.BytesPerRequest()
		res.LocalShare = reqStats.LocalShare()
		if reqStats.Requests > 0 {
			res.RangesPerRequest = float64(reqStats.IOs) / float64(reqStats.Requests)
		}
	}
	if oursSamples > 0 && baseSamples > 0 {
		res.CPUMicrosPerSample = float64(oursCPU.Microseconds()) / float64(oursSamples)
		res.BaselineCPUMicrosPerSample = float64(baseCPU.Microseconds()) / float64(baseSamples)
		if res.CPUMicrosPerSample > 0 {
			res.CPURatio = res.BaselineCPUMicrosPerSample / res.CPUMicrosPerSample
		}
	}
	if cachedHits > 0 {
		res.CachedReads = float64(cachedHits) / float64(cachedHits+cachedMisses)
	}
	if len(fioIOPS) > 0 {
		for _, v := range fioIOPS {
			res.FioIOPS += v / float64(len(fioIOPS))
		}
		res.FioBlockSize = fioBS
		res.FioMiBPerSec = res.FioIOPS * float64(fioBS) / bench.MiB
		res.FioRatio = res.SamplesPerSec / res.FioIOPS
		res.Comparison = append(res.Comparison, bench.Compare("samples/s vs reads/s of the median sample size", res.SamplesPerSec, res.FioIOPS,
			fioName+" "+res.FioEngine+" iodepth 64"))
	}

	t := benchReadTable(res, f, st.MedianLen, workers, bc.Latency, counted, slice)
	if f.report != "" {
		if err := bench.WriteReportFile(f.report, benchReadReport(res, t, bc.Latency)); err != nil {
			return err
		}
	}
	if jsonOut {
		return printJSON(res)
	}
	if err := t.Write(human()); err != nil {
		return err
	}
	if f.report != "" {
		fmt.Fprintf(human(), "report: %s\n", f.report)
	}
	return nil
}

// benchReadTable is the result table of bench read (terminal and report).
func benchReadTable(res benchReadResult, f benchReadFlags, median int64, workers int, baseLat bench.Latency, counted bool, slice time.Duration) bench.Table {
	n, files := res.Samples, res.Files
	bc := struct{ Latency bench.Latency }{baseLat}
	t := bench.Table{
		Title:  fmt.Sprintf("bench read: %d samples in %d file(s), median sample %s, batch %d, %s", n, files, bench.FormatBytes(median), f.batchSize, res.Cache),
		Header: []string{"reader", "samples/s", "MiB/s", "p50 ms", "p99 ms", "ratio"},
	}
	var reqCols, blank []string // storage requests per batch, bytes per request
	if counted {
		t.Header = append(t.Header, "requests/batch", "bytes/request")
		reqCols = []string{bench.FormatFloat(res.StorageRequestsPerBatch, 1), bench.FormatBytes(int64(res.BytesPerRequest))}
		blank = []string{"", ""}
	}
	t.AddRow(append([]string{"ffkit ReadBatch", bench.FormatFloat(res.SamplesPerSec, 0), bench.FormatFloat(res.MiBPerSec, 1),
		bench.FormatFloat(res.BatchP50MS, 2), bench.FormatFloat(res.BatchP99MS, 2), bench.FormatRatio(res.Ratio)}, reqCols...)...)
	baseName := fmt.Sprintf("plain pread x%d", workers)
	if f.baseline == "batches" {
		baseName = fmt.Sprintf("plain pread batches, %dx%d", f.inflight, f.parallelism)
	}
	t.AddRow(append([]string{baseName, bench.FormatFloat(res.BaselineSamplesPerSec, 0), bench.FormatFloat(res.BaselineMiBPerSec, 1),
		bench.FormatFloat(bc.Latency.P50US/1000, 2), bench.FormatFloat(bc.Latency.P99US/1000, 2), "1.00x"}, blank...)...)
	if res.FioIOPS > 0 {
		t.AddRow(append([]string{fmt.Sprintf("fio randread %s %s qd64", bench.FormatBytes(res.FioBlockSize), res.FioEngine), bench.FormatFloat(res.FioIOPS, 0),
			bench.FormatFloat(res.FioMiBPerSec, 1), "", "", bench.FormatRatio(res.FioRatio)}, blank...)...)
	}
	if counted {
		t.Notes = append(t.Notes, fmt.Sprintf("ffkit ReadBatch on the cluster: %s storage requests per batch of %d samples, %s per request, %s merged ranges per request, %.0f%% of the bytes read locally (short-circuit)",
			bench.FormatFloat(res.StorageRequestsPerBatch, 1), f.batchSize, bench.FormatBytes(int64(res.BytesPerRequest)), bench.FormatFloat(res.RangesPerRequest, 1), 100*res.LocalShare))
	}
	t.Notes = append(t.Notes,
		map[string]string{"batches": "the baseline reads ffkit's batches, in the same order, into a buffer per batch; both latencies are per batch",
			"samples": "--baseline samples: random samples, one reused buffer per goroutine; ffkit latencies are per batch, the baseline's per pread"}[f.baseline],
		map[bool]string{false: "both rows check each sample's CRC-32", true: "--no-verify: neither row checks CRCs"}[f.noVerify],
		fmt.Sprintf("ratio = ffkit samples/s over the row's samples/s; %d batches of %d in flight, up to %d reads each, %d in all", f.inflight, f.batchSize, f.parallelism, res.MaxInFlight),
		fmt.Sprintf("%d rounds alternating the rows, %s each per round, made %s before each", f.rounds, slice, map[bool]string{false: "cold", true: "warm"}[f.warm]))
	if res.FioIOPS > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("fio reads %s per request (the median sample, rounded up to 4 KiB): its reads/s compare with samples/s", bench.FormatBytes(res.FioBlockSize)))
	}
	if res.CPUMicrosPerSample > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("CPU per sample (user+system, warm-up included): ffkit %.2f us, baseline %.2f us, %s (baseline over ffkit)",
			res.CPUMicrosPerSample, res.BaselineCPUMicrosPerSample, bench.FormatRatio(res.CPURatio)))
	}
	if res.CachedReads > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("%.0f%% of ffkit's probed reads were served by the page cache with preadv2(RWF_NOWAIT), without io_uring", 100*res.CachedReads))
	}
	if !f.direct && !f.warm {
		t.Notes = append(t.Notes, "without --direct the page cache refills during each phase: a dataset smaller than memory is soon read warm; --direct measures the device")
	}
	return t
}

// benchReadReport is the --report page of bench read.
func benchReadReport(res benchReadResult, t bench.Table, baseLat bench.Latency) *bench.Report {
	cats := []string{"ffkit ReadBatch", "plain pread"}
	vals := []float64{res.SamplesPerSec, res.BaselineSamplesPerSec}
	mib := []float64{res.MiBPerSec, res.BaselineMiBPerSec}
	if res.FioIOPS > 0 {
		cats = append(cats, "fio "+bench.FormatBytes(res.FioBlockSize))
		vals = append(vals, res.FioIOPS)
		mib = append(mib, res.FioMiBPerSec)
	}
	rate := bench.Chart{Title: "Samples/s (fio: reads of the median sample size per second)", XLabel: "reader", YLabel: "samples/s",
		Categories: cats, Series: []bench.Series{{Name: "samples/s", Values: vals}}}
	bw := bench.Chart{Title: "Throughput (MiB/s)", XLabel: "reader", YLabel: "MiB/s", Categories: cats, Series: []bench.Series{{Name: "MiB/s", Values: mib}}}
	lat := bench.Chart{Title: "Latency (us): ffkit per batch, baseline per pread", Kind: bench.Lines, Scale: bench.ScaleAuto, XLabel: "percentile", YLabel: "us",
		Categories: latencyCategories, Series: []bench.Series{{Name: "ffkit batch", Values: latencyValues(res.BatchLatency)}, {Name: "pread", Values: latencyValues(baseLat)}}}
	return &bench.Report{Title: "ffkit bench read", Meta: reportMeta(res.Dataset), Data: res,
		Sections: []bench.Section{{Heading: "Throughput", Charts: []bench.Chart{rate, bw}}, {Heading: "Latency", Charts: []bench.Chart{lat}}, {Tables: []bench.Table{t}}}}
}

// cpuTime is this process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startPhaseProfile starts a CPU profile of one phase into
// PREFIX.PHASE.ROUND.pprof (nothing without a prefix) and returns its stop.
func startPhaseProfile(prefix, phase string, round int) func() {
	if prefix == "" {
		return func() {}
	}
	pf, err := os.Create(fmt.Sprintf("%s.%s.%d.pprof", prefix, phase, round))
	if err != nil {
		warnf("cpuprofile: %v", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		warnf("cpuprofile: %v", err)
		pf.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); pf.Close() }
}

// preadBatches is the default baseline's operation: the next batch (the
// same indices ffkit's phase reads), each sample read with one plain pread
// into its place in the worker's batch buffer by f.parallelism goroutines
// taking samples in turn, its CRC-32 checked (readOne), the buffer then
// holding the whole batch as ffkit's does. maxInFlight bounds the preads
// of all batches together when --max-in-flight is set.
func preadBatches(f benchReadFlags, maxInFlight int, batchIndices func([]int64),
	locate func(int64) (int, int64, int64, error), readOne func(i int64, file int, off int64, b []byte) error) bench.Op {
	type batch struct {
		idx      []int64
		file     []int
		off, pos []int64
		buf      []byte
	}
	batches := make([]batch, f.inflight)
	for w := range batches {
		batches[w] = batch{idx: make([]int64, f.batchSize), file: make([]int, f.batchSize),
			off: make([]int64, f.batchSize), pos: make([]int64, f.batchSize+1)}
	}
	var sem chan struct{} // shared bound of --max-in-flight
	if f.maxInFlight > 0 {
		sem = make(chan struct{}, maxInFlight)
	}
	return func(ctx context.Context, w int, seq int64) (int64, error) {
		b := &batches[w]
		batchIndices(b.idx)
		var size int64
		for k, i := range b.idx {
			file, off, l, err := locate(i)
			if err != nil {
				return 0, err
			}
			b.file[k], b.off[k], b.pos[k] = file, off, size
			size += l
		}
		b.pos[len(b.idx)] = size
		if int64(cap(b.buf)) < size {
			b.buf = make([]byte, size*2)
		}
		var next atomic.Int64
		var g errgroup.Group
		for range min(f.parallelism, len(b.idx)) {
			g.Go(func() error {
				for {
					k := next.Add(1) - 1
					if k >= int64(len(b.idx)) {
						return nil
					}
					if sem != nil {
						select {
						case sem <- struct{}{}:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
					err := readOne(b.idx[k], b.file[k], b.off[k], b.buf[b.pos[k]:b.pos[k+1]])
					if sem != nil {
						<-sem
					}
					if err != nil {
						return err
					}
				}
			})
		}
		return size, g.Wait()
	}
}
