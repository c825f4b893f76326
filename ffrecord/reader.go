package ffrecord

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
	_ "github.com/ffkit/ffkit/fs/localfs" // plain paths resolve to local files
)

// Defaults for ReadOptions.
const (
	DefaultParallelism = 64
	// DefaultMergeGap: two samples of one file whose gap is at most this
	// many bytes are read with one request. On NVMe and virtio disks one
	// extra request costs about as much as reading 16-32 KiB, and from the
	// page cache a syscall costs about as much as copying 16 KiB.
	DefaultMergeGap = 16 << 10
	// maxMergeSpan caps one merged read, so a long run of neighbours still
	// spreads over several parallel reads.
	maxMergeSpan = 4 << 20
	// directAlign is the O_DIRECT alignment of offsets, lengths and buffers.
	directAlign = 4096
)

// ReadOptions tune a Reader. The zero value is the default.
type ReadOptions struct {
	// Direct reads with O_DIRECT, bypassing the page cache (for datasets
	// larger than memory). Reads are widened to 4 KiB alignment inside.
	Direct bool
	// DirectAuto makes Open choose Direct for the dataset by the rule in
	// direct.go (O_DIRECT only for a dataset much larger than the memory
	// the page cache can use); Direct is then ignored. Reader.DirectChoice
	// says what was chosen and why. Default off.
	DirectAuto bool
	// NoVerify skips the per-sample CRC-32 checks. Default: verify.
	NoVerify bool
	// Parallelism is the number of reads in flight per batch. Default 64.
	Parallelism int
	// MaxInFlight bounds the reads in flight across all the batches this
	// Reader reads at the same time (a loader's prefetch, several
	// goroutines). Each batch may use up to Parallelism of it, and what one
	// batch leaves unused while it plans, checks or drains its last reads
	// goes to the others, so the device's queue stays at MaxInFlight.
	// 0: no bound beyond Parallelism per batch.
	MaxInFlight int
	// MergeGap merges neighbouring ranges of one file whose gap is at most
	// this many bytes into one read. 0 means DefaultMergeGap; < 0 never merges.
	MergeGap int64
	// Warn receives warnings (a legacy file with header checksum 0).
	// Default: print to stderr.
	Warn func(msg string)
	// AllowDamaged opens a dataset some of whose files are damaged instead
	// of failing: a truncated file serves the samples before the cut; a
	// file whose header is damaged keeps the sample count its header
	// claims (0 when not even that is readable) and serves none. Reading a
	// sample they cannot serve fails with a *SampleError naming it, without
	// touching the file; Damaged lists the files. Default: Open fails on
	// the first damaged file.
	AllowDamaged bool
}

// Validate checks the options.
func (o ReadOptions) Validate() error {
	if o.Parallelism < 0 {
		return fmt.Errorf("%w: Parallelism %d is negative", ErrIndex, o.Parallelism)
	}
	if o.MaxInFlight < 0 {
		return fmt.Errorf("%w: MaxInFlight %d is negative", ErrIndex, o.MaxInFlight)
	}
	return nil
}

func (o *ReadOptions) fill() {
	if o.Parallelism == 0 {
		o.Parallelism = DefaultParallelism
	}
	if o.MergeGap == 0 {
		o.MergeGap = DefaultMergeGap
	}
	if o.Warn == nil {
		o.Warn = func(msg string) { fmt.Fprintln(os.Stderr, "ffrecord: warning:", msg) }
	}
}

// FileMeta describes one file of a dataset.
type FileMeta struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	N    int64  `json:"n"`
	// First is the global index of the file's first sample.
	First int64 `json:"first"`
	// HeaderCRC is the CRC-32 of the header bytes [4, 12+12n): the stored
	// header checksum, or for a legacy file the one it should have stored.
	HeaderCRC uint32 `json:"header_crc"`
	// Legacy: the stored header checksum is 0, so the header was not checked.
	Legacy bool `json:"legacy"`
}

// Reader reads samples of a dataset of FFRecord files. It is safe for
// concurrent use.
type Reader struct {
	opts   ReadOptions
	choice DirectChoice
	budget *fs.Budget // from opts.MaxInFlight; nil: unbounded
	files  []*file
	firsts []int64 // firsts[i]: global index of file i's first sample; firsts[len(files)] = N
	n      int64
}

type file struct {
	h    *header
	fsys fs.FS // nil: read with File.ReadAt (OpenFiles)
	f    fs.File
}

// Open opens a dataset. Each path is one .ffr file or a directory of *.ffr
// files (not recursive, sorted by name as byte strings), a local path or a
// URL; all are concatenated into one dataset. Every header is read and
// validated (see the package documentation).
func Open(ctx context.Context, paths []string, opts ReadOptions) (*Reader, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.fill()
	srcs, err := expand(ctx, paths)
	if err != nil {
		return nil, err
	}
	choice := askedDirect(opts.Direct)
	if opts.DirectAuto {
		if choice, err = chooseDirect(ctx, srcs); err != nil {
			return nil, err
		}
		opts.Direct = choice.Direct
	}
	files := make([]*file, len(srcs))
	errs := make([]error, len(srcs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, s := range srcs {
		g.Go(func() error {
			f, err := s.fsys.Open(gctx, s.name, fs.OpenOptions{Direct: opts.Direct})
			if err != nil {
				errs[i] = fmt.Errorf("ffrecord: open %s: %w", s.display, err)
				return errs[i]
			}
			h, err := readHeader(gctx, f, s.display)
			if err != nil && opts.AllowDamaged && gctx.Err() == nil && !isIOError(err) {
				h = damagedHeader(f, s.display, h, err)
				err = nil
			}
			if err != nil {
				f.Close()
				errs[i] = err
				return err
			}
			files[i] = &file{h: h, fsys: s.fsys, f: f}
			return nil
		})
	}
	werr := g.Wait()
	if werr != nil {
		for _, f := range files {
			if f != nil {
				f.f.Close()
			}
		}
		// Report the failure of the first file in dataset order, not the
		// first to finish, so the message is deterministic.
		for _, e := range errs {
			if e != nil && !errors.Is(e, context.Canceled) {
				return nil, e
			}
		}
		return nil, werr
	}
	r := newReader(files, opts)
	r.choice = choice
	return r, nil
}

// DirectChoice says whether the Reader reads with O_DIRECT and why (with
// ReadOptions.DirectAuto, what the rule saw).
func (r *Reader) DirectChoice() DirectChoice { return r.choice }

// OpenFiles opens a dataset of already open files, read with their ReadAt
// (no batched reads of a file system). The Reader does not close them.
func OpenFiles(ctx context.Context, files []fs.File, opts ReadOptions) (*Reader, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.fill()
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: no files given", ErrNoFiles)
	}
	fl := make([]*file, len(files))
	for i, f := range files {
		h, err := readHeader(ctx, f, f.Name())
		if err != nil {
			return nil, err
		}
		fl[i] = &file{h: h, f: noClose{f}}
	}
	return newReader(fl, opts), nil
}

type noClose struct{ fs.File }

func (noClose) Close() error { return nil }

func newReader(files []*file, opts ReadOptions) *Reader {
	r := &Reader{opts: opts, choice: askedDirect(opts.Direct), budget: fs.NewBudget(opts.MaxInFlight), files: files, firsts: make([]int64, len(files)+1)}
	for i, f := range files {
		r.firsts[i] = r.n
		r.n += f.h.n
		if f.h.legacy {
			opts.Warn(fmt.Sprintf("%s: header checksum is 0 (legacy file): header not verified, sample checksums still are", f.h.path))
		}
	}
	r.firsts[len(files)] = r.n
	return r
}

type source struct {
	fsys    fs.FS
	name    string // path inside fsys
	display string // path as the user wrote it
}

// expand resolves paths and lists directories.
func expand(ctx context.Context, paths []string) ([]source, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: no path given", ErrNoFiles)
	}
	var out []source
	for _, p := range paths {
		fsys, name, err := fs.Resolve(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("ffrecord: %w", err)
		}
		st, err := fsys.Stat(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("ffrecord: %s: %w", p, err)
		}
		if !st.IsDir {
			out = append(out, source{fsys, name, p})
			continue
		}
		ents, err := fsys.List(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("ffrecord: list %s: %w", p, err)
		}
		var names []string
		for _, e := range ents {
			if !e.IsDir && strings.HasSuffix(e.Name, ".ffr") {
				names = append(names, e.Name)
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("%w: directory %s holds no *.ffr file", ErrNoFiles, p)
		}
		sort.Strings(names) // bytewise, whatever the FS did
		for _, nm := range names {
			out = append(out, source{fsys, fs.Join(name, nm), fs.Join(p, nm)})
		}
	}
	return out, nil
}

// N is the number of samples in the dataset.
func (r *Reader) N() int64 { return r.n }

// Files describes the dataset's files in order.
func (r *Reader) Files() []FileMeta {
	out := make([]FileMeta, len(r.files))
	for i, f := range r.files {
		out[i] = FileMeta{Path: f.h.path, Size: f.h.size, N: f.h.n, First: r.firsts[i],
			HeaderCRC: f.h.computed, Legacy: f.h.legacy}
	}
	return out
}

// Options returns the options the Reader runs with, defaults filled in.
func (r *Reader) Options() ReadOptions { return r.opts }

// fileOf returns the file holding global sample i and i's local index.
func (r *Reader) fileOf(i int64) (int, int64, error) {
	if i < 0 || i >= r.n {
		return 0, 0, fmt.Errorf("%w: index %d, the dataset has %d samples", ErrIndex, i, r.n)
	}
	if len(r.files) == 1 {
		return 0, i, nil
	}
	// firsts is sorted; the file is the first k with firsts[k+1] > i (the
	// last one whose first <= i with n > 0). A binary search written out:
	// sort.Search's call per step showed in warm batch profiles.
	lo, hi := 0, len(r.files)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r.firsts[m+1] > i {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo, i - r.firsts[lo], nil
}

// Locate returns the file (index into Files), byte offset and length of
// global sample i.
func (r *Reader) Locate(i int64) (file int, off, length int64, err error) {
	k, l, err := r.fileOf(i)
	if err != nil {
		return 0, 0, 0, err
	}
	h := r.files[k].h
	return k, h.offsets[l], h.end(l) - h.offsets[l], nil
}

// StoredCRC returns the CRC-32 the file stores for sample i (what
// Checksum of its bytes must give), for readers that read samples
// themselves.
func (r *Reader) StoredCRC(i int64) (uint32, error) {
	k, l, err := r.fileOf(i)
	if err != nil {
		return 0, err
	}
	return r.files[k].h.crcs[l], nil
}

// BatchSize returns the total bytes of the samples (duplicates counted
// each time): the buffer size ReadBatchInto needs.
func (r *Reader) BatchSize(indices []int64) (int64, error) {
	var total int64
	for _, i := range indices {
		_, _, l, err := r.Locate(i)
		if err != nil {
			return 0, err
		}
		total += l
	}
	return total, nil
}

// ReadOne reads global sample i into a new slice.
func (r *Reader) ReadOne(ctx context.Context, i int64) ([]byte, error) {
	out, err := r.ReadBatch(ctx, []int64{i})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// ReadBatch reads the samples in request order (duplicates allowed) into
// one new buffer that the caller owns.
func (r *Reader) ReadBatch(ctx context.Context, indices []int64) ([][]byte, error) {
	size, err := r.BatchSize(indices)
	if err != nil {
		return nil, err
	}
	return r.ReadBatchInto(ctx, indices, make([]byte, size))
}

// ReadBatchInto reads the samples in request order into buf, which must
// hold at least BatchSize(indices) bytes. The returned samples are
// subslices of buf (capacity-limited, so appending to one never overwrites
// another); every duplicate gets its own copy. On error buf's contents are
// undefined.
func (r *Reader) ReadBatchInto(ctx context.Context, indices []int64, buf []byte) ([][]byte, error) {
	p, err := r.plan(indices, int64(len(buf)))
	if err != nil {
		return nil, err
	}
	defer p.release()
	return p.run(ctx, buf)
}

// Close closes the files. The Reader must not be used afterwards.
func (r *Reader) Close() error {
	var first error
	for _, f := range r.files {
		if err := f.f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Fingerprint identifies a dataset's content: sample count and, per file,
// size, sample count and header checksum. Hash does not depend on where the
// files live, so a moved dataset keeps its fingerprint.
type Fingerprint struct {
	Samples int64             `json:"samples"`
	Files   []FileFingerprint `json:"files"`
	Hash    string            `json:"hash"`
}

// FileFingerprint is one file's part of a Fingerprint.
type FileFingerprint struct {
	Name      string `json:"name"` // base name, informative only
	Size      int64  `json:"size"`
	N         int64  `json:"n"`
	HeaderCRC uint32 `json:"header_crc"`
}

// Fingerprint returns the dataset's fingerprint.
func (r *Reader) Fingerprint() Fingerprint {
	fp := Fingerprint{Samples: r.n, Files: make([]FileFingerprint, len(r.files))}
	hs := sha256.New()
	hs.Write([]byte("ffkit-ffrecord-fingerprint-v1\x00"))
	var b [8]byte
	put := func(v uint64) { binary.LittleEndian.PutUint64(b[:], v); hs.Write(b[:]) }
	put(uint64(r.n))
	put(uint64(len(r.files)))
	for i, f := range r.files {
		name := f.h.path
		if j := strings.LastIndexByte(name, '/'); j >= 0 {
			name = name[j+1:]
		}
		fp.Files[i] = FileFingerprint{Name: name, Size: f.h.size, N: f.h.n, HeaderCRC: f.h.computed}
		put(uint64(f.h.size))
		put(uint64(f.h.n))
		put(uint64(f.h.computed))
	}
	fp.Hash = hex.EncodeToString(hs.Sum(nil))
	return fp
}

// Equal reports whether two fingerprints name the same content.
func (fp Fingerprint) Equal(o Fingerprint) bool { return fp.Hash == o.Hash && fp.Samples == o.Samples }

// Stats summarises a dataset (for inspect).
type Stats struct {
	Files     int   `json:"files"`
	Samples   int64 `json:"samples"`
	Bytes     int64 `json:"bytes"`      // total size of the files
	DataBytes int64 `json:"data_bytes"` // total size of the samples
	MinLen    int64 `json:"min_sample"`
	MedianLen int64 `json:"median_sample"`
	MaxLen    int64 `json:"max_sample"`
	Legacy    int   `json:"legacy_files"`
}

// Stats computes the dataset's statistics from the headers.
func (r *Reader) Stats() Stats {
	s := Stats{Files: len(r.files), Samples: r.n}
	lens := make([]int64, 0, r.n)
	for _, f := range r.files {
		s.Bytes += f.h.size
		if f.h.legacy {
			s.Legacy++
		}
		for i := range f.h.n {
			if f.h.broken != nil && i >= f.h.damaged {
				break // a damaged file's unreadable samples have no size
			}
			lens = append(lens, f.h.end(i)-f.h.offsets[i])
		}
	}
	if len(lens) > 0 {
		slices.Sort(lens)
		s.MinLen, s.MaxLen = lens[0], lens[len(lens)-1]
		s.MedianLen = lens[len(lens)/2]
		for _, l := range lens {
			s.DataBytes += l
		}
	}
	return s
}

// LargestSamples returns the lengths of the k largest samples, largest
// first (fewer when the dataset has fewer): what a caller sizing buffers
// for batches of k samples must be ready for.
func (r *Reader) LargestSamples(k int) []int64 {
	if k <= 0 {
		return nil
	}
	h := make(minHeap, 0, min(int64(k), r.n))
	for _, f := range r.files {
		for i := range f.h.n {
			l := f.h.end(i) - f.h.offsets[i]
			if len(h) < k {
				h.push(l)
			} else if l > h[0] {
				h[0] = l
				h.down(0)
			}
		}
	}
	slices.Sort(h)
	slices.Reverse(h)
	return h
}

// minHeap is a binary min-heap of lengths.
type minHeap []int64

func (h *minHeap) push(v int64) {
	*h = append(*h, v)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if s[p] <= s[i] {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h minHeap) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1] < h[c] {
			c++
		}
		if h[i] <= h[c] {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// isIOError reports whether a header error is a failure to read rather
// than damage (those fail Open even with AllowDamaged).
func isIOError(err error) bool {
	return !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrCorrupt)
}

// damagedHeader is the header Open keeps for a damaged file under
// AllowDamaged: the intact part of a truncated file's header, or, for a
// damaged header, the sample count it claims with every sample unreadable.
func damagedHeader(f fs.File, path string, h *header, err error) *header {
	if h != nil && h.damaged >= 0 && int64(len(h.offsets)) == h.n {
		h.broken = err
		return h
	}
	n := claimedSamples(f)
	if h != nil {
		n = h.n // cut inside the header: the count is genuine
	}
	if n < 0 {
		n = 0
	}
	h = &header{path: path, size: f.Size(), n: n, damaged: 0, broken: err,
		crcs: make([]uint32, n), offsets: make([]int64, n)}
	for i := range h.offsets {
		h.offsets[i] = h.size // nothing of it is read: zero-length samples
	}
	return h
}

// DamagedFile describes a file Open kept under AllowDamaged.
type DamagedFile struct {
	Path string `json:"path"`
	// Samples is the file's sample count (claimed by a damaged header).
	Samples int64 `json:"samples"`
	// First is the global index of the file's first sample.
	First int64 `json:"first"`
	// Readable is how many of its samples, from the first, can be read.
	Readable int64 `json:"readable"`
	// Err says what is wrong.
	Err error `json:"-"`
}

// Damaged lists the damaged files of a dataset opened with AllowDamaged,
// in dataset order.
func (r *Reader) Damaged() []DamagedFile {
	var out []DamagedFile
	for i, f := range r.files {
		if f.h.broken != nil {
			out = append(out, DamagedFile{Path: f.h.path, Samples: f.h.n, First: r.firsts[i], Readable: f.h.damaged, Err: f.h.broken})
		}
	}
	return out
}
