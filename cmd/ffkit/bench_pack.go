package main

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/pack"
)

func init() { registerBench(newBenchPackCmd) }

type benchPackDoc struct {
	Benchmark  string            `json:"benchmark"`
	Dir        string            `json:"dir"`
	Size       int64             `json:"size"`
	SampleSize int64             `json:"sample_size"`
	Runs       int               `json:"runs"`
	LoadAvg    string            `json:"loadavg"`
	Sources    []benchPackSource `json:"sources"`
	Fio        *fioFigure        `json:"fio,omitempty"`
	FioError   string            `json:"fio_error,omitempty"`
}

type benchPackSource struct {
	Format    string       `json:"format"`
	MiBPerSec bench.Spread `json:"mib_s"` // sample bytes per second, fsync included
	Ratio     float64      `json:"ratio_vs_fio,omitempty"`
	// RoundRatios: each round's pack MiB/s over that round's fio MiB/s;
	// their median is steadier than Ratio on a shared disk.
	RoundRatios []float64 `json:"round_ratios,omitempty"`
	RatioMedian float64   `json:"ratio_median,omitempty"`
}

func newBenchPackCmd() *cobra.Command {
	var size, sampleSize string
	var runs int
	c := &cobra.Command{
		Use:   "pack DIR",
		Short: "Pack WebDataset shards and a Parquet column into FFRecord, against fio's sequential write",
		Long: `Makes WebDataset tar shards (a --sample-size jpg and a small json per
sample) and two Parquet files with one binary column of --sample-size values
(parquet: uncompressed, no dictionary; parquet-snappy: snappy with dictionary
pages tried first, as pyarrow writes by default), each --size in total, in DIR (a local directory); reads them once into the page
cache; then, in each of --runs rounds, runs fio's sequential write of --size
(1 MiB blocks, fsync at the end) and packs each source into DIR (shards synced
and published). Prints each pack's sample MiB/s (from opening the source to
the published dataset), its ratio to fio's mean, and the median of each
round's ratio to that round's fio.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sz, err := bench.ParseSize(size)
			if err != nil || sz <= 0 {
				return usagef("--size %q: want a positive size such as 1G", size)
			}
			ss, err := bench.ParseSize(sampleSize)
			if err != nil || ss <= 0 || ss > sz {
				return usagef("--sample-size %q: want a positive size up to --size", sampleSize)
			}
			if runs <= 0 {
				return usagef("--runs must be positive, got %d", runs)
			}
			return runBenchPack(cmd.Context(), args[0], sz, ss, runs)
		},
	}
	c.Flags().StringVar(&size, "size", "1G", "bytes of samples per source")
	c.Flags().StringVar(&sampleSize, "sample-size", "100K", "size of each sample's main member (the jpg, the binary value)")
	c.Flags().IntVar(&runs, "runs", 3, "rounds (fio, then each pack)")
	return c
}

func runBenchPack(ctx context.Context, dir string, size, sampleSize int64, runs int) error {
	if strings.Contains(dir, "://") {
		return usagef("bench pack: DIR must be a local directory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	doc := benchPackDoc{Benchmark: "pack", Dir: dir, Size: size, SampleSize: sampleSize, Runs: runs}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		doc.LoadAvg = strings.TrimSpace(string(b))
	}
	statusf("pack: making the sources")
	wdsDir := filepath.Join(dir, "bench-pack-wds")
	pq := filepath.Join(dir, "bench-pack.parquet")
	pqSnappy := filepath.Join(dir, "bench-pack-snappy.parquet")
	defer os.RemoveAll(wdsDir)
	defer os.Remove(pq)
	defer os.Remove(pqSnappy)
	if err := benchPackSources(wdsDir, pq, pqSnappy, size, sampleSize); err != nil {
		return err
	}
	for _, p := range []string{wdsDir, pq, pqSnappy} { // into the page cache
		filepath.Walk(p, func(f string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() {
				if fh, err := os.Open(f); err == nil {
					io.Copy(io.Discard, fh)
					fh.Close()
				}
			}
			return nil
		})
	}
	type src struct {
		format, path string
		opts         pack.Options
	}
	srcs := []src{{"webdataset", wdsDir, pack.Options{Format: "webdataset"}}, {"parquet", pq, pack.Options{Column: "image"}},
		{"parquet-snappy", pqSnappy, pack.Options{Column: "image"}}}
	mibs := make([][]float64, len(srcs))
	var fioRuns []*fioFigure
	fioFile := filepath.Join(dir, "bench-pack-fio.bin")
	defer os.Remove(fioFile)
	for r := range runs {
		if bench.FioAvailable() {
			statusf("pack: round %d: fio write", r+1)
			f, e := runFio(ctx, bench.FioJob{Filenames: []string{fioFile}, RW: "write", BlockSize: 1 << 20, Size: size, EndFsync: true})
			os.Remove(fioFile)
			if f == nil {
				doc.FioError = e
			} else {
				fioRuns = append(fioRuns, f)
			}
		}
		for i, s := range srcs {
			statusf("pack: round %d: %s", r+1, s.format)
			out := filepath.Join(dir, "bench-pack-out-"+s.format)
			// Timed from opening the source (which lists a tar's members
			// or a Parquet column's values) to the published dataset.
			start := time.Now()
			source, err := pack.Open(ctx, s.path, s.opts)
			if err != nil {
				return err
			}
			res, err := pack.Pack(ctx, source, out, pack.Config{Force: true, Align: pack.AlignAuto})
			source.Close()
			if err != nil {
				return err
			}
			secs := time.Since(start).Seconds()
			os.RemoveAll(out)
			mibs[i] = append(mibs[i], float64(res.DataBytes)/(1<<20)/secs)
		}
	}
	var fioMiBs []float64 // per round (doc.Fio, the first round's figure, gets the mean)
	for _, f := range fioRuns {
		fioMiBs = append(fioMiBs, f.MiBPerSec)
	}
	if len(fioRuns) > 0 {
		m := slices.Clone(fioMiBs)
		doc.Fio = fioRuns[0]
		doc.Fio.Runs, doc.Fio.Spread = len(m), bench.SpreadOf(m)
		doc.Fio.MiBPerSec = doc.Fio.Spread.Mean
	}
	for i, s := range srcs {
		bs := benchPackSource{Format: s.format, MiBPerSec: bench.SpreadOf(mibs[i])}
		if doc.Fio != nil && doc.Fio.MiBPerSec > 0 {
			bs.Ratio = bs.MiBPerSec.Mean / doc.Fio.MiBPerSec
		}
		if len(fioMiBs) == len(mibs[i]) {
			for r, f := range fioMiBs {
				if f > 0 {
					bs.RoundRatios = append(bs.RoundRatios, mibs[i][r]/f)
				}
			}
			if len(bs.RoundRatios) > 0 {
				rs := slices.Clone(bs.RoundRatios)
				slices.Sort(rs)
				bs.RatioMedian = rs[len(rs)/2]
				if len(rs)%2 == 0 {
					bs.RatioMedian = (rs[len(rs)/2-1] + rs[len(rs)/2]) / 2
				}
			}
		}
		doc.Sources = append(doc.Sources, bs)
	}
	if jsonOut {
		return printJSON(doc)
	}
	w := human()
	fmt.Fprintf(w, "pack %s of %s samples from the page cache into %s, %d run(s); load average %s\n",
		bench.FormatBytes(size), bench.FormatBytes(sampleSize), dir, runs, doc.LoadAvg)
	fmt.Fprintf(w, "  %-11s %s MiB/s\n", "fio write", fioFmt(doc.Fio))
	for _, s := range doc.Sources {
		fmt.Fprintf(w, "  %-11s %s MiB/s  %s of fio", s.Format, mibFmt(s.MiBPerSec), bench.FormatRatio(s.Ratio))
		if s.RatioMedian > 0 {
			fmt.Fprintf(w, " (median of the rounds' ratios %s)", bench.FormatRatio(s.RatioMedian))
		}
		fmt.Fprintln(w)
	}
	if doc.FioError != "" {
		fmt.Fprintf(w, "  fio: %s\n", doc.FioError)
	}
	return nil
}

// benchPackSources writes the WebDataset shards and the Parquet files
// (one uncompressed without dictionary, one as pyarrow writes by
// default): incompressible sample bytes, size bytes of samples in each.
func benchPackSources(wdsDir, pq, pqSnappy string, size, sampleSize int64) error {
	os.RemoveAll(wdsDir)
	if err := os.MkdirAll(wdsDir, 0o755); err != nil {
		return err
	}
	n := int(max(1, size/sampleSize))
	rng := rand.NewChaCha8([32]byte{7})
	blob := make([]byte, sampleSize)
	const perShard = 2000
	var tw *tar.Writer
	var tf *os.File
	closeShard := func() error {
		if tw == nil {
			return nil
		}
		if err := tw.Close(); err != nil {
			return err
		}
		return tf.Close()
	}
	for i := range n {
		if i%perShard == 0 {
			if err := closeShard(); err != nil {
				return err
			}
			var err error
			if tf, err = os.Create(filepath.Join(wdsDir, fmt.Sprintf("shard-%05d.tar", i/perShard))); err != nil {
				return err
			}
			tw = tar.NewWriter(tf)
		}
		rng.Read(blob)
		meta := fmt.Appendf(nil, `{"key":%d,"label":%d}`, i, i%1000)
		for _, m := range []struct {
			ext string
			b   []byte
		}{{"jpg", blob}, {"json", meta}} {
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("%08d.%s", i, m.ext), Size: int64(len(m.b)), Mode: 0o644}); err != nil {
				return err
			}
			if _, err := tw.Write(m.b); err != nil {
				return err
			}
		}
	}
	if err := closeShard(); err != nil {
		return err
	}
	plain := parquet.NewWriterProperties(parquet.WithMaxRowGroupLength(1000), parquet.WithDictionaryDefault(false))
	if err := benchPackParquet(pq, n, blob, rng, plain); err != nil {
		return err
	}
	// pyarrow's defaults (snappy, dictionary pages tried first), as most
	// Hugging Face files are written.
	snappy := parquet.NewWriterProperties(parquet.WithMaxRowGroupLength(1000), parquet.WithCompression(compress.Codecs.Snappy))
	return benchPackParquet(pqSnappy, n, blob, rng, snappy)
}

// benchPackParquet writes n values of len(blob) random bytes as the
// binary column "image" of the Parquet file path.
func benchPackParquet(path string, n int, blob []byte, rng *rand.ChaCha8, props *parquet.WriterProperties) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := arrow.NewSchema([]arrow.Field{{Name: "image", Type: arrow.BinaryTypes.Binary}}, nil)
	pw, err := pqarrow.NewFileWriter(sc, f, props, pqarrow.DefaultWriterProps())
	if err != nil {
		return err
	}
	b := array.NewBinaryBuilder(memory.DefaultAllocator, arrow.BinaryTypes.Binary)
	for i := 0; i < n; i += 1000 {
		for j := i; j < min(n, i+1000); j++ {
			rng.Read(blob)
			b.Append(blob)
		}
		col := b.NewArray()
		rec := array.NewRecordBatch(sc, []arrow.Array{col}, int64(col.Len()))
		err := pw.Write(rec)
		rec.Release()
		col.Release()
		if err != nil {
			return err
		}
	}
	return pw.Close()
}
