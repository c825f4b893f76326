package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/pack"
)

func init() { register(newPackCmd) }

type packFlags struct {
	out         string
	shardSize   string
	format      string
	column      string
	workers     int
	indexFormat string
	align       int64
	force       bool
	clean       bool
	progress    bool
	cpuProfile  string
}

func newPackCmd() *cobra.Command {
	var f packFlags
	c := &cobra.Command{
		Use:   "pack SRC -o OUT",
		Short: "Pack a directory, JSON Lines, tar, WebDataset, Parquet or Arrow source into FFRecord",
		Long: `Pack samples into FFRecord files (see docs/pack.md).

SRC (a local path or an ffkit:// URL) is one of:
  a directory      each regular file is one sample, in sorted relative-path order
  a JSON Lines     each non-empty line is one sample (its bytes, without the newline)
  a tar archive    each regular member is one sample, in archive order
  a gzip tar       the same, for .tar.gz / .tgz
  WebDataset       --format webdataset: a tar (or gzip tar) shard or a directory of
                   them; members sharing a key (000123.jpg, 000123.json) are one
                   sample, stored as the documented FFWD container
  Parquet, Arrow   one sample per row: the bytes of --column, or the row as JSON

--format auto names the format from SRC's name or first bytes.

OUT ending in .ffr is one file, byte-identical to what the reference FFRecord
writer produces for the same samples in the same order. Any other OUT is a
directory of shards PART_00000.ffr, PART_00001.ffr, ... rolled at --shard-size,
whose data starts on a 4 KiB boundary (--align 0 for the reference's layout).
The shards and the index are written into a hidden staging directory beside
OUT and published with one rename: a killed pack leaves the old dataset or
nothing at OUT, never a part. --force replaces an existing dataset the same
way; --clean (with -o OUT and no SRC) removes what killed packs left.

A sidecar index maps each sample to its source name: OUT.index.jsonl next to a
.ffr file, or OUT/index.jsonl in a directory (--index-format csv for CSV).
The same inputs always give the same bytes. A progress bar is drawn when
stderr is a terminal.`,
		Example: `  ffkit pack images/ -o train.ffr
  ffkit pack corpus.jsonl -o corpus/ --shard-size 64M
  ffkit pack shards/ --format webdataset -o ffkit://127.0.0.1:9000/ds
  ffkit pack train.parquet --column image -o ds --json
  ffkit pack --clean -o ds`,
		Args: func(cmd *cobra.Command, args []string) error {
			if f.clean {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.clean {
				return runPackClean(cmd.Context(), f.out)
			}
			return runPack(cmd.Context(), args[0], f, cmd.Flags().Changed("shard-size"), cmd.Flags().Changed("align"))
		},
	}
	c.Flags().StringVarP(&f.out, "output", "o", "", "output: a .ffr file, or a directory of shards (required)")
	c.Flags().StringVar(&f.shardSize, "shard-size", "256M", "target shard size for directory output (K, M, G suffixes)")
	c.Flags().StringVar(&f.format, "format", "auto", "source format: auto, "+strings.Join(pack.Formats, ", "))
	c.Flags().StringVar(&f.column, "column", "", "Parquet/Arrow: the binary or string column whose bytes are the samples (default: whole rows as JSON)")
	c.Flags().IntVar(&f.workers, "workers", 8, "samples read at once, each straight into its place in the output")
	c.Flags().StringVar(&f.indexFormat, "index-format", "jsonl", "sidecar index format: jsonl or csv")
	c.Flags().Int64Var(&f.align, "align", 0, "start each file's data at a multiple of this many bytes (a power of two), so page-sized samples are each one O_DIRECT page read; 0 = the reference's layout (default: 0 for a .ffr file, 4096 for shards)")
	c.Flags().Lookup("align").DefValue = "auto"
	c.Flags().BoolVar(&f.force, "force", false, "replace an existing output (a dataset directory is replaced in one step)")
	c.Flags().BoolVar(&f.clean, "clean", false, "remove what killed packs left beside -o OUT (staging directories), restoring a dataset set aside; takes no SRC")
	c.Flags().BoolVar(&f.progress, "progress-lines", false, "print 'progress SAMPLES BYTES' lines on stderr (for programs: Python's ffkit.pack)")
	c.Flags().MarkHidden("progress-lines")
	c.Flags().StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile here")
	c.Flags().MarkHidden("cpuprofile")
	c.MarkFlagRequired("output")
	return c
}

// packResult is pack's --json output.
type packResult = pack.Result

func runPack(ctx context.Context, src string, f packFlags, shardSizeSet, alignSet bool) error {
	if f.workers <= 0 {
		return usagef("--workers must be positive, got %d", f.workers)
	}
	if f.indexFormat != "jsonl" && f.indexFormat != "csv" {
		return usagef("--index-format must be jsonl or csv, got %q", f.indexFormat)
	}
	align := int64(pack.AlignAuto)
	if alignSet {
		if err := (ffrecord.WriterOptions{Align: f.align}).Validate(); err != nil {
			return usagef("--align %d: want 0 or a power of two up to 1 GiB", f.align)
		}
		align = f.align
	}
	single := strings.HasSuffix(f.out, ".ffr")
	target, err := bench.ParseSize(f.shardSize)
	if err != nil || target <= 0 {
		return usagef("--shard-size %q: want a positive size such as 256M", f.shardSize)
	}
	if single && shardSizeSet {
		return usagef("--shard-size applies to directory output; %s is one .ffr file", f.out)
	}
	if err := checkURL(f.out, "-o"); err != nil {
		return err
	}
	if err := checkURL(src, "SRC"); err != nil {
		return err
	}
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return err
		}
		defer pf.Close()
		pprof.StartCPUProfile(pf)
		defer pprof.StopCPUProfile()
	}
	if step := os.Getenv("FFKIT_PACK_STOP_AT"); step != "" {
		// For tests: stop this process (SIGSTOP) after a publish step and
		// go no further, so that a test can SIGKILL it exactly there. (The
		// stop can reach this thread after other threads: the sleep keeps
		// it from running on meanwhile.)
		ffrecord.PublishHookForTesting = func(s string) error {
			if s == step {
				syscall.Kill(os.Getpid(), syscall.SIGSTOP)
				for {
					time.Sleep(time.Hour)
				}
			}
			return nil
		}
	}
	s, err := pack.Open(ctx, src, pack.Options{Format: f.format, Column: f.column})
	if err != nil {
		return err
	}
	defer s.Close()
	var bar interface {
		Set64(int64) error
		Finish() error
	}
	total := int64(-1)
	if l, ok := s.(pack.Listed); ok {
		total = 0
		for _, x := range l.Samples() {
			total += x.Size
		}
	}
	pb := newProgress(total, "pack")
	bar = pb
	var last time.Time
	progress := func(n, b int64) {
		bar.Set64(b)
		if f.progress && time.Since(last) > 100*time.Millisecond {
			last = time.Now()
			fmt.Fprintf(os.Stderr, "progress %d %d\n", n, b)
		}
	}
	res, err := pack.Pack(ctx, s, f.out, pack.Config{
		ShardSize: target, Align: align, Workers: f.workers, IndexFormat: f.indexFormat, Force: f.force,
		Progress: progress,
	})
	bar.Finish()
	if err == nil && f.progress {
		fmt.Fprintf(os.Stderr, "progress %d %d\n", res.Samples, res.DataBytes)
	}
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return usageError{fmt.Errorf("%w (use --force to replace it)", err)}
		}
		return err
	}
	if jsonOut {
		return printJSON(res)
	}
	fmt.Fprintf(human(), "packed %d samples (%s) from %s (%s) into %d file(s) at %s in %.2fs (%.1f MiB/s); index %s\n",
		res.Samples, bench.FormatBytes(res.DataBytes), src, res.Format, len(res.Files), f.out, res.Seconds, res.MiBPerSec, res.Index)
	return nil
}

// checkURL refuses a malformed cluster URL as a usage error.
func checkURL(p, what string) error {
	if !fs.IsURL(p) {
		return nil
	}
	if _, _, _, err := fs.SplitURL(p); err != nil {
		return usagef("%s: %v", what, err)
	}
	return nil
}

func runPackClean(ctx context.Context, out string) error {
	rep, err := ffrecord.Clean(ctx, strings.TrimSuffix(out, "/"))
	if err != nil {
		return err
	}
	if jsonOut {
		return printJSON(rep)
	}
	for _, r := range rep.Restored {
		fmt.Fprintf(human(), "restored %s to %s (a pack was killed after setting it aside)\n", r, out)
	}
	for _, r := range rep.Removed {
		fmt.Fprintf(human(), "removed %s\n", r)
	}
	if len(rep.Removed)+len(rep.Restored) == 0 {
		fmt.Fprintf(human(), "nothing to clean beside %s\n", out)
	}
	return nil
}
