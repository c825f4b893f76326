package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/fuse"
)

func init() { registerBench(newBenchFSCmd) }

// benchFSDir is the directory the benchmark creates on each side.
const benchFSDir = "ffkit-bench-fs"

// 3FS's published FUSE/device ratios for the rows where they are below 1
// (from its own tests, the reference): the rows ffkit must beat.
// Keyed by rw/block size/threads/queue depth.
var threeFSFUSERatio = map[string]float64{
	"read/131072/1/1":     0.42, // 128 KiB sequential read, one thread
	"randread/4096/1/128": 0.09, // 4 KiB random read at queue depth 128
}

// fsSide is one column of a row: one way of reaching storage.
type fsSide struct {
	MiBPerSec float64 `json:"mib_s"`
	IOPS      float64 `json:"iops"`
	// NaiveSumMiBPerSec is the sum of per-thread rates (native rows; fio
	// reports only its group figure: total bytes over the longest job).
	NaiveSumMiBPerSec float64 `json:"naive_sum_mib_s,omitempty"`
	Bytes             int64   `json:"bytes"`
	Seconds           float64 `json:"seconds"`
	P50US             float64 `json:"p50_us,omitempty"`
	P99US             float64 `json:"p99_us,omitempty"`
	Engine            string  `json:"engine,omitempty"`
	// RequestsPerBatch and BytesPerRequest describe the native client's
	// batched reads: storage requests per ReadBatch call and bytes per
	// storage request (cluster only).
	RequestsPerBatch float64 `json:"requests_per_batch,omitempty"`
	BytesPerRequest  float64 `json:"bytes_per_request,omitempty"`
	// LocalShare is the part of those bytes read by short-circuit reads
	// of chunk files on this host (client.Options.NoLocalReads).
	LocalShare float64 `json:"local_share"`
	Cache      string  `json:"cache,omitempty"`
	Error      string  `json:"error,omitempty"`
}

type fsRow struct {
	Test      string  `json:"test"`
	RW        string  `json:"rw"`
	BlockSize int64   `json:"block_size"`
	Threads   int     `json:"threads"`
	IODepth   int     `json:"iodepth"`
	Device    *fsSide `json:"device,omitempty"`
	FUSE      *fsSide `json:"fuse,omitempty"`
	Native    *fsSide `json:"native,omitempty"`
	// Ratios are ours / device (IOPS for 4 KiB random rows, MiB/s otherwise).
	FUSERatio    float64 `json:"fuse_ratio,omitempty"`
	NativeRatio  float64 `json:"native_ratio,omitempty"`
	ThreeFSRatio float64 `json:"threefs_fuse_ratio,omitempty"`
}

type fsBenchReport struct {
	LocalDir string   `json:"local_dir"`
	Mount    string   `json:"mount,omitempty"`
	Cluster  string   `json:"cluster,omitempty"`
	Size     int64    `json:"size"`
	Duration string   `json:"duration"`
	Rows     []*fsRow `json:"rows"`
	Notes    []string `json:"notes"`
}

func newBenchFSCmd() *cobra.Command {
	var (
		localDir, cluster, mount, sizeStr, threadsStr, rowsStr string
		duration                                               time.Duration
		keep, buffered                                         bool
	)
	c := &cobra.Command{
		Use:   "fs",
		Short: "The 3FS test matrix on the local disk, through the FUSE mount and through the native client, in one run",
		Long: `Runs the 3FS test matrix: 128 KiB and 4 MiB sequential reads and writes with
1 and N threads, and 4 KiB random reads and writes at queue depth 128, on the
local disk (fio, O_DIRECT: the device baseline, measured before and after
the other columns, the better figure kept), through a FUSE mount (fio on
--mount, O_DIRECT) and through the native client (--cluster, the batched
read path; 4 KiB random reads as 4 batches of 32 outstanding), and prints "device | ffkit FUSE | ffkit native | ratio" with MiB/s
and IOPS for each row. Rows without --mount have no FUSE column, rows
without --cluster no native column.

Each read row reads every byte at most once (threads read disjoint slices;
random rows stop after one file's worth of requests or --duration), and the
page cache is dropped before every FUSE and native read row (root), so all
three columns are cold; the device column uses O_DIRECT. Many-thread rows
report the aggregate: total bytes over the span from the first thread's start
to the last one's end (fio's group figure); native rows also report the naive
sum of per-thread rates. The benchmark writes about 4 x --size per column
per write row; its files are removed at the end unless --keep.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			size, err := bench.ParseSize(sizeStr)
			if err != nil {
				return usageError{err}
			}
			if size < 1<<20 {
				return usagef("--size %s: at least 1M", sizeStr)
			}
			size = size &^ (4<<20 - 1)
			if size == 0 {
				size = 4 << 20
			}
			threads, err := bench.ParseInts(threadsStr)
			if err != nil {
				return usageError{err}
			}
			if duration <= 0 {
				return usagef("--duration %v: must be positive", duration)
			}
			if !bench.FioAvailable() {
				return fmt.Errorf("%w: the device and FUSE columns run fio (scripts/setup.sh installs it)", bench.ErrNoFio)
			}
			b := &fsBench{size: size, duration: duration, keep: keep, direct: !buffered, rows: map[string]bool{}}
			for _, r := range strings.Split(rowsStr, ",") {
				switch r = strings.TrimSpace(r); r {
				case "read", "write", "randread", "randwrite":
					b.rows[r] = true
				default:
					return usagef("--rows: %q is not one of read, write, randread, randwrite", r)
				}
			}
			if localDir == "" {
				localDir = filepath.Join(os.TempDir(), benchFSDir)
			}
			b.devDir = localDir
			if err := os.MkdirAll(b.devDir, 0o755); err != nil {
				return fmt.Errorf("--local-dir: %w", err)
			}
			if mount != "" {
				abs, err := filepath.Abs(mount)
				if err != nil {
					return usagef("--mount %s: %v", mount, err)
				}
				if !fuse.IsMounted(abs) {
					return usagef("--mount %s is not a FUSE mount (start one with 'ffkit fs mount SOURCE %s')", mount, mount)
				}
				b.fuseDir = filepath.Join(abs, benchFSDir)
				if err := os.MkdirAll(b.fuseDir, 0o755); err != nil {
					return fmt.Errorf("--mount: %w", err)
				}
			}
			if cluster != "" {
				// A local directory is accepted too (the native column is
				// then the local fs.FS), to check the benchmark without a cluster.
				f, p, err := fs.Resolve(ctx, cluster)
				if err != nil {
					return err
				}
				b.native, b.nativeDir = f, path.Join(p, benchFSDir)
				if err := f.MkdirAll(ctx, b.nativeDir); err != nil {
					return fmt.Errorf("--cluster: %w", err)
				}
			}
			rep := &fsBenchReport{LocalDir: localDir, Mount: mount, Cluster: cluster, Size: size, Duration: duration.String()}
			err = b.run(ctx, threads, rep)
			if cerr := b.cleanup(ctx); err == nil && cerr != nil {
				warnf("cleanup: %v", cerr)
			}
			if err != nil {
				return err
			}
			if jsonOut {
				return printJSON(rep)
			}
			return printFSBench(rep)
		},
	}
	f := c.Flags()
	f.StringVar(&localDir, "local-dir", "", "directory on the local disk for the device baseline (default $TMPDIR/"+benchFSDir+")")
	f.StringVar(&cluster, "cluster", "", "ffkit://HOST:PORT[/path]: measure the native client (batched reads)")
	f.StringVar(&mount, "mount", "", "a FUSE mount ('ffkit fs mount'): measure through it")
	f.StringVar(&sizeStr, "size", "1G", "bytes per test file (rounded down to 4 MiB)")
	f.DurationVar(&duration, "duration", 10*time.Second, "longest time of one measurement")
	f.StringVar(&threadsStr, "threads", "1,16", "thread counts of the sequential rows")
	f.BoolVar(&keep, "keep", false, "keep the benchmark's files")
	f.BoolVar(&buffered, "buffered", false, "run fio without O_DIRECT on the device and the mount (the page cache is dropped before every read row), as ordinary programs read")
	f.StringVar(&rowsStr, "rows", "read,write,randread,randwrite", "which kinds of rows to run")
	return c
}

type fsBench struct {
	size     int64
	duration time.Duration
	keep     bool
	direct   bool            // fio with O_DIRECT (else buffered, caches dropped before reads)
	rows     map[string]bool // kinds of rows to run (fio rw names)

	devDir  string
	fuseDir string // "" without --mount
	native  fs.FS  // nil without --cluster
	// nativeDir is the benchmark directory inside native.
	nativeDir string
}

const readFile = "read.dat"

// nativeBatches is how many ReadBatch calls the native random-read row
// keeps outstanding (together carrying the queue depth).
const nativeBatches = 4

func (b *fsBench) run(ctx context.Context, threads []int, rep *fsBenchReport) error {
	type spec struct {
		test, rw string
		bs       int64
		threads  int
		depth    int
	}
	var specs []spec
	for _, bs := range []int64{128 << 10, 4 << 20} {
		for _, rw := range []string{"read", "write"} {
			for _, t := range threads {
				specs = append(specs, spec{"seq " + rw + " " + bench.FormatSize(bs) + "iB", rw, bs, t, 1})
			}
		}
	}
	specs = append(specs, spec{"rand read 4KiB", "randread", 4 << 10, 1, 128},
		spec{"rand write 4KiB", "randwrite", 4 << 10, 1, 128})

	// The read file on each side, written once and flushed to storage.
	fmt.Fprintf(os.Stderr, "bench fs: writing the %s read file on each side\n", bench.FormatBytes(b.size))
	if err := writeLocalFile(filepath.Join(b.devDir, readFile), b.size); err != nil {
		return fmt.Errorf("device read file: %w", err)
	}
	if b.fuseDir != "" {
		if err := writeLocalFile(filepath.Join(b.fuseDir, readFile), b.size); err != nil {
			return fmt.Errorf("read file through the mount: %w", err)
		}
	}
	if b.native != nil {
		if err := b.writeNativeFile(ctx, path.Join(b.nativeDir, readFile)); err != nil {
			return fmt.Errorf("native read file: %w", err)
		}
	}
	for _, s := range specs {
		if !b.rows[s.rw] {
			continue
		}
		row := &fsRow{Test: s.test, RW: s.rw, BlockSize: s.bs, Threads: s.threads, IODepth: s.depth}
		fmt.Fprintf(os.Stderr, "bench fs: %s, %d thread(s), depth %d\n", s.test, s.threads, s.depth)
		// Write back what earlier rows left dirty (on every side) so that
		// no column pays for another's writeback.
		unix.Sync()
		row.Device = b.fioSide(ctx, b.devDir, s.rw, s.bs, s.threads, s.depth, false)
		if b.fuseDir != "" {
			row.FUSE = b.fioSide(ctx, b.fuseDir, s.rw, s.bs, s.threads, s.depth, true)
		}
		if b.native != nil {
			row.Native = b.nativeSide(ctx, s.rw, s.bs, s.threads, s.depth)
		}
		// The shared disk is noisy: measure the device again after ours
		// and keep its better figure, so a slow baseline never flatters us.
		unix.Sync()
		if again := b.fioSide(ctx, b.devDir, s.rw, s.bs, s.threads, s.depth, false); again.Error == "" &&
			(row.Device.Error != "" || again.MiBPerSec > row.Device.MiBPerSec) {
			row.Device = again
		}
		ratio := func(o *fsSide) float64 {
			if o == nil || o.Error != "" || row.Device.Error != "" {
				return 0
			}
			if s.bs == 4<<10 && row.Device.IOPS > 0 {
				return o.IOPS / row.Device.IOPS
			}
			if row.Device.MiBPerSec > 0 {
				return o.MiBPerSec / row.Device.MiBPerSec
			}
			return 0
		}
		row.FUSERatio, row.NativeRatio = ratio(row.FUSE), ratio(row.Native)
		key := fmt.Sprintf("%s/%d/%d/%d", s.rw, s.bs, s.threads, s.depth)
		row.ThreeFSRatio = threeFSFUSERatio[key]
		rep.Rows = append(rep.Rows, row)
	}
	mode := "O_DIRECT"
	if !b.direct {
		mode = "buffered I/O (page cache dropped before every read row of every column)"
	}
	rep.Notes = append(rep.Notes,
		"device: fio with "+mode+" on --local-dir, measured before and after the other columns, the better figure kept; FUSE: fio with "+mode+" on the mount, page cache dropped before each read row; native: the fs client (reads: ReadBatch; 4 KiB random: 4 batches of 32 outstanding = depth 128), page cache dropped before each read row",
		"sequential rows with N threads: each thread reads or writes its own 1/N of --size; aggregate = total bytes / (last end - first start)",
		"ratio = ours / device (IOPS for the 4 KiB rows, MiB/s otherwise); 3FS = 3FS's published FUSE/device ratio where it is below 1")
	return nil
}

// coldRead drops the page cache before a read row of the FUSE or native
// column; it returns the cache state to report.
func coldRead(direct bool) string {
	if err := bench.DropCaches(); err != nil {
		if direct {
			return string(bench.CacheDirect) + "; could not drop the page cache: " + err.Error()
		}
		return string(bench.CacheWarm) + ": " + err.Error()
	}
	if direct {
		return "O_DIRECT; page cache dropped"
	}
	return string(bench.CacheDropped)
}

func (b *fsBench) fioSide(ctx context.Context, dir, rw string, bs int64, threads, depth int, viaFUSE bool) *fsSide {
	side := &fsSide{Cache: string(bench.CacheDirect)}
	if !b.direct {
		side.Cache = string(bench.CacheWarm)
	}
	job := bench.FioJob{Name: "ffkit", RW: rw, BlockSize: bs, NumJobs: threads, IODepth: depth, Direct: b.direct,
		IOEngine: "psync", Extra: []string{"--runtime=" + strconv.FormatInt(b.duration.Milliseconds(), 10) + "ms"}}
	if depth > 1 {
		job.IOEngine = "libaio"
	}
	slice := b.size / int64(threads) &^ (bs - 1)
	if slice < bs {
		slice = bs
	}
	switch rw {
	case "read", "randread":
		job.Filenames = []string{filepath.Join(dir, readFile)}
		job.Size = slice
		if threads > 1 {
			job.Extra = append(job.Extra, "--offset_increment="+strconv.FormatInt(slice, 10))
		}
		if viaFUSE || !b.direct {
			side.Cache = coldRead(b.direct)
		}
	case "write":
		job.Directory = dir
		job.Size = slice
		job.EndFsync = true
	case "randwrite":
		job.Filenames = []string{filepath.Join(dir, readFile)}
		job.Size = b.size
		job.EndFsync = true
	}
	res, err := bench.RunFio(ctx, job)
	if rw == "write" {
		for j := range threads {
			os.Remove(filepath.Join(dir, fmt.Sprintf("ffkit.%d.0", j)))
		}
	}
	if err != nil {
		side.Error = err.Error()
		return side
	}
	s := res.Side(rw)
	side.MiBPerSec, side.IOPS, side.Bytes = s.MiBPerSec, s.IOPS, s.Bytes
	if s.BytesPerSec > 0 {
		side.Seconds = float64(s.Bytes) / s.BytesPerSec
	}
	side.P50US, side.P99US = s.Latency.P50US, s.Latency.P99US
	side.Engine = "fio " + res.Engine
	return side
}

func (b *fsBench) nativeSide(ctx context.Context, rw string, bs int64, threads, depth int) *fsSide {
	side := &fsSide{Engine: "ffkit client"}
	cs, hasStats := b.native.(interface{ Chunks() *client.Client })
	var before client.ReadStats
	if hasStats {
		before = cs.Chunks().ReadStats()
	}
	res, err := b.nativeRun(ctx, side, rw, bs, threads, depth)
	if err != nil {
		side.Error = err.Error()
		return side
	}
	if hasStats && (rw == "read" || rw == "randread") {
		d := cs.Chunks().ReadStats().Sub(before)
		side.RequestsPerBatch, side.BytesPerRequest = d.RequestsPerCall(), d.BytesPerRequest()
		side.LocalShare = float64(d.LocalBytes) / float64(max(d.Bytes, 1))
	}
	side.MiBPerSec, side.Bytes, side.Seconds = res.MiBPerSec, res.Bytes, res.Seconds
	side.IOPS = res.BytesPerSec / float64(bs)
	side.NaiveSumMiBPerSec = res.NaiveSumMiBPerSec
	side.P50US, side.P99US = res.Latency.P50US, res.Latency.P99US
	return side
}

func (b *fsBench) nativeRun(ctx context.Context, side *fsSide, rw string, bs int64, threads, depth int) (*bench.Result, error) {
	slice := max(b.size/int64(threads)&^(bs-1), bs)
	count := slice / bs
	opts := bench.Options{Workers: threads, Count: count, Duration: b.duration}
	name := path.Join(b.nativeDir, readFile)
	switch rw {
	case "read", "randread":
		side.Cache = coldRead(false)
		f, err := b.native.Open(ctx, name, fs.OpenOptions{})
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if rw == "read" {
			bufs := make([][]byte, threads)
			for i := range bufs {
				bufs[i] = make([]byte, bs)
			}
			return bench.Run(ctx, opts, func(ctx context.Context, w int, seq int64) (int64, error) {
				off := int64(w)*slice + seq%count*bs
				return bs, b.native.ReadBatch(ctx, []fs.ReadRequest{{File: f, Off: off, Buf: bufs[w]}})
			})
		}
		// Random 4 KiB reads through the batched path, depth in flight:
		// nativeBatches workers each keep one ReadBatch of depth/nativeBatches
		// reads outstanding (so the storage services always have work queued
		// while a batch's replies come back). The blocks are a random
		// permutation, each read once, as fio's random map does: a block
		// read twice would come from the storage's page cache.
		blocks := b.size / bs
		workers := min(nativeBatches, depth)
		per := depth / workers
		opts.Workers = workers
		opts.Count = max(1, blocks/int64(depth))
		order := rand.New(rand.NewPCG(1, 2)).Perm(int(blocks))
		bufs := make([][]byte, workers)
		reqs := make([][]fs.ReadRequest, workers)
		for w := range workers {
			bufs[w] = make([]byte, int64(per)*bs)
			reqs[w] = make([]fs.ReadRequest, per)
		}
		return bench.Run(ctx, opts, func(ctx context.Context, w int, seq int64) (int64, error) {
			next := (int64(w)*opts.Count + seq) * int64(per)
			for i := range reqs[w] {
				blk := int64(order[(next+int64(i))%blocks])
				reqs[w][i] = fs.ReadRequest{File: f, Off: blk * bs, Buf: bufs[w][int64(i)*bs : int64(i+1)*bs]}
			}
			return int64(per) * bs, b.native.ReadBatch(ctx, reqs[w])
		})
	case "write":
		writers := make([]fs.Writer, threads)
		defer func() {
			for i, w := range writers {
				if w != nil {
					w.Close()
				}
				b.native.Remove(ctx, path.Join(b.nativeDir, fmt.Sprintf("native-w.%d", i)))
			}
		}()
		data := benchPattern(bs)
		opts.Finish = func(ctx context.Context, w int) error {
			if writers[w] == nil {
				return nil
			}
			return writers[w].Commit()
		}
		return bench.Run(ctx, opts, func(ctx context.Context, w int, seq int64) (int64, error) {
			if writers[w] == nil {
				wr, err := b.native.Create(ctx, path.Join(b.nativeDir, fmt.Sprintf("native-w.%d", w)))
				if err != nil {
					return 0, err
				}
				writers[w] = wr
			}
			_, err := writers[w].Write(data)
			return bs, err
		})
	case "randwrite":
		ra, ok := b.native.(fs.RandomAccessFS)
		if !ok {
			return nil, fmt.Errorf("%s cannot write at offsets (no fs.RandomAccessFS)", b.native)
		}
		wf, err := ra.OpenWrite(ctx, name, 0)
		if err != nil {
			return nil, err
		}
		defer wf.Close()
		blocks := b.size / bs
		data := benchPattern(bs)
		opts.Workers = depth // queue depth = writes in flight
		opts.Count = max(1, blocks/int64(depth))
		opts.Finish = func(context.Context, int) error { return wf.Sync() }
		return bench.Run(ctx, opts, func(ctx context.Context, w int, seq int64) (int64, error) {
			off := rand.Int64N(blocks) * bs
			_, err := wf.WriteAt(data, off)
			return bs, err
		})
	}
	return nil, errors.New("unknown rw " + rw)
}

func benchPattern(n int64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(7, uint64(n)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeLocalFile writes size bytes of non-zero data and fsyncs them.
func writeLocalFile(name string, size int64) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	data := benchPattern(1 << 20)
	for off := int64(0); off < size; off += int64(len(data)) {
		if _, err := f.Write(data[:min(int64(len(data)), size-off)]); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (b *fsBench) writeNativeFile(ctx context.Context, name string) error {
	w, err := b.native.Create(ctx, name)
	if err != nil {
		return err
	}
	data := benchPattern(1 << 20)
	for off := int64(0); off < b.size; off += int64(len(data)) {
		if _, err := w.Write(data[:min(int64(len(data)), b.size-off)]); err != nil {
			w.Close()
			return err
		}
	}
	return w.Commit()
}

func (b *fsBench) cleanup(ctx context.Context) error {
	if b.keep {
		return nil
	}
	var errs []error
	errs = append(errs, os.RemoveAll(filepath.Join(b.devDir, readFile)))
	if b.fuseDir != "" {
		errs = append(errs, os.RemoveAll(b.fuseDir))
	}
	if b.native != nil {
		if err := b.native.Remove(ctx, path.Join(b.nativeDir, readFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		b.native.Remove(ctx, b.nativeDir)
	}
	return errors.Join(errs...)
}

func printFSBench(rep *fsBenchReport) error {
	t := &bench.Table{
		Title: fmt.Sprintf("ffkit bench fs: %s per file, at most %s per measurement", bench.FormatBytes(rep.Size), rep.Duration),
		Header: []string{"test", "threads", "depth", "device MiB/s", "device IOPS", "FUSE MiB/s", "FUSE IOPS",
			"native MiB/s", "native IOPS", "FUSE ratio", "native ratio", "3FS FUSE ratio"},
	}
	cell := func(s *fsSide, iops bool) string {
		switch {
		case s == nil:
			return "-"
		case s.Error != "":
			return "error"
		case iops:
			return strconv.FormatFloat(s.IOPS, 'f', 0, 64)
		}
		return strconv.FormatFloat(s.MiBPerSec, 'f', 1, 64)
	}
	ratio := func(r float64) string {
		if r == 0 {
			return "-"
		}
		return strconv.FormatFloat(r, 'f', 2, 64) + "x"
	}
	for _, r := range rep.Rows {
		t.AddRow(r.Test, strconv.Itoa(r.Threads), strconv.Itoa(r.IODepth),
			cell(r.Device, false), cell(r.Device, true), cell(r.FUSE, false), cell(r.FUSE, true),
			cell(r.Native, false), cell(r.Native, true), ratio(r.FUSERatio), ratio(r.NativeRatio), ratio(r.ThreeFSRatio))
	}
	t.Notes = rep.Notes
	for _, r := range rep.Rows {
		for name, s := range map[string]*fsSide{"device": r.Device, "FUSE": r.FUSE, "native": r.Native} {
			if s != nil && s.Error != "" {
				t.Notes = append(t.Notes, fmt.Sprintf("%s, %d thread(s), %s: %s", r.Test, r.Threads, name, s.Error))
			}
		}
		if r.Native != nil && r.Native.RequestsPerBatch > 0 {
			t.Notes = append(t.Notes, fmt.Sprintf("%s, %d thread(s), native: %.1f storage requests per ReadBatch, %s per request, %.0f%% of the bytes read locally (short-circuit)",
				r.Test, r.Threads, r.Native.RequestsPerBatch, bench.FormatBytes(int64(r.Native.BytesPerRequest)), 100*r.Native.LocalShare))
		}
		if r.Native != nil && r.Native.Error == "" && r.Threads > 1 {
			t.Notes = append(t.Notes, fmt.Sprintf("%s, %d threads, native: aggregate %.1f MiB/s, naive sum of per-thread rates %.1f MiB/s",
				r.Test, r.Threads, r.Native.MiBPerSec, r.Native.NaiveSumMiBPerSec))
		}
	}
	return t.Write(human())
}
