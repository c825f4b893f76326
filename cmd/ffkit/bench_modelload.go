package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
)

func init() { registerBench(newBenchModelLoadCmd) }

type modelLoadOpts struct {
	storageFlags
	generate string
	clients  int
	parallel int
	chunk    string
}

type modelLoadDoc struct {
	Benchmark string           `json:"benchmark"`
	Path      string           `json:"path"`
	Files     int              `json:"files"`
	Bytes     int64            `json:"bytes"` // per client
	Generated bool             `json:"generated"`
	Clients   int              `json:"clients"`
	Parallel  int              `json:"parallel"`
	Chunk     int64            `json:"chunk"`
	Runs      int              `json:"runs"`
	Direct    bool             `json:"direct"`
	Cache     bench.CacheState `json:"cache"`
	// TotalSeconds: time from the first client's start to the last one's end.
	TotalSeconds bench.Spread `json:"total_seconds"`
	GiBPerSec    bench.Spread `json:"gib_s"`
	// AggregateMiBPerSec is all clients' bytes over TotalSeconds; the naive
	// sum of per-client rates is beside it.
	AggregateMiBPerSec bench.Spread `json:"aggregate_mib_s"`
	NaiveSumMiBPerSec  float64      `json:"naive_sum_mib_s"`
	// LoadTime: each client's time to load every file.
	LoadTime   loadTime   `json:"load_time"`
	Fio        *fioFigure `json:"fio,omitempty"`
	FioError   string     `json:"fio_error,omitempty"`
	RatioVsFio float64    `json:"ratio_vs_fio,omitempty"`
	FioNote    string     `json:"fio_note,omitempty"`
}

// loadTime summarises the clients' load times, in milliseconds.
type loadTime struct {
	Count  int     `json:"count"`
	MinMS  float64 `json:"min_ms"`
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	MaxMS  float64 `json:"max_ms"`
}

func newBenchModelLoadCmd() *cobra.Command {
	o := &modelLoadOpts{}
	c := &cobra.Command{
		Use:   "model-load PATH",
		Short: "Time loading a directory of large files (model shards) in parallel, as an inference server does at start-up",
		Long: `Reads every file in PATH (a directory, local or ffkit://) completely, --parallel
files at a time, in --chunk reads, as an inference server loads its
safetensors shards at start-up; prints the total time and GiB/s. With
--generate NxSIZE it first writes N synthetic shards of SIZE bytes (valid
safetensors files holding one U8 tensor) and reads only those (removed
afterwards unless --keep). With --clients K, K loaders run at once and the
aggregate bandwidth is all bytes over (last end - first start), printed next
to the naive sum of per-client rates. Files are evicted from the page cache
before each run (--direct reads with O_DIRECT). fio reads the same files
(one job per file, numjobs = K) for comparison.`,
		Example: `  ffkit bench model-load /mnt/nvme/models --generate 8x512M
  ffkit bench model-load /models/llama-8b --clients 4 --direct --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runModelLoad(cmd.Context(), o, args[0]) },
	}
	o.add(c, 2, false)
	fl := c.Flags()
	fl.StringVar(&o.generate, "generate", "", "first write `NxSIZE` synthetic shards (e.g. 8x512M) and load those")
	fl.IntVar(&o.clients, "clients", 1, "concurrent loaders, each reading every file")
	fl.IntVar(&o.parallel, "parallel", 16, "files each loader reads at once")
	fl.StringVar(&o.chunk, "chunk", "4M", "size of each read call")
	return c
}

// safetensorsHeader returns the header of a safetensors file holding one
// U8 tensor of n bytes: 8-byte little-endian length, then JSON padded
// with spaces to a multiple of 8.
func safetensorsHeader(n int64) []byte {
	meta, _ := json.Marshal(map[string]any{
		"__metadata__": map[string]string{"format": "pt", "generator": "ffkit bench model-load"},
		"weight":       map[string]any{"dtype": "U8", "shape": []int64{n}, "data_offsets": []int64{0, n}},
	})
	if pad := len(meta) % 8; pad != 0 {
		meta = append(meta, strings.Repeat(" ", 8-pad)...)
	}
	h := make([]byte, 8, 8+len(meta))
	binary.LittleEndian.PutUint64(h, uint64(len(meta)))
	return append(h, meta...)
}

func runModelLoad(ctx context.Context, o *modelLoadOpts, path string) error {
	if err := o.validate(); err != nil {
		return err
	}
	if o.clients < 1 || o.clients > 1024 {
		return usagef("--clients %d: want 1..1024", o.clients)
	}
	if o.parallel < 1 {
		return usagef("--parallel %d: must be at least 1", o.parallel)
	}
	chunk, err := bench.ParseSize(o.chunk)
	if err != nil || chunk <= 0 || chunk > 1<<30 {
		return usagef("--chunk %q: want a size from 1 to 1G", o.chunk)
	}
	var genN int
	var genSize int64
	if o.generate != "" {
		if genN, genSize, err = bench.ParseCountSize(o.generate); err != nil {
			return usagef("--generate: %w", err)
		}
	}
	w, fw, fioNote, closeDirs, err := o.openWorkdirs(ctx, path)
	if err != nil {
		return err
	}
	defer closeDirs()
	useFio := fw != nil

	var names []string
	var sizes []int64
	if genN > 0 {
		for i := range genN {
			name := fmt.Sprintf("ffkit-model-%05d-of-%05d.safetensors", i+1, genN)
			statusf("model-load: writing shard %d/%d (%s)", i+1, genN, bench.FormatBytes(genSize))
			h := safetensorsHeader(genSize)
			if err := w.WriteFile(ctx, name, h, genSize, 4<<20); err != nil {
				return err
			}
			names, sizes = append(names, name), append(sizes, int64(len(h))+genSize)
		}
	} else {
		ents, err := w.FS.List(ctx, w.Dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if !e.IsDir && e.Size > 0 && !strings.HasPrefix(e.Name, ".") {
				names, sizes = append(names, e.Name), append(sizes, e.Size)
			}
		}
		if len(names) == 0 {
			return usagef("%s has no files to load; add --generate 8x512M to write synthetic shards first", path)
		}
	}
	if mem := int64(o.clients) * int64(min(o.parallel, len(names))) * chunk; mem > 4<<30 {
		return usagef("clients x parallel files x chunk needs %s of buffers (max 4 GiB): lower --clients, --parallel or --chunk", bench.FormatBytes(mem))
	}
	var perClient int64
	for _, s := range sizes {
		perClient += s
	}
	doc := modelLoadDoc{Benchmark: "model-load", Path: path, Files: len(names), Bytes: perClient, Generated: genN > 0,
		Clients: o.clients, Parallel: o.parallel, Chunk: chunk, Runs: o.runs, Direct: o.direct, FioNote: fioNote}

	// load reads every file completely, o.parallel at a time.
	load := func(ctx context.Context) (int64, error) {
		g, ctx := errgroup.WithContext(ctx)
		g.SetLimit(o.parallel)
		for i, name := range names {
			g.Go(func() error {
				f, err := w.FS.Open(ctx, w.Join(name), fs.OpenOptions{Direct: o.direct})
				if err != nil {
					return err
				}
				defer f.Close()
				buf := localfs.AlignedBuffer(int(min(chunk, max(sizes[i], 1))))
				for off := int64(0); off < f.Size(); off += chunk {
					if err := ctx.Err(); err != nil {
						return err
					}
					n := min(chunk, f.Size()-off)
					if err := localfs.ReadFull(f, buf[:n], off); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return 0, err
		}
		return perClient, nil
	}
	rep, err := bench.RepeatFunc(ctx, o.runs, func(ctx context.Context, run int) (*bench.Result, error) {
		statusf("model-load: run %d/%d: %d client(s) loading %d files (%s each)", run+1, o.runs, o.clients, len(names), bench.FormatBytes(perClient))
		var err error
		if doc.Cache, err = w.Cold(o.direct, names...); err != nil {
			warnf("could not evict the files from the page cache: %v", err)
		}
		return bench.Run(ctx, bench.Options{Workers: o.clients, Count: 1}, func(ctx context.Context, _ int, _ int64) (int64, error) {
			return load(ctx)
		})
	})
	if err != nil {
		return err
	}
	var secs []float64
	for _, r := range rep.Runs {
		secs = append(secs, r.Seconds)
	}
	doc.TotalSeconds = bench.SpreadOf(secs)
	doc.AggregateMiBPerSec = rep.MiBPerSec
	g := rep.MiBPerSec
	doc.GiBPerSec = bench.Spread{Runs: g.Runs, Min: g.Min / 1024, Mean: g.Mean / 1024, Max: g.Max / 1024, Stddev: g.Stddev / 1024}
	doc.NaiveSumMiBPerSec = rep.NaiveSumMiBPerSec
	l := rep.Latency
	doc.LoadTime = loadTime{Count: l.Count, MinMS: l.MinUS / 1e3, MeanMS: l.MeanUS / 1e3, P50MS: l.P50US / 1e3, MaxMS: l.MaxUS / 1e3}

	if useFio {
		statusf("model-load: fio")
		smallest := sizes[0]
		for _, s := range sizes {
			smallest = min(smallest, s)
		}
		// fio refuses a block larger than a file.
		bs := max(4096, min(chunk, smallest/4096*4096))
		job := bench.FioJob{RW: "read", BlockSize: bs, Direct: o.direct, NumJobs: o.clients}
		if fw == w {
			for _, n := range names {
				p, _ := w.LocalPath(n)
				job.Filenames = append(job.Filenames, p)
			}
			w.Cold(o.direct, names...)
		} else {
			// Files of the same sizes (on average) in --fio-dir, laid out by fio.
			job.Size = perClient / int64(len(names))
			for i := range names {
				n := fmt.Sprintf("ffkit-model-fio-%05d.bin", i)
				fw.Track(n)
				p, _ := fw.LocalPath(n)
				job.Filenames = append(job.Filenames, p)
			}
		}
		doc.Fio, doc.FioError = runFioRuns(ctx, o.runs, job, func() {
			if fw == w {
				w.Cold(o.direct, names...)
			}
		}, nil)
		if doc.Fio != nil {
			doc.RatioVsFio = bench.Compare("MiB/s", doc.AggregateMiBPerSec.Mean, doc.Fio.MiBPerSec, "fio").Ratio
		}
	}
	statusDone()

	t := bench.Table{
		Title: fmt.Sprintf("ffkit bench model-load %s: %d files, %s per client, %d client(s), %d files at a time, %s reads",
			path, len(names), bench.FormatBytes(perClient), o.clients, o.parallel, bench.FormatSize(chunk)),
		Header: []string{"total s", "GiB/s", "aggregate MiB/s (mean ±sd (min-max, n))", "naive-sum MiB/s", "load p50 ms", "load max ms"},
	}
	if useFio {
		t.Header = append(t.Header, "fio MiB/s", "ratio")
	}
	row := []string{bench.FormatFloat(doc.TotalSeconds.Mean, 3), bench.FormatFloat(doc.GiBPerSec.Mean, 3), mibFmt(doc.AggregateMiBPerSec),
		bench.FormatFloat(doc.NaiveSumMiBPerSec, 1), bench.FormatFloat(doc.LoadTime.P50MS, 1), bench.FormatFloat(doc.LoadTime.MaxMS, 1)}
	if useFio {
		row = append(row, fioFmt(doc.Fio), bench.FormatRatio(doc.RatioVsFio))
	}
	t.AddRow(row...)
	t.Notes = append(t.Notes, fmt.Sprintf("%s; %d run(s); total s is first client start to last client end; fio: as many runs, one job per file x %d.", doc.Cache, o.runs, o.clients))
	if fioNote != "" {
		t.Notes = append(t.Notes, fioNote)
	}
	if doc.FioError != "" {
		t.Notes = append(t.Notes, "fio failed: "+doc.FioError)
	}

	fioV := math.NaN()
	if doc.Fio != nil {
		fioV = doc.Fio.MiBPerSec
	}
	bw := bench.Chart{Title: "Aggregate load bandwidth (MiB/s)", XLabel: fmt.Sprintf("%d client(s)", o.clients), YLabel: "MiB/s",
		Categories: []string{"aggregate", "naive sum of clients"},
		Series:     []bench.Series{{Name: "ffkit", Values: []float64{doc.AggregateMiBPerSec.Mean, doc.NaiveSumMiBPerSec}}}}
	if useFio {
		bw.Series = append(bw.Series, bench.Series{Name: "fio", Values: []float64{fioV, math.NaN()}})
	}
	var runCats []string
	var runVals []float64
	for i, r := range rep.Runs {
		runCats = append(runCats, fmt.Sprintf("run %d", i+1))
		runVals = append(runVals, r.Seconds)
	}
	times := bench.Chart{Title: "Total load time per run (s)", XLabel: "run", YLabel: "seconds", Categories: runCats,
		Series: []bench.Series{{Name: "total time", Values: runVals}}}
	rep2 := &bench.Report{Title: "ffkit bench model-load", Meta: reportMeta(string(doc.Cache)), Data: doc,
		Sections: []bench.Section{{Heading: "Bandwidth", Charts: []bench.Chart{bw, times}}, {Tables: []bench.Table{t}}}}
	return emit(&o.storageFlags, doc, []bench.Table{t}, rep2)
}
