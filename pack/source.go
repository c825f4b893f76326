package pack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/errkind"
)

// Errors of this package.
var (
	// ErrUsage: a request that makes no sense (an unknown format, a source
	// of the wrong kind).
	ErrUsage = errkind.New(errkind.Usage, "pack: bad request")
	// ErrData: the source's bytes are malformed.
	ErrData = errkind.New(errkind.Data, "pack: bad source data")
)

// Sample is one sample of a source.
type Sample struct {
	Name string // source name, for the sidecar index
	Size int64  // bytes
}

// Source is a set of samples in a stable order.
type Source interface {
	// Format names the source's format ("files", "jsonl", "tar",
	// "tar.gz", "webdataset", "parquet", "arrow").
	Format() string
	// Walk calls fn for every sample in order with a reader of exactly
	// s.Size bytes, valid until fn returns. fn may leave bytes unread.
	Walk(ctx context.Context, fn func(s Sample, r io.Reader) error) error
	// Close releases the source's files.
	Close() error
}

// Listed is a Source whose samples are all known up front and can be
// read at random.
type Listed interface {
	Source
	// Samples lists every sample, in order. The slice is the source's.
	Samples() []Sample
	// ReaderAt returns sample i's bytes as a ReaderAt of [0, Size). It is
	// safe to call and to read from concurrently.
	ReaderAt(i int) io.ReaderAt
	// Done tells the source that sample i is read, so that a file opened
	// for it alone is closed.
	Done(i int)
}

// extent is a piece of a sample: bytes of an open file, or literal bytes.
type extent struct {
	file int // index into listed.files; -1 for lit
	off  int64
	size int64
	lit  []byte
}

// listed is a Listed source over extents of files opened through fs.
type listed struct {
	format  string
	samples []Sample
	extents [][]extent // per sample; nil means one extent: ext1[i]
	ext1    []extent   // the single extent of sample i, when extents is nil

	mu    sync.Mutex
	fsys  fs.FS
	names []string  // file paths inside fsys
	files []fs.File // opened on first use; guarded by mu
	errs  []error   // guarded by mu
	open  func(name string) (fs.File, error)
	// perSample: file i belongs to sample i alone and is closed by Done.
	perSample bool
	done      context.Context
}

func newListed(ctx context.Context, format string, fsys fs.FS) *listed {
	l := &listed{format: format, fsys: fsys, done: ctx}
	l.open = func(name string) (fs.File, error) { return fsys.Open(ctx, name, fs.OpenOptions{}) }
	return l
}

// addFile registers a file (opened lazily, kept open) and returns its index.
func (l *listed) addFile(name string, f fs.File) int {
	l.names = append(l.names, name)
	l.files = append(l.files, f)
	l.errs = append(l.errs, nil)
	return len(l.names) - 1
}

func (l *listed) file(i int) (fs.File, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.files[i] == nil && l.errs[i] == nil {
		l.files[i], l.errs[i] = l.open(l.names[i])
	}
	if l.errs[i] != nil {
		return nil, fmt.Errorf("pack: open %s: %w", l.names[i], l.errs[i])
	}
	return l.files[i], nil
}

// closeFile closes a file opened for one sample (a directory source opens
// each file when it is read and closes it after).
func (l *listed) closeFile(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.files[i] != nil {
		l.files[i].Close()
		l.files[i] = nil
	}
}

func (l *listed) Done(i int) {
	if l.perSample {
		l.closeFile(i)
	}
}

func (l *listed) Format() string    { return l.format }
func (l *listed) Samples() []Sample { return l.samples }
func (l *listed) exts(i int) []extent {
	if l.extents != nil {
		return l.extents[i]
	}
	return l.ext1[i : i+1]
}

func (l *listed) ReaderAt(i int) io.ReaderAt {
	return &sampleReader{l: l, exts: l.exts(i), name: l.samples[i].Name}
}

func (l *listed) Walk(ctx context.Context, fn func(Sample, io.Reader) error) error {
	for i, s := range l.samples {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := fn(s, io.NewSectionReader(l.ReaderAt(i), 0, s.Size))
		l.Done(i)
		if err != nil {
			return err
		}
	}
	return nil
}

func (l *listed) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for i, f := range l.files {
		if f != nil {
			errs = append(errs, f.Close())
			l.files[i] = nil
		}
	}
	return errors.Join(errs...)
}

// sampleReader reads a sample's extents as one range. A short read of a
// file (it changed since it was listed) is an error naming the sample.
type sampleReader struct {
	l    *listed
	exts []extent
	name string
}

func (r *sampleReader) ReadAt(p []byte, off int64) (int, error) {
	if err := r.l.done.Err(); err != nil {
		return 0, err // a signal stops a huge sample between reads
	}
	n := 0
	var pos int64
	for _, e := range r.exts {
		if len(p) == 0 {
			break
		}
		if off >= pos+e.size {
			pos += e.size
			continue
		}
		in := off - pos
		k := min(int64(len(p)), e.size-in)
		if e.file < 0 {
			copy(p[:k], e.lit[in:in+k])
		} else {
			f, err := r.l.file(e.file)
			if err != nil {
				return n, err
			}
			got, err := f.ReadAt(p[:k], e.off+in)
			if int64(got) < k {
				if err == nil || err == io.EOF {
					err = errkind.Wrap(errkind.Data, fmt.Errorf("%w: %s changed while packing: %s is cut short", ErrData, r.l.names[e.file], r.name))
				}
				return n + got, err
			}
		}
		n += int(k)
		p = p[k:]
		off += k
		pos += e.size
	}
	if len(p) > 0 {
		return n, io.EOF
	}
	return n, nil
}

// Options tune how a source is opened. The zero value detects the format.
type Options struct {
	// Format: "auto" or "" (detect), "files", "jsonl", "tar", "tar.gz",
	// "webdataset", "parquet" or "arrow".
	Format string
	// Column is the table column whose bytes are the samples; "" packs
	// whole rows as JSON (tables only).
	Column string
}

// Formats lists the formats Open accepts.
var Formats = []string{"files", "jsonl", "tar", "tar.gz", "webdataset", "parquet", "arrow"}

// Open opens the source at src (a local path or a URL).
func Open(ctx context.Context, src string, o Options) (Source, error) {
	fsys, name, err := fs.Resolve(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("pack: source %s: %w", src, err)
	}
	st, err := fsys.Stat(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("pack: source: %w", err)
	}
	format, err := detect(ctx, fsys, name, src, st.IsDir, o.Format)
	if err != nil {
		return nil, err
	}
	if o.Column != "" && format != "parquet" && format != "arrow" {
		return nil, fmt.Errorf("%w: a column applies to parquet and arrow sources; %s is %s", ErrUsage, src, format)
	}
	switch format {
	case "files":
		return openDir(ctx, fsys, name)
	case "jsonl":
		return openJSONL(ctx, fsys, name)
	case "tar":
		return openTar(ctx, fsys, name, false)
	case "tar.gz":
		return openTarGz(ctx, fsys, name, false)
	case "webdataset":
		return openWebDataset(ctx, fsys, name, st.IsDir)
	case "parquet", "arrow":
		return openTable(ctx, fsys, name, format, o.Column)
	}
	return nil, fmt.Errorf("%w: format %q", ErrUsage, format)
}

// detect names src's format: the one asked for, checked against what src
// is, or the one its name or first bytes show.
func detect(ctx context.Context, fsys fs.FS, name, src string, isDir bool, format string) (string, error) {
	switch format {
	case "files":
		if !isDir {
			return "", fmt.Errorf("%w: --format files needs a directory; %s is a file", ErrUsage, src)
		}
		return format, nil
	case "webdataset":
		return format, nil // a tar shard or a directory of them
	case "jsonl", "tar", "tar.gz", "parquet", "arrow":
		if isDir {
			return "", fmt.Errorf("%w: --format %s needs a file; %s is a directory", ErrUsage, format, src)
		}
		return format, nil
	case "auto", "":
	default:
		return "", fmt.Errorf("%w: --format must be auto, %s; got %q", ErrUsage, strings.Join(Formats, ", "), format)
	}
	if isDir {
		return "files", nil
	}
	lower := strings.ToLower(path.Base(name))
	switch {
	case strings.HasSuffix(lower, ".tar"):
		return "tar", nil
	case strings.HasSuffix(lower, ".tar.gz"), strings.HasSuffix(lower, ".tgz"):
		return "tar.gz", nil
	case strings.HasSuffix(lower, ".jsonl"), strings.HasSuffix(lower, ".ndjson"), strings.HasSuffix(lower, ".json"):
		return "jsonl", nil
	case strings.HasSuffix(lower, ".parquet"):
		return "parquet", nil
	case strings.HasSuffix(lower, ".arrow"), strings.HasSuffix(lower, ".feather"), strings.HasSuffix(lower, ".ipc"):
		return "arrow", nil
	}
	f, err := fsys.Open(ctx, name, fs.OpenOptions{})
	if err != nil {
		return "", fmt.Errorf("pack: source: %w", err)
	}
	defer f.Close()
	head := make([]byte, min(512, f.Size()))
	n, _ := f.ReadAt(head, 0)
	head = head[:n]
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return "tar.gz", nil // gzip: read as a tar inside; an error says if it is not
	case n >= 263 && bytes.HasPrefix(head[257:], []byte("ustar")):
		return "tar", nil
	case bytes.HasPrefix(head, []byte("PAR1")):
		return "parquet", nil
	case bytes.HasPrefix(head, []byte("ARROW1")), bytes.HasPrefix(head, []byte{0xff, 0xff, 0xff, 0xff}):
		return "arrow", nil
	}
	if t := bytes.TrimLeft(head, " \t\r\n"); len(t) > 0 && (t[0] == '{' || t[0] == '[' || t[0] == '"') {
		return "jsonl", nil
	}
	return "", fmt.Errorf("%w: cannot tell the format of %s: its name has no known extension and it starts with %s, which is none of tar (ustar at byte 257), gzip (1f 8b), Parquet (PAR1), Arrow (ARROW1) or JSON; pass --format", ErrUsage, src, describeHead(head))
}

// describeHead shows the first bytes of a file for an error message.
func describeHead(b []byte) string {
	if len(b) == 0 {
		return "nothing (it is empty)"
	}
	b = b[:min(len(b), 8)]
	return fmt.Sprintf("bytes % x (%q)", b, b)
}
