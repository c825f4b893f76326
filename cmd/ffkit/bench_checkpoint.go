package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
)

func init() { registerBench(newBenchCheckpointCmd) }

type checkpointOpts struct {
	storageFlags
	size, chunk string
}

type checkpointPhase struct {
	MiBPerSec bench.Spread  `json:"mib_s"`
	MBPerSec  bench.Spread  `json:"mb_s"` // decimal megabytes (10^6) per second
	Latency   bench.Latency `json:"latency"`
	Fio       *fioFigure    `json:"fio,omitempty"`
	FioError  string        `json:"fio_error,omitempty"`
	Ratio     float64       `json:"ratio_vs_fio,omitempty"`
}

type checkpointDoc struct {
	Benchmark string           `json:"benchmark"`
	Path      string           `json:"path"`
	Size      int64            `json:"size"`
	Chunk     int64            `json:"chunk"`
	Runs      int              `json:"runs"`
	Direct    bool             `json:"direct"`
	Cache     bench.CacheState `json:"cache"`
	Write     checkpointPhase  `json:"write"`
	// BufferedMiBPerSec is the write rate before the final fsync, and
	// FsyncSeconds the time of flush + fsync + rename: a save that returns
	// before fsync looks this fast, but is not durable.
	BufferedMiBPerSec bench.Spread    `json:"buffered_mib_s"`
	FsyncSeconds      bench.Spread    `json:"fsync_s"`
	Read              checkpointPhase `json:"read"`
	FioNote           string          `json:"fio_note,omitempty"`
}

func newBenchCheckpointCmd() *cobra.Command {
	o := &checkpointOpts{}
	c := &cobra.Command{
		Use:   "checkpoint PATH",
		Short: "Time a checkpoint save (buffered stream + fsync) and its read-back",
		Long: `Writes one large file in PATH (a directory, local or ffkit://, created if
missing) the way a checkpoint save does: a buffered stream of --chunk writes,
then flush + fsync + atomic rename (fs.Writer.Commit), all counted in the
write rate. Then reads it back sequentially in --chunk reads, cold (the file
is evicted from the page cache first; --direct reads with O_DIRECT).
Prints MiB/s and MB/s for each phase over --runs runs, the buffered rate
before the fsync, and fio's figure for the same job (bs = --chunk,
end_fsync=1 for the write).`,
		Example: `  ffkit bench checkpoint /mnt/nvme/ckpt --size 2G
  ffkit bench checkpoint ffkit://127.0.0.1:9000/ckpt --size 1G --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runCheckpoint(cmd.Context(), o, args[0]) },
	}
	o.add(c, 2, false)
	c.Flags().StringVar(&o.size, "size", "512M", "checkpoint size")
	c.Flags().StringVar(&o.chunk, "chunk", "1M", "size of each write and read call")
	return c
}

func runCheckpoint(ctx context.Context, o *checkpointOpts, path string) error {
	if err := o.validate(); err != nil {
		return err
	}
	size, err := bench.ParseSize(o.size)
	if err != nil || size <= 0 {
		return usagef("--size %q: want a positive size such as 2G", o.size)
	}
	chunk, err := bench.ParseSize(o.chunk)
	if err != nil || chunk <= 0 || chunk > 1<<30 {
		return usagef("--chunk %q: want a size from 1 to 1G", o.chunk)
	}
	w, fw, fioNote, closeDirs, err := o.openWorkdirs(ctx, path)
	if err != nil {
		return err
	}
	defer closeDirs()
	useFio := fw != nil
	doc := checkpointDoc{Benchmark: "checkpoint", Path: path, Size: size, Chunk: chunk, Runs: o.runs, Direct: o.direct, FioNote: fioNote}
	nChunks := (size + chunk - 1) / chunk
	chunkLen := func(i int64) int64 { return min(chunk, size-i*chunk) }
	pat := bench.NewPattern(int(chunk), 7)
	buf := localfs.AlignedBuffer(int(chunk))

	var writes, reads []*bench.Result
	var buffered, fsyncs []float64
	for run := range o.runs {
		name := fmt.Sprintf("ffkit-checkpoint-%d.bin", run)
		statusf("checkpoint: run %d/%d: writing %s", run+1, o.runs, bench.FormatBytes(size))
		wr, err := w.FS.Create(ctx, w.Join(name))
		if err != nil {
			return fmt.Errorf("create %s: %w", w.Join(name), err)
		}
		w.Track(name)
		var commit time.Duration
		res, err := bench.Run(ctx, bench.Options{Count: nChunks,
			Finish: func(ctx context.Context, _ int) error {
				t := time.Now()
				err := wr.Commit()
				commit = time.Since(t)
				return err
			}},
			func(ctx context.Context, _ int, seq int64) (int64, error) {
				n := chunkLen(seq)
				_, err := wr.Write(pat.Chunk(seq*chunk, int(n)))
				return n, err
			})
		wr.Close()
		if err != nil {
			return err
		}
		writes = append(writes, res)
		buffered = append(buffered, float64(size)/bench.MiB/(res.Seconds-commit.Seconds()))
		fsyncs = append(fsyncs, commit.Seconds())

		statusf("checkpoint: run %d/%d: reading it back", run+1, o.runs)
		if doc.Cache, err = w.Cold(o.direct, name); err != nil {
			warnf("could not evict %s from the page cache: %v", name, err)
		}
		f, err := w.FS.Open(ctx, w.Join(name), fs.OpenOptions{Direct: o.direct})
		if err != nil {
			return err
		}
		res, err = bench.Run(ctx, bench.Options{Count: nChunks}, func(ctx context.Context, _ int, seq int64) (int64, error) {
			n := chunkLen(seq)
			return n, localfs.ReadFull(f, buf[:n], seq*chunk)
		})
		f.Close()
		if err != nil {
			return err
		}
		reads = append(reads, res)
		if !o.keep {
			if err := w.Remove(ctx, name); err != nil {
				return err
			}
		}
	}
	wrep, rrep := bench.Combine(writes), bench.Combine(reads)
	doc.Write = checkpointPhase{MiBPerSec: wrep.MiBPerSec, MBPerSec: toMB(wrep.MiBPerSec), Latency: wrep.Latency}
	doc.Read = checkpointPhase{MiBPerSec: rrep.MiBPerSec, MBPerSec: toMB(rrep.MiBPerSec), Latency: rrep.Latency}
	doc.BufferedMiBPerSec, doc.FsyncSeconds = bench.SpreadOf(buffered), bench.SpreadOf(fsyncs)

	if useFio {
		const fioName = "ffkit-checkpoint-fio.bin"
		p, _ := fw.LocalPath(fioName)
		fw.Track(fioName)
		statusf("checkpoint: fio write")
		doc.Write.Fio, doc.Write.FioError = runFioRuns(ctx, o.runs,
			bench.FioJob{Filenames: []string{p}, RW: "write", BlockSize: chunk, Size: size, EndFsync: true}, nil, nil)
		statusf("checkpoint: fio read")
		doc.Read.Fio, doc.Read.FioError = runFioRuns(ctx, o.runs,
			bench.FioJob{Filenames: []string{p}, RW: "read", BlockSize: chunk, Size: size, Direct: o.direct},
			func() { fw.Cold(o.direct, fioName) }, nil)
		if !o.keep {
			fw.Remove(ctx, fioName)
		}
		for _, ph := range []*checkpointPhase{&doc.Write, &doc.Read} {
			if ph.Fio != nil {
				ph.Ratio = bench.Compare("MiB/s", ph.MiBPerSec.Mean, ph.Fio.MiBPerSec, "fio").Ratio
			}
		}
	}
	statusDone()

	t := bench.Table{
		Title:  fmt.Sprintf("ffkit bench checkpoint %s: %s in %s calls", path, bench.FormatBytes(size), bench.FormatSize(chunk)),
		Header: []string{"phase", "MiB/s (mean ±sd (min-max, n))", "MB/s", "p50 us", "p99 us"},
	}
	if useFio {
		t.Header = append(t.Header, "fio MiB/s", "ratio")
	}
	row := func(name string, ph checkpointPhase) {
		r := []string{name, mibFmt(ph.MiBPerSec), bench.FormatFloat(ph.MBPerSec.Mean, 1),
			bench.FormatFloat(ph.Latency.P50US, 0), bench.FormatFloat(ph.Latency.P99US, 0)}
		if useFio {
			r = append(r, fioFmt(ph.Fio), bench.FormatRatio(ph.Ratio))
		}
		t.AddRow(r...)
	}
	row("save (write + fsync)", doc.Write)
	row("load (read back)", doc.Read)
	t.Notes = append(t.Notes,
		fmt.Sprintf("save: %s MiB/s before the final fsync, which took %s s; the save rate counts it.",
			mibFmt(doc.BufferedMiBPerSec), bench.FormatSpread(doc.FsyncSeconds, "%.3f")),
		fmt.Sprintf("load: %s. Latency is per %s call. %d run(s), fio too (write with end_fsync=1).", doc.Cache, bench.FormatSize(chunk), o.runs))
	if fioNote != "" {
		t.Notes = append(t.Notes, fioNote)
	}
	for _, ph := range []checkpointPhase{doc.Write, doc.Read} {
		if ph.FioError != "" {
			t.Notes = append(t.Notes, "fio failed: "+ph.FioError)
		}
	}

	fioVals := []float64{math.NaN(), math.NaN()}
	if doc.Write.Fio != nil {
		fioVals[0] = doc.Write.Fio.MiBPerSec
	}
	if doc.Read.Fio != nil {
		fioVals[1] = doc.Read.Fio.MiBPerSec
	}
	bw := bench.Chart{Title: "Checkpoint save and load (MiB/s)", XLabel: "phase", YLabel: "MiB/s",
		Categories: []string{"save (write + fsync)", "load (read)"},
		Series:     []bench.Series{{Name: "ffkit", Values: []float64{doc.Write.MiBPerSec.Mean, doc.Read.MiBPerSec.Mean}}}}
	if useFio {
		bw.Series = append(bw.Series, bench.Series{Name: "fio", Values: fioVals})
	}
	lat := bench.Chart{Title: fmt.Sprintf("Latency per %s call (us)", bench.FormatSize(chunk)), Kind: bench.Lines, Scale: bench.ScaleAuto, XLabel: "percentile", YLabel: "us",
		Categories: latencyCategories, Series: []bench.Series{{Name: "write", Values: latencyValues(doc.Write.Latency)}, {Name: "read", Values: latencyValues(doc.Read.Latency)}}}
	rep := &bench.Report{Title: "ffkit bench checkpoint", Meta: reportMeta(), Data: doc,
		Sections: []bench.Section{{Heading: "Throughput", Charts: []bench.Chart{bw}}, {Heading: "Latency", Charts: []bench.Chart{lat}}, {Tables: []bench.Table{t}}}}
	return emit(&o.storageFlags, doc, []bench.Table{t}, rep)
}

// toMB converts a spread of MiB/s to MB/s (10^6 bytes).
func toMB(s bench.Spread) bench.Spread {
	f := float64(bench.MiB) / 1e6
	return bench.Spread{Runs: s.Runs, Min: s.Min * f, Mean: s.Mean * f, Max: s.Max * f, Stddev: s.Stddev * f}
}
