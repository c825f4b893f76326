package pack

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
)

// Config tunes Pack. The zero value packs into 256 MiB shards with the
// data 4 KiB-aligned, 8 samples read at once, a JSON Lines index.
type Config struct {
	// ShardSize is the target shard size for directory output. Default
	// (0) ffrecord.DefaultShardSize; negative is an error.
	ShardSize int64
	// Align starts each file's data at a multiple of Align bytes (see
	// ffrecord.WriterOptions.Align). Negative (AlignAuto): 0 for a .ffr
	// file (the reference's bytes), 4096 for shards. Default 0.
	Align int64
	// Workers bounds the samples read at once. Default 8.
	Workers int
	// IndexFormat of the sidecar index: "jsonl" (default) or "csv".
	IndexFormat string
	// Force replaces an existing output (atomically, for a directory).
	Force bool
	// Progress, if set, is called on Pack's goroutine with the samples
	// and sample bytes written so far, after each sample.
	Progress func(samples, bytes int64)
}

// AlignAuto is Config.Align's "choose for the output" value.
const AlignAuto = -1

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.ShardSize < 0 {
		return fmt.Errorf("%w: shard size %d is negative", ErrUsage, c.ShardSize)
	}
	if c.Workers < 0 {
		return fmt.Errorf("%w: workers %d is negative", ErrUsage, c.Workers)
	}
	if c.IndexFormat != "" && c.IndexFormat != "jsonl" && c.IndexFormat != "csv" {
		return fmt.Errorf("%w: index format must be jsonl or csv, got %q", ErrUsage, c.IndexFormat)
	}
	if c.Align != AlignAuto {
		if err := (ffrecord.WriterOptions{Align: c.Align}).Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
	}
	return nil
}

// Result describes a finished pack.
type Result struct {
	Samples   int64    `json:"samples"`
	Files     []string `json:"files"`
	Bytes     int64    `json:"bytes"`      // total size of the written files
	DataBytes int64    `json:"data_bytes"` // total size of the samples
	Index     string   `json:"index"`
	Format    string   `json:"format"`
	Seconds   float64  `json:"seconds"`
	MiBPerSec float64  `json:"mib_s"` // sample bytes per second
}

// IndexEntry is one entry of the sidecar index.
type IndexEntry struct {
	Index  int64  `json:"index"`  // global sample number
	File   string `json:"file"`   // the .ffr file (base name)
	Local  int64  `json:"local"`  // sample number within File
	Source string `json:"source"` // the sample's name in the source
	Size   int64  `json:"size"`
}

// Pack writes src's samples to out: a .ffr file when out ends in ".ffr",
// else a directory of shards published in one step (nothing is visible at
// out until every shard and the index are written). out may be a local
// path or a URL. An existing out is an error wrapping fs.ErrExist unless
// c.Force.
func Pack(ctx context.Context, src Source, out string, c Config) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	single := strings.HasSuffix(out, ".ffr")
	if c.Align == AlignAuto {
		c.Align = 4096
		if single {
			c.Align = 0
		}
	}
	if c.ShardSize == 0 {
		c.ShardSize = ffrecord.DefaultShardSize
	}
	if c.Workers == 0 {
		c.Workers = 8
	}
	if c.IndexFormat == "" {
		c.IndexFormat = "jsonl"
	}
	start := time.Now()
	p := &packer{ctx: ctx, src: src, out: out, c: c}
	var err error
	if single {
		err = p.packFile()
	} else {
		err = p.packDir()
	}
	if err != nil {
		return nil, err
	}
	res := &Result{Samples: int64(len(p.samples)), Files: p.files, DataBytes: p.bytes.Load(), Index: p.index, Format: src.Format()}
	for _, f := range p.files {
		if fsys, name, err := fs.Resolve(ctx, f); err == nil {
			if st, err := fsys.Stat(ctx, name); err == nil {
				res.Bytes += st.Size
			}
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if res.Seconds > 0 {
		res.MiBPerSec = float64(res.DataBytes) / (1 << 20) / res.Seconds
	}
	return res, nil
}

// packer is one Pack call.
type packer struct {
	ctx     context.Context
	src     Source
	out     string
	c       Config
	samples []Sample // every sample written, in order (for the index)
	count   atomic.Int64
	bytes   atomic.Int64
	files   []string
	index   string
}

func (p *packer) progress() {
	if p.c.Progress != nil {
		p.c.Progress(p.count.Load(), p.bytes.Load())
	}
}

func (p *packer) wrote(size int64) {
	p.count.Add(1)
	p.bytes.Add(size)
}

// sink is what both writers offer the copy loops.
type sink interface {
	WriteFrom(r io.Reader, size int64) error
	WriteFromAt(r io.ReaderAt, off, size int64) error
	Reserve(size int64) ([][]byte, func(uint32), error)
}

func (p *packer) packDir() error {
	opts := ffrecord.ShardOptions{TargetSize: p.c.ShardSize, Overwrite: p.c.Force, Align: p.c.Align}
	l, isListed := p.src.(Listed)
	if isListed {
		p.samples = l.Samples()
		opts.Sizes = make([]int64, len(p.samples))
		for i, s := range p.samples {
			opts.Sizes[i] = s.Size
		}
	}
	w, err := ffrecord.NewShardedWriter(p.ctx, p.out, opts)
	if err != nil {
		return err
	}
	if isListed {
		err = p.copyListed(l, w, !fs.IsURL(p.out))
	} else {
		err = p.copyWalk(w)
	}
	if err == nil {
		err = p.writeIndex(func() (fs.Writer, error) { return w.CreateFile("index." + p.c.IndexFormat) }, fs.Join(p.out, "index."+p.c.IndexFormat), false)
	}
	if err != nil {
		w.Abort()
		return err
	}
	p.files, err = w.Close()
	return err
}

// counter is a walked source that may know its sample count up front
// (a Parquet footer); false: count by walking.
type counter interface {
	Count() (int64, bool)
}

func (p *packer) packFile() error {
	fsys, name, err := fs.Resolve(p.ctx, p.out)
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	if !p.c.Force {
		if _, err := fsys.Stat(p.ctx, name); err == nil {
			return fmt.Errorf("%w: %s exists", fs.ErrExist, p.out)
		}
	}
	l, isListed := p.src.(Listed)
	var n int64
	counted := false
	if c, ok := p.src.(counter); ok && !isListed {
		if k, ok := c.Count(); ok {
			n, counted = k, true
		}
	}
	if isListed {
		p.samples = l.Samples()
		n = int64(len(p.samples))
	} else if !counted { // a first pass to count: the header needs n
		if err := p.src.Walk(p.ctx, func(Sample, io.Reader) error { n++; return nil }); err != nil {
			return err
		}
	}
	w, err := ffrecord.CreateWith(p.ctx, p.out, n, ffrecord.WriterOptions{Align: p.c.Align})
	if err != nil {
		return err
	}
	if isListed {
		err = p.copyListed(l, w, w.CanReserve())
	} else {
		err = p.copyWalk(w)
	}
	if err != nil {
		w.Abort()
		return err
	}
	// The index is a second file beside the .ffr. An index that another
	// pack left there is removed before the new file is published, and the
	// new index is written after it: a crash in between leaves a file
	// without an index, never an index that describes another file.
	if err := p.removeStaleIndexes(fsys, name); err != nil {
		w.Abort()
		return err
	}
	if err := ffrecord.PublishStep(StepIndexRemoved); err != nil {
		w.Abort()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	p.files = []string{p.out}
	if err := ffrecord.PublishStep(StepFilePublished); err != nil {
		return err
	}
	idx := p.out + ".index." + p.c.IndexFormat
	return p.writeIndex(func() (fs.Writer, error) { return fsys.Create(p.ctx, name+".index."+p.c.IndexFormat) }, idx, true)
}

// Publish steps of a single-file output, for ffrecord.PublishHookForTesting.
const (
	StepIndexRemoved  = "index-removed"  // the indexes an older pack left beside OUT are gone
	StepFilePublished = "file-published" // OUT is the new file; its index is not written yet
)

// removeStaleIndexes removes the sidecar indexes (of either format) beside
// the single-file output name.
func (p *packer) removeStaleIndexes(fsys fs.FS, name string) error {
	for _, f := range []string{"jsonl", "csv"} {
		idx := name + ".index." + f
		if _, err := fsys.Stat(p.ctx, idx); err != nil {
			continue
		}
		if err := fsys.Remove(p.ctx, idx); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pack: remove the old index %s: %w", p.out+".index."+f, err)
		}
	}
	return nil
}

// sampleErr names the sample a write failed on. A write stopped by the
// pack's context says so once: the parallel reads of a large sample each
// fail with the cancellation, and their joined errors would repeat it.
func (p *packer) sampleErr(name string, err error) error {
	if cerr := p.ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return fmt.Errorf("pack: sample %q: stopped while writing %s: %w", name, p.out, cerr)
	}
	return fmt.Errorf("pack: sample %q: %w", name, err)
}

// copyWalk writes every sample of a walked source, one after the other.
func (p *packer) copyWalk(w sink) error {
	return p.src.Walk(p.ctx, func(s Sample, r io.Reader) error {
		if err := w.WriteFrom(r, s.Size); err != nil {
			return p.sampleErr(s.Name, err)
		}
		if _, ok := p.src.(Listed); !ok {
			p.samples = append(p.samples, s)
		}
		p.wrote(s.Size)
		p.progress()
		return nil
	})
}

// copyListed writes every sample of a listed source. With reserve (a
// local output), up to Workers samples are read at once, each straight
// into its place in the output: the writer hands out each sample's space
// in order, a worker reads the source into it, checksums it and marks it
// done. Samples larger than ffrecord.MaxReserve, and every sample without
// reserve, are copied by this goroutine (large ones with several reads in
// flight). Memory is bounded by the writer's staging window.
func (p *packer) copyListed(l Listed, w sink, reserve bool) error {
	samples := l.Samples()
	if !reserve {
		for i, s := range samples {
			if err := p.ctx.Err(); err != nil {
				return err
			}
			err := w.WriteFromAt(l.ReaderAt(i), 0, s.Size)
			l.Done(i)
			if err != nil {
				return p.sampleErr(s.Name, err)
			}
			p.wrote(s.Size)
			p.progress()
		}
		return nil
	}
	type job struct {
		i    int
		bufs [][]byte
		done func(uint32)
	}
	jobs := make(chan job, 4*p.c.Workers)
	g, gctx := errgroup.WithContext(p.ctx)
	for range p.c.Workers {
		g.Go(func() error {
			var failed error
			for j := range jobs {
				// Every reservation is marked done, even after a failure,
				// so the writer never waits for it; the pack is aborted then.
				if failed != nil || gctx.Err() != nil {
					j.done(0)
					continue
				}
				var crc uint32
				err := localfs.ReadAtInto(l.ReaderAt(j.i), 0, j.bufs, 1)
				l.Done(j.i)
				if err == nil {
					for _, b := range j.bufs {
						crc = crc32.Update(crc, crc32.IEEETable, b)
					}
				}
				j.done(crc)
				if err != nil {
					failed = fmt.Errorf("pack: read %s: %w", samples[j.i].Name, err)
					continue
				}
				p.wrote(samples[j.i].Size)
			}
			return failed
		})
	}
	var rerr error
	for i, s := range samples {
		if gctx.Err() != nil {
			break
		}
		if s.Size > ffrecord.MaxReserve {
			err := w.WriteFromAt(l.ReaderAt(i), 0, s.Size)
			l.Done(i)
			if err != nil {
				rerr = p.sampleErr(s.Name, err)
				break
			}
			p.wrote(s.Size)
			p.progress()
			continue
		}
		bufs, done, err := w.Reserve(s.Size)
		if err != nil {
			rerr = err
			break
		}
		jobs <- job{i, bufs, done}
		p.progress()
	}
	close(jobs)
	if err := g.Wait(); err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	p.progress()
	return p.ctx.Err()
}

// writeIndex writes the sidecar index from sample to source name.
func (p *packer) writeIndex(create func() (fs.Writer, error), display string, single bool) error {
	w, err := create()
	if err != nil {
		return fmt.Errorf("pack: index %s: %w", display, err)
	}
	defer w.Close()
	bw := bufio.NewWriterSize(w, 1<<20)
	var cw *csv.Writer
	enc := json.NewEncoder(bw)
	if p.c.IndexFormat == "csv" {
		cw = csv.NewWriter(bw)
		cw.Write([]string{"index", "file", "local", "source", "size"})
	}
	counts := []int64{int64(len(p.samples))}
	if !single {
		sizes := make([]int64, len(p.samples))
		for i, s := range p.samples {
			sizes[i] = s.Size
		}
		counts = ffrecord.PlanShards(sizes, p.c.ShardSize, p.c.Align)
	}
	shard, local := 0, int64(0)
	base := path.Base(p.out)
	for i, s := range p.samples {
		for shard < len(counts) && local >= counts[shard] {
			shard++
			local = 0
		}
		file := base
		if !single {
			file = ffrecord.ShardName(shard)
		}
		e := IndexEntry{Index: int64(i), File: file, Local: local, Source: s.Name, Size: s.Size}
		if cw != nil {
			cw.Write([]string{strconv.FormatInt(e.Index, 10), e.File, strconv.FormatInt(e.Local, 10), e.Source, strconv.FormatInt(e.Size, 10)})
		} else if err := enc.Encode(e); err != nil {
			return err
		}
		local++
	}
	if cw != nil {
		cw.Flush()
		if err := cw.Error(); err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("pack: index %s: %w", display, err)
	}
	if err := w.Commit(); err != nil {
		return fmt.Errorf("pack: index %s: %w", display, err)
	}
	p.index = display
	return nil
}

// ReadIndex reads a JSON Lines sidecar index.
func ReadIndex(r io.Reader) ([]IndexEntry, error) {
	var out []IndexEntry
	dec := json.NewDecoder(r)
	for {
		var e IndexEntry
		err := dec.Decode(&e)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: index entry %d: %w", ErrData, len(out), err)
		}
		out = append(out, e)
	}
}
