package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/fs/fuse"
)

func init() { registerBench(newBenchDLIOCmd) }

// benchDLIODir is the directory the benchmark creates on each side.
const benchDLIODir = "ffkit-bench-dlio"

// dlioOpts are the flags of `bench dlio`.
type dlioOpts struct {
	localDir, mount string
	files           int
	fileSize        int64
	threads         int
	runs            int
	compute         time.Duration
	keep            bool
}

// dlioSide is one workload on one side in one run.
type dlioSide struct {
	Seconds      float64 `json:"seconds"`
	SamplesPerS  float64 `json:"samples_s"`
	MiBPerSecond float64 `json:"mib_s"`
}

// dlioRow is one workload: every run on each side, the medians and their ratio.
type dlioRow struct {
	Workload string     `json:"workload"`
	Local    []dlioSide `json:"local"`
	Mount    []dlioSide `json:"mount"`
	// LocalMedian and MountMedian are the medians of samples/s.
	LocalMedian float64 `json:"local_median_samples_s"`
	MountMedian float64 `json:"mount_median_samples_s"`
	Ratio       float64 `json:"ratio"` // mount / local
}

type dlioReport struct {
	LocalDir string     `json:"local_dir"`
	Mount    string     `json:"mount"`
	Files    int        `json:"files"`
	FileSize int64      `json:"file_size"`
	Threads  int        `json:"threads"`
	Runs     int        `json:"runs"`
	Compute  string     `json:"compute_per_sample"`
	Cache    string     `json:"cache"`
	Rows     []*dlioRow `json:"rows"`
	Notes    []string   `json:"notes"`
}

func newBenchDLIOCmd() *cobra.Command {
	var (
		o                  dlioOpts
		fileSize, computeS string
	)
	c := &cobra.Command{
		Use:   "dlio",
		Short: "Replay DLIO's unet3d read pattern (and a cold cat) on a FUSE mount and on the local disk, in one run",
		Long: `Replays the reads of DLIO (the engine of MLPerf Storage) running its unet3d
workload: --files npz files of --file-size, read in a shuffled order by
--threads reader threads, each file the way np.load reads it (1 MiB from the
start, the last 64 KiB, then the whole file again from the start, in 1 MiB
reads), the samples consumed by a training loop that spends --compute on
each. A second workload reads every file once in listing order with one
thread, 128 KiB at a time, as 'cat' does.

The same files are written on the local disk (--local-dir) and through the
mount (--mount, a mount made by 'ffkit fs mount'); each run measures both
sides, in alternating order, with the page cache dropped before each
measurement (root; else the local files are evicted and the mount's are
read as they are, which the output says). It prints the samples/s and MiB/s
of each side, medians over --runs, and mount / local. The bytes read
through the mount are checked against the local copies once at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.fileSize, err = bench.ParseSize(fileSize); err != nil {
				return usageError{err}
			}
			if o.fileSize < 2<<20 {
				return usagef("--file-size %s: at least 2M (the pattern reads 1 MiB, then the tail)", fileSize)
			}
			if o.files < 1 || o.threads < 1 || o.runs < 1 {
				return usagef("--files, --threads and --runs must be at least 1")
			}
			if o.mount == "" {
				return usagef("--mount is required (start one with 'ffkit fs mount SOURCE MOUNTPOINT')")
			}
			abs, err := filepath.Abs(o.mount)
			if err != nil {
				return usagef("--mount %s: %v", o.mount, err)
			}
			if !fuse.IsMounted(abs) {
				return usagef("--mount %s is not a FUSE mount (start one with 'ffkit fs mount SOURCE %s')", o.mount, o.mount)
			}
			o.mount = abs
			if computeS != "" {
				if o.compute, err = time.ParseDuration(computeS); err != nil || o.compute < 0 {
					return usagef("--compute %s: not a duration >= 0", computeS)
				}
			}
			if o.localDir == "" {
				o.localDir = os.TempDir()
			}
			rep, err := runDLIO(cmd.Context(), o)
			if err != nil {
				return err
			}
			if jsonOut {
				return printJSON(rep)
			}
			return printDLIO(rep)
		},
	}
	f := c.Flags()
	f.StringVar(&o.localDir, "local-dir", "", "directory on the local disk for the baseline (default $TMPDIR); the files go in "+benchDLIODir+"/ under it")
	f.StringVar(&o.mount, "mount", "", "a FUSE mount ('ffkit fs mount'); the files go in "+benchDLIODir+"/ under it")
	f.IntVar(&o.files, "files", 168, "number of files (unet3d: 168)")
	f.StringVar(&fileSize, "file-size", "4M", "size of each file")
	f.IntVar(&o.threads, "threads", 2, "reader threads of the unet3d workload")
	f.IntVar(&o.runs, "runs", 3, "runs; each measures both sides, and the medians are printed")
	f.StringVar(&computeS, "compute", "0s", "compute time the training loop spends on each sample (0: read as fast as possible)")
	f.BoolVar(&o.keep, "keep", false, "keep the files (a later run with the same --files and --file-size reuses them)")
	return c
}

// dlioWorkload reads the files once and returns the samples read.
type dlioWorkload struct {
	name string
	run  func(ctx context.Context, dir string, names []string, o dlioOpts, seed uint64) error
}

func runDLIO(ctx context.Context, o dlioOpts) (*dlioReport, error) {
	localDir := filepath.Join(o.localDir, benchDLIODir)
	mountDir := filepath.Join(o.mount, benchDLIODir)
	names := make([]string, o.files)
	for i := range names {
		names[i] = fmt.Sprintf("img_%04d_of_%04d.npz", i, o.files)
	}
	fmt.Fprintf(os.Stderr, "bench dlio: writing %d files of %s on each side\n", o.files, bench.FormatBytes(o.fileSize))
	for _, d := range []string{localDir, mountDir} {
		if err := writeDLIOFiles(d, names, o.fileSize); err != nil {
			return nil, err
		}
	}
	if !o.keep {
		defer func() {
			for _, d := range []string{localDir, mountDir} {
				if err := os.RemoveAll(d); err != nil {
					warnf("cleanup %s: %v", d, err)
				}
			}
		}()
	}
	rep := &dlioReport{LocalDir: localDir, Mount: mountDir, Files: o.files, FileSize: o.fileSize,
		Threads: o.threads, Runs: o.runs, Compute: o.compute.String()}
	workloads := []dlioWorkload{
		{fmt.Sprintf("unet3d (np.load pattern, %d threads)", o.threads), dlioUnet3d},
		{"cold cat (listing order, 1 thread, 128 KiB reads)", dlioCat},
	}
	cache := ""
	for _, w := range workloads {
		row := &dlioRow{Workload: w.name}
		for run := range o.runs {
			// Alternate which side goes first, so that neither always
			// meets the disk after the other's writeback or cache drop.
			sides := []string{localDir, mountDir}
			if run%2 == 1 {
				sides = []string{mountDir, localDir}
			}
			for _, dir := range sides {
				state := dlioCold(dir == localDir, dir, names)
				if cache == "" || (dir == mountDir && state != string(bench.CacheDropped)) {
					cache = state
				}
				fmt.Fprintf(os.Stderr, "bench dlio: run %d, %s, %s\n", run+1, w.name, dir)
				start := time.Now()
				if err := w.run(ctx, dir, names, o, uint64(run)); err != nil {
					return nil, err
				}
				secs := time.Since(start).Seconds()
				side := dlioSide{Seconds: secs, SamplesPerS: float64(o.files) / secs,
					MiBPerSecond: float64(o.files) * float64(o.fileSize) / (1 << 20) / secs}
				if dir == localDir {
					row.Local = append(row.Local, side)
				} else {
					row.Mount = append(row.Mount, side)
				}
			}
		}
		row.LocalMedian, row.MountMedian = dlioMedian(row.Local), dlioMedian(row.Mount)
		if row.LocalMedian > 0 {
			row.Ratio = row.MountMedian / row.LocalMedian
		}
		rep.Rows = append(rep.Rows, row)
	}
	rep.Cache = cache
	if err := verifyDLIO(localDir, mountDir, names); err != nil {
		return nil, err
	}
	rep.Notes = append(rep.Notes,
		"unet3d: each file read as np.load reads an .npz: 1 MiB at 0, the last 64 KiB, then 0 to the end in 1 MiB reads; files in a shuffled order (the same on both sides) shared by the reader threads; a sample counts when the training loop has consumed it",
		"each side measured in every run, the order alternating; the page cache dropped before each measurement",
		"ratio = mount / local of the median samples/s (MiB/s = samples/s x file size)")
	return rep, nil
}

// dlioCold makes the next reads of one side cold and says how cold.
func dlioCold(local bool, dir string, names []string) string {
	if err := bench.DropCaches(); err == nil {
		return string(bench.CacheDropped)
	}
	if local {
		for _, n := range names {
			bench.EvictFile(filepath.Join(dir, n))
		}
		return string(bench.CacheEvicted)
	}
	// A mount's files cannot be evicted from below: the storage's own
	// cache may serve them.
	return string(bench.CacheWarm) + " on the mount (could not drop the page cache)"
}

func dlioMedian(sides []dlioSide) float64 {
	var v []float64
	for _, s := range sides {
		v = append(v, s.SamplesPerS)
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// writeDLIOFiles writes the files of one side (pseudo-random bytes, the
// same on both sides), keeping those already there at the right size.
func writeDLIOFiles(dir string, names []string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench dlio: %w", err)
	}
	for i, n := range names {
		p := filepath.Join(dir, n)
		if st, err := os.Stat(p); err == nil && st.Size() == size {
			continue
		}
		if err := os.WriteFile(p, dlioData(i, size), 0o644); err != nil {
			return fmt.Errorf("bench dlio: write %s: %w", p, err)
		}
	}
	return nil
}

func dlioData(i int, size int64) []byte {
	b := make([]byte, size)
	r := rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), byte(i >> 16), 'd', 'l', 'i', 'o'})
	r.Read(b)
	return b
}

// dlioUnet3d is DLIO's unet3d training loop: reader threads take files in
// a shuffled order, read each as np.load reads an .npz, and hand the
// samples to the loop, which spends o.compute on each.
func dlioUnet3d(ctx context.Context, dir string, names []string, o dlioOpts, seed uint64) error {
	order := slices.Clone(names)
	rand.New(rand.NewPCG(seed, 0x6469)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	next := make(chan string, len(order))
	for _, n := range order {
		next <- n
	}
	close(next)
	samples := make(chan int64, o.threads) // DLIO's prefetch queue
	g, ctx := errgroup.WithContext(ctx)
	readers, _ := errgroup.WithContext(ctx)
	readers.SetLimit(o.threads)
	g.Go(func() error {
		defer close(samples)
		for range o.threads {
			readers.Go(func() error {
				buf := make([]byte, 1<<20)
				for n := range next {
					got, err := npLoad(filepath.Join(dir, n), buf)
					if err != nil {
						return err
					}
					select {
					case samples <- got:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			})
		}
		return readers.Wait()
	})
	g.Go(func() error {
		for range samples {
			if o.compute > 0 {
				time.Sleep(o.compute)
			}
		}
		return nil
	})
	return g.Wait()
}

// npLoad reads a file as numpy's np.load reads an .npz (a zip): a first
// buffered read at 0, the end of central directory and the directory in
// the tail, then the member from the start to the end.
func npLoad(p string, buf []byte) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, fmt.Errorf("bench dlio: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("bench dlio: %w", err)
	}
	size := st.Size()
	if _, err := f.ReadAt(buf[:min(int64(len(buf)), size)], 0); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("bench dlio: read %s: %w", p, err)
	}
	tail := min(size, 64<<10+22)
	if _, err := f.ReadAt(buf[:tail], size-tail); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("bench dlio: read %s: %w", p, err)
	}
	var total int64
	for off := int64(0); off < size; off += int64(len(buf)) {
		n, err := f.ReadAt(buf, off)
		total += int64(n)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("bench dlio: read %s: %w", p, err)
		}
	}
	return total, nil
}

// dlioCat reads every file once, in listing order, 128 KiB at a time.
func dlioCat(_ context.Context, dir string, names []string, _ dlioOpts, _ uint64) error {
	buf := make([]byte, 128<<10)
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return fmt.Errorf("bench dlio: %w", err)
		}
		_, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
		f.Close()
		if err != nil {
			return fmt.Errorf("bench dlio: read %s: %w", n, err)
		}
	}
	return nil
}

// verifyDLIO checks that the mount's files hold the local copies' bytes.
func verifyDLIO(localDir, mountDir string, names []string) error {
	for _, n := range names {
		a, err := os.ReadFile(filepath.Join(localDir, n))
		if err != nil {
			return fmt.Errorf("bench dlio: verify: %w", err)
		}
		b, err := os.ReadFile(filepath.Join(mountDir, n))
		if err != nil {
			return fmt.Errorf("bench dlio: verify: %w", err)
		}
		if !bytes.Equal(a, b) {
			return fmt.Errorf("bench dlio: verify: %s differs between %s and %s", n, localDir, mountDir)
		}
	}
	return nil
}

func printDLIO(r *dlioReport) error {
	t := bench.Table{
		Title: fmt.Sprintf("bench dlio: %d files of %s, compute %s per sample, %d runs; %s",
			r.Files, bench.FormatBytes(r.FileSize), r.Compute, r.Runs, r.Cache),
		Header: []string{"workload", "local samples/s", "local MiB/s", "mount samples/s", "mount MiB/s", "mount/local", "runs local | mount (samples/s)"},
		Notes:  r.Notes,
	}
	mib := float64(r.FileSize) / (1 << 20)
	for _, row := range r.Rows {
		runs := ""
		for i, s := range row.Local {
			if i > 0 {
				runs += " "
			}
			runs += bench.FormatFloat(s.SamplesPerS, 1)
		}
		runs += " |"
		for _, s := range row.Mount {
			runs += " " + bench.FormatFloat(s.SamplesPerS, 1)
		}
		t.AddRow(row.Workload, bench.FormatFloat(row.LocalMedian, 1), bench.FormatFloat(row.LocalMedian*mib, 0),
			bench.FormatFloat(row.MountMedian, 1), bench.FormatFloat(row.MountMedian*mib, 0),
			bench.FormatRatio(row.Ratio), runs)
	}
	return t.Write(os.Stdout)
}
