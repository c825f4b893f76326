package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
	"github.com/ffkit/ffkit/internal/errkind"
)

func init() { register(newPackCmd) }

type packFlags struct {
	out         string
	shardSize   string
	format      string
	workers     int
	indexFormat string
	align       int64
	force       bool
	cpuProfile  string
}

func newPackCmd() *cobra.Command {
	var f packFlags
	c := &cobra.Command{
		Use:   "pack SRC -o OUT",
		Short: "Pack a directory, a JSON Lines file or a tar archive into FFRecord",
		Long: `Pack samples into FFRecord files.

SRC is one of:
  a directory   each regular file is one sample, in sorted relative-path order
  a JSON Lines  each non-empty line is one sample (its bytes, without the newline)
  a tar archive each regular member is one sample, in archive order

OUT ending in .ffr is one file, byte-identical to what the reference FFRecord
writer produces for the same samples in the same order. Any other OUT is a
directory of shards PART_00000.ffr, PART_00001.ffr, ... rolled at --shard-size,
whose data starts on a 4 KiB boundary (--align 0 for the reference's layout):
every FFRecord reader reads them, and page-sized samples are then each one
O_DIRECT page read instead of two.

A sidecar index maps each sample to its source name: OUT.index.jsonl next to a
.ffr file, or OUT/index.jsonl in a directory (--index-format csv for CSV).
The same inputs always give the same bytes. A progress bar is drawn when
stderr is a terminal.`,
		Example: `  ffkit pack images/ -o train.ffr
  ffkit pack corpus.jsonl -o corpus/ --shard-size 64M
  ffkit pack shards.tar -o ds --workers 16 --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPack(cmd.Context(), args[0], f, cmd.Flags().Changed("shard-size"))
		},
	}
	c.Flags().StringVarP(&f.out, "output", "o", "", "output: a .ffr file, or a directory of shards (required)")
	c.Flags().StringVar(&f.shardSize, "shard-size", "256M", "target shard size for directory output (K, M, G suffixes)")
	c.Flags().StringVar(&f.format, "format", "auto", "source format: auto, files, jsonl or tar")
	c.Flags().IntVar(&f.workers, "workers", 8, "sources read at once, each straight into its place in the output")
	c.Flags().StringVar(&f.indexFormat, "index-format", "jsonl", "sidecar index format: jsonl or csv")
	c.Flags().Int64Var(&f.align, "align", -1, "start each file's data at a multiple of this many bytes, so page-sized samples are each one O_DIRECT page read; 0 = the reference's layout (auto: 0 for a .ffr file, 4096 for shards)")
	c.Flags().Lookup("align").DefValue = "auto"
	c.Flags().BoolVar(&f.force, "force", false, "replace an existing output")
	c.Flags().StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile here")
	c.Flags().MarkHidden("cpuprofile")
	c.MarkFlagRequired("output")
	return c
}

// packSample is one source sample: where its bytes are and what it is called.
type packSample struct {
	name string // source name for the sidecar index
	path string // file to read from
	off  int64
	size int64
	// shared: one file holds many samples (jsonl, tar); kept open
	shared bool
}

type packResult struct {
	Samples   int64    `json:"samples"`
	Files     []string `json:"files"`
	Bytes     int64    `json:"bytes"`      // total size of the written files
	DataBytes int64    `json:"data_bytes"` // total size of the samples
	Index     string   `json:"index"`
	Format    string   `json:"format"`
	Seconds   float64  `json:"seconds"`
	MiBPerSec float64  `json:"mib_s"` // sample bytes per second
}

func runPack(ctx context.Context, src string, f packFlags, shardSizeSet bool) error {
	if f.workers <= 0 {
		return usagef("--workers must be positive, got %d", f.workers)
	}
	if f.indexFormat != "jsonl" && f.indexFormat != "csv" {
		return usagef("--index-format must be jsonl or csv, got %q", f.indexFormat)
	}
	if f.align < 0 {
		f.align = 0
		if !strings.HasSuffix(f.out, ".ffr") {
			f.align = 4096
		}
	}
	if err := (ffrecord.WriterOptions{Align: f.align}).Validate(); err != nil {
		return usageError{err}
	}
	single := strings.HasSuffix(f.out, ".ffr")
	target, err := bench.ParseSize(f.shardSize)
	if err != nil || target <= 0 {
		return usagef("--shard-size %q: want a positive size such as 256M", f.shardSize)
	}
	if single && shardSizeSet {
		return usagef("--shard-size applies to directory output; %s is one .ffr file", f.out)
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
	format, err := packDetectFormat(src, f.format)
	if err != nil {
		return err
	}
	start := time.Now()
	var samples []packSample
	switch format {
	case "files":
		samples, err = packListFiles(ctx, src)
	case "jsonl":
		samples, err = packListJSONL(ctx, src)
	case "tar":
		samples, err = packListTar(ctx, src)
	}
	if err != nil {
		return err
	}
	sizes := make([]int64, len(samples))
	var total int64
	for i, s := range samples {
		sizes[i] = s.size
		total += s.size
	}

	var res packResult
	res.Format = format
	var sink func(r io.ReaderAt, off, size int64) error
	var reserve func(size int64) ([][]byte, func(uint32), error) // nil: sequential copies
	var finish func() ([]string, error)
	var abort func()
	if single {
		if !f.force {
			if _, err := os.Stat(f.out); err == nil {
				return usagef("%s exists; use --force to replace it", f.out)
			}
		}
		w, err := ffrecord.CreateWith(ctx, f.out, int64(len(samples)), ffrecord.WriterOptions{Align: f.align})
		if err != nil {
			return err
		}
		sink = w.WriteFromAt
		if w.CanReserve() {
			reserve = w.Reserve
		}
		finish = func() ([]string, error) { return []string{f.out}, w.Close() }
		abort = w.Abort
	} else {
		w, err := ffrecord.NewShardedWriter(ctx, f.out, ffrecord.ShardOptions{
			TargetSize: target, Sizes: sizes, Overwrite: f.force, Align: f.align})
		if err != nil {
			if errors.Is(err, fs.ErrExist) {
				return usageError{fmt.Errorf("%w (use --force to replace it)", err)}
			}
			return err
		}
		sink = w.WriteFromAt
		if !fs.IsURL(f.out) { // local shards stage writes in memory
			reserve = w.Reserve
		}
		finish = w.Close
		abort = w.Abort
	}

	bar := newProgress(total, "pack")
	var perr error
	if reserve != nil {
		perr = packParallel(ctx, samples, f.workers, reserve, func(n int64) { bar.Add64(n) })
	} else {
		perr = packStream(ctx, samples, f.workers, func(r io.ReaderAt, off, size int64) error {
			if err := sink(r, off, size); err != nil {
				return err
			}
			bar.Add64(size)
			return nil
		})
	}
	if err := perr; err != nil {
		abort()
		return err
	}
	files, err := finish()
	bar.Finish()
	if err != nil {
		return err
	}
	res.Files = files
	res.Samples = int64(len(samples))
	res.DataBytes = total
	for _, p := range files {
		if st, err := os.Stat(p); err == nil {
			res.Bytes += st.Size()
		}
	}
	res.Index, err = packWriteIndex(ctx, f.out, single, f.indexFormat, samples, sizes, target, f.align)
	if err != nil {
		return err
	}
	res.Seconds = time.Since(start).Seconds()
	if res.Seconds > 0 {
		res.MiBPerSec = float64(total) / bench.MiB / res.Seconds
	}
	if jsonOut {
		return printJSON(res)
	}
	fmt.Fprintf(human(), "packed %d samples (%s) from %s (%s) into %d file(s) at %s in %.2fs (%.1f MiB/s); index %s\n",
		res.Samples, bench.FormatBytes(total), src, format, len(files), f.out, res.Seconds, res.MiBPerSec, res.Index)
	return nil
}

func packDetectFormat(src, format string) (string, error) {
	st, err := os.Stat(src)
	if err != nil {
		return "", fmt.Errorf("pack: source: %w", err)
	}
	switch format {
	case "files":
		if !st.IsDir() {
			return "", usagef("--format files needs a directory; %s is a file", src)
		}
		return format, nil
	case "jsonl", "tar":
		if st.IsDir() {
			return "", usagef("--format %s needs a file; %s is a directory", format, src)
		}
		return format, nil
	case "auto":
	default:
		return "", usagef("--format must be auto, files, jsonl or tar, got %q", format)
	}
	if st.IsDir() {
		return "files", nil
	}
	lower := strings.ToLower(src)
	switch {
	case strings.HasSuffix(lower, ".tar"):
		return "tar", nil
	case strings.HasSuffix(lower, ".jsonl"), strings.HasSuffix(lower, ".ndjson"), strings.HasSuffix(lower, ".json"):
		return "jsonl", nil
	}
	head := make([]byte, 512)
	fh, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("pack: source: %w", err)
	}
	defer fh.Close()
	n, _ := io.ReadFull(fh, head)
	head = head[:n]
	if n >= 263 && bytes.HasPrefix(head[257:], []byte("ustar")) {
		return "tar", nil
	}
	if t := bytes.TrimLeft(head, " \t\r\n"); len(t) > 0 && (t[0] == '{' || t[0] == '[' || t[0] == '"') {
		return "jsonl", nil
	}
	return "", usagef("cannot tell the format of %s: name it .tar or .jsonl, or pass --format", src)
}

// packListFiles lists every regular file under dir, sorted by relative path
// as byte strings (the order the reference is fed in `pack DIR`).
func packListFiles(ctx context.Context, dir string) ([]packSample, error) {
	var out []packSample
	err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("pack: %w", err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if d.IsDir() {
			return nil
		}
		info, err := os.Stat(p) // follows symlinks to files
		if err != nil {
			return fmt.Errorf("pack: %w", err)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, packSample{name: filepath.ToSlash(rel), path: p, size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
	return out, nil
}

// packListJSONL indexes the lines of a JSON Lines file: each non-empty line
// (without its "\n" or "\r\n") is one sample, named FILE:LINE.
func packListJSONL(ctx context.Context, path string) ([]packSample, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	defer fh.Close()
	base := filepath.Base(path)
	br := bufio.NewReaderSize(fh, 1<<20)
	var out []packSample
	var off int64
	line := 0
	for {
		if line%65536 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// ReadSlice keeps memory bounded for long lines: count their length only.
		var length int64
		var lastTwo [2]byte
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			length += int64(len(chunk))
			if len(chunk) >= 2 {
				lastTwo = [2]byte{chunk[len(chunk)-2], chunk[len(chunk)-1]}
			} else if len(chunk) == 1 {
				lastTwo = [2]byte{lastTwo[1], chunk[0]}
			}
			if err != bufio.ErrBufferFull {
				break
			}
		}
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("pack: read %s: %w", path, err)
		}
		line++
		content := length
		if content > 0 && lastTwo[1] == '\n' {
			content--
			if content > 0 && lastTwo[0] == '\r' {
				content--
			}
		}
		if content > 0 {
			out = append(out, packSample{name: base + ":" + strconv.Itoa(line), path: path, off: off, size: content, shared: true})
		}
		off += length
		if err == io.EOF {
			break
		}
	}
	return out, nil
}

// packListTar indexes the regular members of an uncompressed tar archive.
func packListTar(ctx context.Context, path string) ([]packSample, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	defer fh.Close()
	var head [2]byte
	if n, _ := fh.ReadAt(head[:], 0); n == 2 && head[0] == 0x1f && head[1] == 0x8b {
		return nil, usagef("%s is gzip-compressed; decompress it first (pack reads members in place)", path)
	}
	tr := tar.NewReader(fh) // fh is an io.Seeker: Next skips member data without reading it
	var out []packSample
	for {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, errkind.Wrap(errkind.Data, fmt.Errorf("pack: %s: bad tar archive after %d members: %w", path, len(out), err))
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old archives use TypeRegA
		case tar.TypeGNUSparse:
			return nil, usagef("%s: member %s is a sparse file, which pack does not support", path, h.Name)
		default:
			continue // directories, links, devices
		}
		pos, err := fh.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, fmt.Errorf("pack: %s: %w", path, err)
		}
		out = append(out, packSample{name: h.Name, path: path, off: pos, size: h.Size, shared: true})
	}
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	for _, s := range out {
		if s.off+s.size > st.Size() {
			return nil, errkind.Wrap(errkind.Data, fmt.Errorf("pack: %s: member %s runs past the end of the archive", path, s.name))
		}
	}
	return out, nil
}

// packStream hands the samples to sink in order, as readers of exactly
// their bytes, so the writer reads each sample straight into its output
// buffers (one copy). Ahead of the writer, up to workers goroutines ask the
// kernel to read the next samples in (posix_fadvise WILLNEED), at most
// packAhead bytes ahead, so cold sources are fetched in parallel without
// being copied through our memory.
func packStream(ctx context.Context, samples []packSample, workers int, sink func(r io.ReaderAt, off, size int64) error) error {
	const packAhead = 256 << 20
	files := newPackFileCache()
	defer files.close()
	cum := make([]int64, len(samples)+1) // cum[i]: bytes before sample i
	for i, s := range samples {
		cum[i+1] = cum[i] + s.size
	}
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	done := 0 // samples the writer has finished; guarded by mu
	pctx, cancel := context.WithCancel(ctx)
	var hints errgroup.Group
	hints.SetLimit(workers)
	schedDone := make(chan struct{})
	go func() { // the scheduler: hints stay within packAhead of the writer
		defer close(schedDone)
		for j := range samples {
			mu.Lock()
			for cum[j]-cum[done] > packAhead && pctx.Err() == nil {
				cond.Wait()
			}
			mu.Unlock()
			if pctx.Err() != nil {
				return
			}
			s := samples[j]
			hints.Go(func() error { files.willNeed(s); return nil })
		}
	}()
	defer func() {
		cancel()
		mu.Lock()
		cond.Broadcast()
		mu.Unlock()
		<-schedDone
		hints.Wait()
	}()
	for i, s := range samples {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := files.feed(s, sink); err != nil {
			return err
		}
		mu.Lock()
		done = i + 1
		cond.Broadcast()
		mu.Unlock()
	}
	return nil
}

// packParallel reads up to workers sources at once, each straight into its
// place in the output: the writer hands out each sample's space in order
// (reserve), a worker reads the source into it, checksums it and marks it
// done. This is the path for local outputs; memory is bounded by the
// writer's staging.
func packParallel(ctx context.Context, samples []packSample, workers int,
	reserve func(int64) ([][]byte, func(uint32), error), progress func(int64)) error {
	type job struct {
		s    packSample
		bufs [][]byte
		done func(uint32)
	}
	files := newPackFileCache()
	defer files.close()
	jobs := make(chan job, 4*workers)
	g, gctx := errgroup.WithContext(ctx)
	for range workers {
		g.Go(func() error {
			var failed error
			for j := range jobs {
				// Every reservation is marked done, even after a failure,
				// so the writer never waits for it; the pack is aborted then.
				if failed != nil || gctx.Err() != nil {
					j.done(0)
					continue
				}
				crc, err := files.fill(j.s, j.bufs)
				j.done(crc)
				if err != nil {
					failed = err
					continue
				}
				progress(j.s.size)
			}
			return failed
		})
	}
	var rerr error
	for _, s := range samples {
		if gctx.Err() != nil {
			break
		}
		bufs, done, err := reserve(s.size)
		if err != nil {
			rerr = err
			break
		}
		jobs <- job{s, bufs, done}
	}
	close(jobs)
	if err := g.Wait(); err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	return ctx.Err()
}

// fill reads a sample's bytes into bufs and returns their CRC-32, checking
// that the source still has exactly that many bytes.
func (c *packFileCache) fill(s packSample, bufs [][]byte) (uint32, error) {
	var crc uint32
	err := c.feed(s, func(r io.ReaderAt, off, size int64) error {
		if err := localfs.ReadAtInto(r, off, bufs, 1); err != nil {
			return fmt.Errorf("pack: read %s: %w", s.name, err)
		}
		for _, b := range bufs {
			crc = crc32.Update(crc, crc32.IEEETable, b)
		}
		return nil
	})
	return crc, err
}

// packFileCache keeps shared source files (an archive, a JSON Lines file)
// open for all samples.
type packFileCache struct {
	mu    sync.Mutex
	files map[string]*os.File // guarded by mu
}

func newPackFileCache() *packFileCache { return &packFileCache{files: map[string]*os.File{}} }

func (c *packFileCache) shared(path string) (*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if fh := c.files[path]; fh != nil {
		return fh, nil
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	c.files[path] = fh
	return fh, nil
}

// willNeed asks the kernel to start reading a sample's bytes.
func (c *packFileCache) willNeed(s packSample) {
	if s.shared {
		if fh, err := c.shared(s.path); err == nil {
			unix.Fadvise(int(fh.Fd()), s.off, s.size, unix.FADV_WILLNEED)
		}
		return
	}
	if fh, err := os.Open(s.path); err == nil {
		unix.Fadvise(int(fh.Fd()), 0, s.size, unix.FADV_WILLNEED)
		fh.Close()
	}
}

// feed has sink copy the sample's bytes and checks that the source still
// has exactly that many.
func (c *packFileCache) feed(s packSample, sink func(io.ReaderAt, int64, int64) error) error {
	var fh *os.File
	var err error
	if s.shared {
		fh, err = c.shared(s.path)
	} else {
		fh, err = os.Open(s.path)
		if err == nil {
			defer fh.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	serr := sink(fh, s.off, s.size)
	st, err := fh.Stat()
	switch {
	case err != nil:
		return fmt.Errorf("pack: %w", err)
	case s.shared && st.Size() < s.off+s.size:
		return errkind.Wrap(errkind.Data, fmt.Errorf("pack: %s changed while packing: %s is cut short", s.path, s.name))
	case !s.shared && st.Size() != s.size:
		return errkind.Wrap(errkind.Data, fmt.Errorf("pack: source %s changed while packing: %d bytes, was %d", s.name, st.Size(), s.size))
	}
	return serr
}

func (c *packFileCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.files {
		f.Close()
	}
}

// packIndexEntry is one line of the sidecar index.
type packIndexEntry struct {
	Index  int64  `json:"index"`
	File   string `json:"file"`
	Local  int64  `json:"local"`
	Source string `json:"source"`
	Size   int64  `json:"size"`
}

// packWriteIndex writes the index from sample to source name.
func packWriteIndex(ctx context.Context, out string, single bool, format string, samples []packSample, sizes []int64, target, align int64) (string, error) {
	path := out + ".index." + format
	if !single {
		path = fs.Join(out, "index."+format)
	}
	fsys, name, err := fs.Resolve(ctx, path)
	if err != nil {
		return "", err
	}
	w, err := fsys.Create(ctx, name)
	if err != nil {
		return "", fmt.Errorf("pack: index %s: %w", path, err)
	}
	defer w.Close()
	bw := bufio.NewWriterSize(w, 1<<20)
	var cw *csv.Writer
	enc := json.NewEncoder(bw)
	if format == "csv" {
		cw = csv.NewWriter(bw)
		cw.Write([]string{"index", "file", "local", "source", "size"})
	}
	counts := []int64{int64(len(samples))}
	if !single {
		counts = ffrecord.PlanShards(sizes, target, align)
	}
	shard, local := 0, int64(0)
	for i, s := range samples {
		for shard < len(counts) && local >= counts[shard] {
			shard++
			local = 0
		}
		file := filepath.Base(out)
		if !single {
			file = ffrecord.ShardName(shard)
		}
		e := packIndexEntry{Index: int64(i), File: file, Local: local, Source: s.name, Size: s.size}
		if cw != nil {
			cw.Write([]string{strconv.FormatInt(e.Index, 10), e.File, strconv.FormatInt(e.Local, 10), e.Source, strconv.FormatInt(e.Size, 10)})
		} else if err := enc.Encode(e); err != nil {
			return "", err
		}
		local++
	}
	if cw != nil {
		cw.Flush()
		if err := cw.Error(); err != nil {
			return "", err
		}
	}
	if err := bw.Flush(); err != nil {
		return "", fmt.Errorf("pack: index %s: %w", path, err)
	}
	if err := w.Commit(); err != nil {
		return "", fmt.Errorf("pack: index %s: %w", path, err)
	}
	return path, nil
}
