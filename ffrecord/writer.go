package ffrecord

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
	"github.com/ffkit/ffkit/internal/errkind"
)

// maxN bounds n so that the header length cannot overflow.
const maxN = (1 << 62) / perSample

// Writer writes one FFRecord file of n samples known up front, producing
// exactly the bytes the reference writer produces. It belongs to one
// goroutine. Nothing is visible under the file's name until Close succeeds.
type Writer struct {
	path    string
	n       int64
	start   int64 // where the data starts
	w       fs.Writer
	wa      io.WriterAt // w's positional writes, when it has them
	spool   *os.File    // samples spooled here when w cannot write at an offset
	spoolW  *bufio.Writer
	mu      sync.Mutex // guards crcs: Reserve's done callbacks run on other goroutines
	crcs    []uint32
	lengths []int64
	err     error // first error, sticky
	done    bool
	filling sync.WaitGroup // reservations whose done has not been called
}

// Create starts a file of n samples at path (a local path or a URL),
// written under a temporary name and published by Close.
func Create(ctx context.Context, p string, n int64) (*Writer, error) {
	return CreateWith(ctx, p, n, WriterOptions{})
}

// WriterOptions tune a Writer. The zero value writes the reference's bytes.
type WriterOptions struct {
	// Align starts the first sample at a multiple of Align bytes (a power
	// of two, e.g. 4096), leaving zeros between the header and the data.
	// Every reader of the format reads such files (sample offsets are
	// absolute); with samples whose sizes are multiples of Align, every
	// sample is then aligned for O_DIRECT and a 4 KiB sample is one device
	// read instead of two. 0 or 1: no gap, the reference's layout.
	Align int64
}

// Validate checks the options.
func (o WriterOptions) Validate() error {
	if o.Align < 0 || o.Align > 1<<30 || (o.Align > 0 && o.Align&(o.Align-1) != 0) {
		return fmt.Errorf("%w: alignment %d is not a power of two up to 1 GiB", ErrIndex, o.Align)
	}
	return nil
}

// CreateWith is Create with options.
func CreateWith(ctx context.Context, p string, n int64, opts WriterOptions) (*Writer, error) {
	if n < 0 || n > maxN {
		return nil, fmt.Errorf("%w: cannot create %s with n = %d samples", ErrIndex, p, n)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	fsys, name, err := fs.Resolve(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("ffrecord: %w", err)
	}
	return create(ctx, fsys, name, p, n, opts.Align)
}

// dataStart is where the samples of a file of n samples begin.
func dataStart(n, align int64) int64 {
	hl := HeaderLen(n)
	if align <= 1 {
		return hl
	}
	return (hl + align - 1) &^ (align - 1)
}

func create(ctx context.Context, fsys fs.FS, name, display string, n, align int64) (*Writer, error) {
	w, err := fsys.Create(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("ffrecord: create %s: %w", display, err)
	}
	c := min(n, 1<<20) // grown as samples arrive: n is the caller's claim
	wr := &Writer{path: display, n: n, start: dataStart(n, align), w: w, crcs: make([]uint32, 0, c), lengths: make([]int64, 0, c)}
	if wa, ok := w.(io.WriterAt); ok {
		wr.wa = wa
		// A zero header now, the real one at Close, as the reference does.
		if err := writeZeros(w, wr.start); err != nil {
			w.Close()
			return nil, fmt.Errorf("ffrecord: %s: %w", display, err)
		}
	} else {
		f, err := os.CreateTemp("", "ffrecord-spool-*")
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("ffrecord: %s: spool file: %w", display, err)
		}
		os.Remove(f.Name()) // unlinked: vanishes with the process
		wr.spool, wr.spoolW = f, bufio.NewWriterSize(f, 1<<20)
	}
	return wr, nil
}

func writeZeros(w io.Writer, n int64) error {
	z := make([]byte, min(n, 1<<20))
	for n > 0 {
		k := min(n, int64(len(z)))
		if _, err := w.Write(z[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// WriteOne appends the next sample.
func (w *Writer) WriteOne(b []byte) error {
	return w.writeOne(b, crc32.Update(0, crcTable, b))
}

// WriteOneCRC appends the next sample whose CRC-32 the caller computed
// already (with Checksum, e.g. on another goroutine while reading it).
// A wrong crc makes a file whose sample fails its checksum on read.
func (w *Writer) WriteOneCRC(b []byte, crc uint32) error { return w.writeOne(b, crc) }

// WriteFrom appends the next sample: exactly size bytes read from r.
// Where the file system's writer reads straight into its own buffers (local
// files do), the bytes are copied once, from r into the output, and
// checksummed on the way. If r ends early the Writer fails.
func (w *Writer) WriteFrom(r io.Reader, size int64) error {
	if err := w.check(); err != nil {
		return err
	}
	if size < 0 {
		w.err = fmt.Errorf("%w: %s: sample %d: negative size %d", ErrIndex, w.path, len(w.crcs), size)
		return w.err
	}
	h := crc32.NewIEEE()
	src := io.TeeReader(io.LimitReader(r, size), h)
	var dst io.Writer = w.w
	if w.spool != nil {
		dst = w.spoolW
	}
	var n int64
	var err error
	if rf, ok := dst.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(src)
	} else {
		n, err = io.CopyBuffer(struct{ io.Writer }{dst}, src, make([]byte, min(size, 1<<20)+1))
	}
	if err == nil && n != size {
		err = errkind.Wrap(errkind.Data, fmt.Errorf("the source gave %d of %d bytes", n, size))
	}
	if err != nil {
		w.err = fmt.Errorf("ffrecord: %s: write sample %d: %w", w.path, len(w.crcs), err)
		return w.err
	}
	w.appendSample(h.Sum32(), size)
	return nil
}

// copierAt is an optional fs.Writer capability: copy a range of a file
// straight into the output with parallel reads (localfs has it).
type copierAt interface {
	CopyFromAt(r io.ReaderAt, off, n int64, tee io.Writer, par int) (int64, error)
}

// copyParallelism is how many reads WriteFromAt keeps in flight for one
// large sample.
const copyParallelism = 4

// WriteFromAt appends the next sample: the size bytes of r at off. Large
// samples are read with several reads in flight, straight into the output
// where the file system allows (local files), checksummed on the way.
func (w *Writer) WriteFromAt(r io.ReaderAt, off, size int64) error {
	c, ok := w.w.(copierAt)
	if !ok || w.spool != nil {
		return w.WriteFrom(io.NewSectionReader(r, off, size), size)
	}
	if err := w.check(); err != nil {
		return err
	}
	if size < 0 {
		w.err = fmt.Errorf("%w: %s: sample %d: negative size %d", ErrIndex, w.path, len(w.crcs), size)
		return w.err
	}
	h := crc32.NewIEEE()
	if _, err := c.CopyFromAt(r, off, size, h, copyParallelism); err != nil {
		w.err = fmt.Errorf("ffrecord: %s: write sample %d: %w", w.path, len(w.crcs), err)
		return w.err
	}
	w.appendSample(h.Sum32(), size)
	return nil
}

func (w *Writer) appendSample(crc uint32, size int64) {
	w.mu.Lock()
	w.crcs = append(w.crcs, crc)
	w.mu.Unlock()
	w.lengths = append(w.lengths, size)
}

// reserver is an optional fs.Writer capability: hand out the next bytes of
// the file for other goroutines to fill (localfs has it).
type reserver interface {
	Reserve(n int64) ([][]byte, func(), error)
}

// MaxReserve is the largest sample Reserve takes: the output stages a
// bounded window, and one reservation must fit in it. Write larger samples
// with WriteFrom or WriteFromAt, which stream any size.
const MaxReserve = localfs.MaxReserve

// ErrNoReserve: the output's file system cannot hand out space to fill.
var ErrNoReserve = errkind.New(errkind.Usage, "ffrecord: this output does not support Reserve")

// CanReserve reports whether Reserve works for this file.
func (w *Writer) CanReserve() bool {
	_, ok := w.w.(reserver)
	return ok && w.spool == nil
}

// Reserve appends the next sample, of size bytes, before its bytes are
// known: the caller fills bufs (in order, they are the sample) from any
// goroutine and then calls done once with the sample's CRC-32 (Checksum of
// the bytes). Samples land in reservation order whatever the order of the
// done calls, so many sources can be read at once straight into place.
// Close waits for every done. Reserve itself belongs to the Writer's
// goroutine and may block while too much is staged: call done without
// waiting for a later Reserve.
func (w *Writer) Reserve(size int64) (bufs [][]byte, done func(crc uint32), err error) {
	if err := w.check(); err != nil {
		return nil, nil, err
	}
	r, ok := w.w.(reserver)
	if !ok || w.spool != nil {
		return nil, nil, ErrNoReserve
	}
	if size < 0 {
		w.err = fmt.Errorf("%w: %s: sample %d: negative size %d", ErrIndex, w.path, len(w.lengths), size)
		return nil, nil, w.err
	}
	if size > MaxReserve {
		return nil, nil, fmt.Errorf("%w: %s: sample %d of %d bytes is larger than MaxReserve; write it with WriteFromAt", ErrNoReserve, w.path, len(w.lengths), size)
	}
	bufs, release, err := r.Reserve(size)
	if err != nil {
		w.err = fmt.Errorf("ffrecord: %s: sample %d: %w", w.path, len(w.lengths), err)
		return nil, nil, w.err
	}
	w.mu.Lock()
	i := len(w.crcs)
	w.crcs = append(w.crcs, 0)
	w.mu.Unlock()
	w.lengths = append(w.lengths, size)
	w.filling.Add(1)
	var once sync.Once
	return bufs, func(crc uint32) {
		once.Do(func() {
			w.mu.Lock()
			w.crcs[i] = crc
			w.mu.Unlock()
			release()
			w.filling.Done()
		})
	}, nil
}

func (w *Writer) check() error {
	if w.err != nil {
		return w.err
	}
	if w.done {
		return fmt.Errorf("ffrecord: %s: write after Close or Abort", w.path)
	}
	if int64(len(w.lengths)) >= w.n {
		w.err = fmt.Errorf("%w: %s: sample %d is more than the %d samples the file was created for", ErrIndex, w.path, len(w.lengths), w.n)
		return w.err
	}
	return nil
}

func (w *Writer) writeOne(b []byte, crc uint32) error {
	if err := w.check(); err != nil {
		return err
	}
	var err error
	if w.spool != nil {
		_, err = w.spoolW.Write(b)
	} else {
		_, err = w.w.Write(b)
	}
	if err != nil {
		w.err = fmt.Errorf("ffrecord: %s: write sample %d: %w", w.path, len(w.crcs), err)
		return w.err
	}
	w.appendSample(crc, int64(len(b)))
	return nil
}

// Written is the number of samples written so far.
func (w *Writer) Written() int64 { return int64(len(w.lengths)) }

// Close writes the header and publishes the file. It fails, publishing
// nothing, unless exactly n samples were written.
func (w *Writer) Close() error {
	if w.done {
		return w.err
	}
	w.filling.Wait()
	if w.err == nil && int64(len(w.crcs)) != w.n {
		w.err = fmt.Errorf("%w: %s: created for %d samples, got %d; nothing was written", ErrIndex, w.path, w.n, len(w.crcs))
	}
	if w.err != nil {
		w.Abort()
		return w.err
	}
	w.done = true
	hdr := encodeHeader(w.crcs, w.lengths, w.start)
	var err error
	if w.wa != nil {
		_, err = w.wa.WriteAt(hdr, 0)
	} else {
		_, err = w.w.Write(hdr)
		if err == nil {
			err = writeZeros(w.w, w.start-int64(len(hdr)))
		}
		if err == nil {
			err = w.spoolW.Flush()
		}
		if err == nil {
			_, err = w.spool.Seek(0, io.SeekStart)
		}
		if err == nil {
			_, err = io.CopyBuffer(struct{ io.Writer }{w.w}, w.spool, make([]byte, 1<<20))
		}
		w.spool.Close()
	}
	if err == nil {
		err = w.w.Commit()
	} else {
		w.w.Close()
	}
	if err != nil {
		w.err = fmt.Errorf("ffrecord: %s: %w", w.path, err)
	}
	return w.err
}

// Abort abandons the file: nothing is published.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	w.w.Close()
	if w.spool != nil {
		w.spool.Close()
	}
	if w.err == nil {
		w.err = fmt.Errorf("ffrecord: %s: aborted", w.path)
	}
}

// DefaultShardSize is ShardOptions.TargetSize's default.
const DefaultShardSize = 256 << 20

// ShardOptions tune a ShardedWriter.
type ShardOptions struct {
	// TargetSize: a shard is closed before a sample that would take it past
	// this many bytes (header included). A shard holds at least one sample.
	// Default 256 MiB.
	TargetSize int64
	// Sizes, if the caller knows every sample's length in advance, lets
	// samples stream to disk; otherwise each shard is buffered in memory
	// (up to TargetSize) until it is complete. The files are the same
	// either way. Write fails on a sample of another length.
	Sizes []int64
	// Overwrite replaces a dataset already in the directory (see
	// publish.go; a directory holding anything but shards and pack's index
	// is never replaced). Default: refuse unless the directory is missing
	// or empty.
	Overwrite bool
	// Align is WriterOptions.Align for every shard. Default 0: the
	// reference's layout.
	Align int64
}

// Validate checks the options.
func (o ShardOptions) Validate() error {
	if o.TargetSize < 0 {
		return fmt.Errorf("%w: negative shard size %d", ErrIndex, o.TargetSize)
	}
	if err := (WriterOptions{Align: o.Align}).Validate(); err != nil {
		return err
	}
	for i, s := range o.Sizes {
		if s < 0 {
			return fmt.Errorf("%w: Sizes[%d] = %d is negative", ErrIndex, i, s)
		}
	}
	return nil
}

// ShardName is the file name of shard i.
func ShardName(i int) string { return fmt.Sprintf("PART_%05d.ffr", i) }

// PlanShards splits samples of the given lengths into shards by the rule
// the ShardedWriter follows, returning each shard's sample count.
func PlanShards(sizes []int64, target, align int64) []int64 {
	if target <= 0 {
		target = DefaultShardSize
	}
	var out []int64
	var n, bytes int64
	for _, s := range sizes {
		if n > 0 && dataStart(n+1, align)+bytes+s > target {
			out = append(out, n)
			n, bytes = 0, 0
		}
		n++
		bytes += s
	}
	if n > 0 {
		out = append(out, n)
	}
	return out
}

// ShardedWriter writes a directory of FFRecord files without knowing the
// number of samples in advance, rolling to a new file at a target size.
// Shards are written into a hidden staging directory beside the output and
// published by Close with one directory rename (publish.go), so a reader
// sees the old dataset, the new one or nothing, never a prefix or a mix.
type ShardedWriter struct {
	ctx      context.Context
	fsys     fs.FS
	dir      string // inside fsys
	staging  string // inside fsys: where shards are written; "" once published
	staging0 string // the staging directory's name, kept after publishing
	display  string
	opts     ShardOptions
	plan     []int64 // shard sample counts, with Sizes
	// the current shard
	cur      *Writer // streaming mode
	buf      []byte  // buffered mode: the shard's samples
	lens     []int64
	crcs     []uint32
	count    int64    // samples written in total
	shards   []string // paths inside the staging directory
	err      error
	finished bool
	crashed  bool // PublishHookForTesting stopped Close: leave everything as is

	// Full streamed shards are closed (header written, synced, renamed to
	// their pending name) in the background while the next one fills.
	closers  chan struct{}  // one token per shard closing, at most 2
	closing  sync.WaitGroup // shards closing
	closeMu  sync.Mutex     // guards closeErr
	closeErr error          // first error of a background close

	// In buffered mode a full shard is written in the background while
	// the next one fills: at most one at a time (two shard buffers in
	// memory), its buffer handed back through spare when written.
	flushing chan struct{} // one token while a buffered shard is written
	spare    chan []byte   // the written shard's buffer, for reuse
}

// NewShardedWriter starts writing shards for the dataset directory dir
// (see publish.go: they are staged beside dir and published by Close in one
// rename). Leftovers of killed writers beside dir are cleaned first.
func NewShardedWriter(ctx context.Context, dir string, opts ShardOptions) (*ShardedWriter, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.TargetSize == 0 {
		opts.TargetSize = DefaultShardSize
	}
	fsys, name, err := fs.Resolve(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("ffrecord: %w", err)
	}
	name = path.Clean(name)
	if _, err := clean(ctx, fsys, name, dir); err != nil {
		return nil, err
	}
	if _, err := checkReplaceable(ctx, fsys, name, dir, opts.Overwrite); err != nil {
		return nil, err
	}
	staging := sideName(name, stagingTag)
	setActive(staging, true)
	if err := fsys.MkdirAll(ctx, staging); err != nil {
		setActive(staging, false)
		return nil, fmt.Errorf("ffrecord: create staging directory for %s: %w", dir, err)
	}
	w := &ShardedWriter{ctx: ctx, fsys: fsys, dir: name, staging: staging, staging0: staging, display: dir, opts: opts, closers: make(chan struct{}, 2), flushing: make(chan struct{}, 1), spare: make(chan []byte, 1)}
	if opts.Sizes != nil {
		w.plan = PlanShards(opts.Sizes, opts.TargetSize, opts.Align)
	}
	return w, nil
}

// CreateFile starts a file named name (a base name) inside the dataset: it
// is written into the staging directory and published with the shards.
// Commit it before Close.
func (w *ShardedWriter) CreateFile(name string) (fs.Writer, error) {
	if w.finished || w.staging == "" {
		return nil, fmt.Errorf("ffrecord: %s: CreateFile after Close", w.display)
	}
	if name == "" || strings.ContainsRune(name, '/') || strings.HasSuffix(name, ".ffr") {
		return nil, fmt.Errorf("ffrecord: %s: CreateFile %q: want a plain name that is not a shard", w.display, name)
	}
	fw, err := w.fsys.Create(w.ctx, path.Join(w.staging, name))
	if err != nil {
		return nil, fmt.Errorf("ffrecord: %s: create %s: %w", w.display, name, err)
	}
	return fw, nil
}

// Write appends the next sample.
func (w *ShardedWriter) Write(b []byte) error {
	return w.WriteCRC(b, crc32.Update(0, crcTable, b))
}

// WriteCRC appends the next sample whose CRC-32 the caller computed
// already (see Writer.WriteOneCRC).
func (w *ShardedWriter) WriteCRC(b []byte, crc uint32) error {
	if w.err != nil {
		return w.err
	}
	if w.finished {
		return fmt.Errorf("ffrecord: %s: write after Close", w.display)
	}
	if w.plan != nil {
		return w.writeStreaming(b, crc)
	}
	s := int64(len(b))
	if w.alone(s) {
		return w.writeAlone(s, func(cw *Writer) error { return cw.writeOne(b, crc) })
	}
	n := int64(len(w.lens))
	if n > 0 && dataStart(n+1, w.opts.Align)+int64(len(w.buf))+s > w.opts.TargetSize {
		if err := w.flush(); err != nil {
			return err
		}
	}
	w.buf = append(w.buf, b...)
	w.lens = append(w.lens, s)
	w.crcs = append(w.crcs, crc)
	w.count++
	return nil
}

// alone reports whether a sample of size bytes is a shard of its own
// whatever follows (not even an empty sample fits beside it), so that the
// buffered mode can stream it instead of holding it in memory.
func (w *ShardedWriter) alone(size int64) bool {
	return dataStart(2, w.opts.Align)+size > w.opts.TargetSize
}

// writeAlone writes the buffered shard, then one shard holding only the
// next sample, written by write.
func (w *ShardedWriter) writeAlone(size int64, write func(*Writer) error) error {
	if err := w.flush(); err != nil {
		return err
	}
	cw, err := w.startShard(len(w.shards), 1)
	if err != nil {
		return w.fail(err)
	}
	if err := write(cw); err != nil {
		cw.Abort()
		return w.fail(err)
	}
	if err := cw.Close(); err != nil {
		return w.fail(err)
	}
	w.count++
	return nil
}

func (w *ShardedWriter) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return w.err
}

// WriteFrom appends the next sample: exactly size bytes read from r (see
// Writer.WriteFrom). With ShardOptions.Sizes the bytes stream to the
// output; otherwise they are buffered with the shard.
func (w *ShardedWriter) WriteFrom(r io.Reader, size int64) error {
	if w.err != nil {
		return w.err
	}
	if w.plan == nil {
		if size < 0 {
			return w.fail(fmt.Errorf("%w: %s: sample %d: bad size %d", ErrIndex, w.display, w.count, size))
		}
		if w.alone(size) {
			return w.writeAlone(size, func(cw *Writer) error { return cw.WriteFrom(r, size) })
		}
		// Read straight into the shard's buffer (after closing the shard
		// if the sample does not fit), one copy fewer than Write.
		n := int64(len(w.lens))
		if n > 0 && dataStart(n+1, w.opts.Align)+int64(len(w.buf))+size > w.opts.TargetSize {
			if err := w.flush(); err != nil {
				return err
			}
		}
		at := len(w.buf)
		if cap(w.buf) == 0 {
			// A shard's buffer is sized once, not doubled as samples
			// arrive (doubling copied the first shard twice over). Its
			// pages are touched only as they fill.
			w.buf = make([]byte, 0, min(w.opts.TargetSize, 1<<30))
		}
		w.buf = slices.Grow(w.buf, int(size))[:at+int(size)]
		if _, err := io.ReadFull(r, w.buf[at:]); err != nil {
			w.buf = w.buf[:at]
			return w.fail(errkind.Wrap(errkind.Data, fmt.Errorf("ffrecord: %s: sample %d: reading the source: %w", w.display, w.count, err)))
		}
		w.lens = append(w.lens, size)
		w.crcs = append(w.crcs, crc32.Update(0, crcTable, w.buf[at:]))
		w.count++
		return nil
	}
	return w.streamOne(size, func(cw *Writer) error { return cw.WriteFrom(r, size) })
}

// WriteFromAt appends the next sample: the size bytes of r at off (see
// Writer.WriteFromAt).
func (w *ShardedWriter) WriteFromAt(r io.ReaderAt, off, size int64) error {
	if w.plan == nil {
		return w.WriteFrom(io.NewSectionReader(r, off, size), size)
	}
	if w.err != nil {
		return w.err
	}
	return w.streamOne(size, func(cw *Writer) error { return cw.WriteFromAt(r, off, size) })
}

// Reserve appends the next sample before its bytes are known (see
// Writer.Reserve). It needs ShardOptions.Sizes and an output that supports
// it (local files); a shard is published once all its samples are done.
func (w *ShardedWriter) Reserve(size int64) (bufs [][]byte, done func(crc uint32), err error) {
	if w.plan == nil {
		return nil, nil, fmt.Errorf("%w: the sharded writer needs Sizes to reserve", ErrNoReserve)
	}
	err = w.streamOne(size, func(cw *Writer) error {
		var e error
		bufs, done, e = cw.Reserve(size)
		return e
	})
	return bufs, done, err
}

func (w *ShardedWriter) writeStreaming(b []byte, crc uint32) error {
	return w.streamOne(int64(len(b)), func(cw *Writer) error { return cw.writeOne(b, crc) })
}

func (w *ShardedWriter) streamOne(size int64, write func(*Writer) error) error {
	if w.finished {
		return fmt.Errorf("ffrecord: %s: write after Close", w.display)
	}
	i := w.count
	if i >= int64(len(w.opts.Sizes)) {
		return w.fail(fmt.Errorf("%w: %s: sample %d is more than the %d sizes given", ErrIndex, w.display, i, len(w.opts.Sizes)))
	}
	if size != w.opts.Sizes[i] {
		return w.fail(fmt.Errorf("%w: %s: sample %d has %d bytes, its size was given as %d", ErrIndex, w.display, i, size, w.opts.Sizes[i]))
	}
	// A full shard is closed when the next sample arrives (or at Close),
	// not right after its last sample: with Reserve that sample is still
	// being filled by the caller when Reserve returns.
	if err := w.backgroundErr(); err != nil {
		return w.fail(err)
	}
	if w.cur != nil && w.cur.Written() == w.cur.n {
		cw := w.cur
		w.cur = nil
		w.closers <- struct{}{} // at most 2 shards closing (each stages up to 64 MiB)
		w.closing.Add(1)
		go func() {
			defer func() { <-w.closers; w.closing.Done() }()
			if err := cw.Close(); err != nil {
				w.closeMu.Lock()
				if w.closeErr == nil {
					w.closeErr = err
				}
				w.closeMu.Unlock()
			}
		}()
	}
	if w.cur == nil {
		shard := len(w.shards)
		cw, err := w.startShard(shard, w.plan[shard])
		if err != nil {
			return w.fail(err)
		}
		w.cur = cw
	}
	if err := write(w.cur); err != nil {
		return w.fail(err)
	}
	w.count++
	return nil
}

func (w *ShardedWriter) startShard(i int, n int64) (*Writer, error) {
	p := path.Join(w.staging, ShardName(i))
	cw, err := create(w.ctx, w.fsys, p, fs.Join(w.display, ShardName(i)), n, w.opts.Align)
	if err != nil {
		return nil, err
	}
	w.shards = append(w.shards, p)
	return cw, nil
}

// backgroundErr waits for nothing; it reports a failed background close.
func (w *ShardedWriter) backgroundErr() error {
	w.closeMu.Lock()
	defer w.closeMu.Unlock()
	return w.closeErr
}

// waitClosing waits for the background closes and reports their error.
func (w *ShardedWriter) waitClosing() error {
	w.closing.Wait()
	return w.backgroundErr()
}

func (w *ShardedWriter) commitCur() error {
	cw := w.cur
	w.cur = nil
	if err := cw.Close(); err != nil {
		return w.fail(err)
	}
	return nil
}

// flush writes the buffered shard.
func (w *ShardedWriter) flush() error {
	n := int64(len(w.lens))
	if n == 0 {
		return nil
	}
	if err := w.backgroundErr(); err != nil {
		return w.fail(err)
	}
	cw, err := w.startShard(len(w.shards), n)
	if err != nil {
		return w.fail(err)
	}
	buf, lens, crcs := w.buf, w.lens, w.crcs
	w.flushing <- struct{}{} // the previous shard is written: its buffer is spare
	w.closing.Add(1)
	go func() {
		defer func() { <-w.flushing; w.closing.Done() }()
		var off int64
		var err error
		for i, l := range lens {
			if err = cw.writeOne(buf[off:off+l], crcs[i]); err != nil {
				cw.Abort()
				break
			}
			off += l
		}
		if err == nil {
			err = cw.Close()
		}
		if err != nil {
			w.closeMu.Lock()
			if w.closeErr == nil {
				w.closeErr = err
			}
			w.closeMu.Unlock()
		}
		w.spare <- buf[:0]
	}()
	w.buf, w.lens, w.crcs = nil, nil, nil
	select {
	case b := <-w.spare:
		w.buf = b
	default:
	}
	return nil
}

// Count is the number of samples written so far.
func (w *ShardedWriter) Count() int64 { return w.count }

// Close writes the last shard and publishes all shards under their names
// (PART_00000.ffr, ...). It returns the published paths. A writer that
// received no sample publishes one empty shard, so the directory opens as
// an empty dataset rather than as no dataset.
func (w *ShardedWriter) Close() ([]string, error) {
	if w.finished {
		return nil, w.err
	}
	w.finished = true
	if w.err == nil && w.plan != nil && w.count != int64(len(w.opts.Sizes)) {
		w.fail(fmt.Errorf("%w: %s: %d sizes given, %d samples written", ErrIndex, w.display, len(w.opts.Sizes), w.count))
	}
	if w.err == nil && w.plan == nil {
		if len(w.lens) > 0 || len(w.shards) == 0 {
			if len(w.lens) == 0 {
				// an empty dataset: one header-only shard
				cw, err := w.startShard(0, 0)
				if err != nil {
					w.fail(err)
				} else if err := cw.Close(); err != nil {
					w.fail(err)
				}
			} else {
				w.flush()
			}
		}
	}
	if w.err == nil && w.cur != nil {
		w.commitCur() // the last streamed shard
	}
	if err := w.waitClosing(); err != nil {
		w.fail(err)
	}
	if w.err == nil && w.plan != nil && len(w.plan) == 0 {
		cw, err := w.startShard(0, 0)
		if err == nil {
			err = cw.Close()
		}
		if err != nil {
			w.fail(err)
		}
	}
	if w.err != nil {
		w.abort()
		return nil, w.err
	}
	err := w.publish()
	setActive(w.staging0, false)
	if err != nil {
		var stop hookStop
		w.crashed = errors.As(err, &stop) // as a crash at that step would leave it
		w.fail(err)
		w.abort()
		return nil, w.err
	}
	out := make([]string, len(w.shards))
	for i := range w.shards {
		out[i] = fs.Join(w.display, ShardName(i))
	}
	return out, nil
}

// Abort abandons the dataset: the staging directory is removed, nothing is published.
func (w *ShardedWriter) Abort() {
	if w.finished {
		return
	}
	w.finished = true
	w.fail(errors.New("ffrecord: sharded writer aborted"))
	w.abort()
}

func (w *ShardedWriter) abort() {
	w.waitClosing()
	if w.cur != nil {
		w.cur.Abort()
		w.cur = nil
	}
	if w.staging != "" && !w.crashed {
		removeAll(w.ctx, w.fsys, w.staging)
		w.staging = ""
	}
	setActive(w.staging0, false)
}
