package pack

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/ffkit/ffkit/fs"
)

// regular reports whether a tar member holds a file's bytes; a sparse
// member is an error.
func regular(archive string, h *tar.Header) (bool, error) {
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old archives use TypeRegA
		return true, nil
	case tar.TypeGNUSparse:
		return false, fmt.Errorf("%w: %s: member %s is a sparse file, which pack does not support", ErrUsage, archive, h.Name)
	}
	return false, nil // directories, links, devices
}

// gzipped reports whether f starts with the gzip magic.
func gzipped(f fs.File) bool {
	var head [2]byte
	n, _ := f.ReadAt(head[:], 0)
	return n == 2 && head[0] == 0x1f && head[1] == 0x8b
}

// member is a regular tar member at a known place.
type member struct {
	name      string
	off, size int64
}

// listTar lists the regular members of an uncompressed tar file, skipping
// their bytes without reading them.
func listTar(ctx context.Context, f fs.File, name string) ([]member, error) {
	sr := io.NewSectionReader(f, 0, f.Size())
	tr := tar.NewReader(sr) // sr is an io.Seeker: Next skips member data
	var out []member
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: bad tar archive after %d members: %w", ErrData, name, len(out), err)
		}
		ok, err := regular(name, h)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		pos, _ := sr.Seek(0, io.SeekCurrent)
		if pos+h.Size > f.Size() {
			return nil, fmt.Errorf("%w: %s: member %s runs past the end of the archive", ErrData, name, h.Name)
		}
		out = append(out, member{h.Name, pos, h.Size})
	}
	return out, nil
}

// openTar opens an uncompressed tar archive: one sample per regular member
// (or, with wds, per WebDataset key). A gzip archive is read as tar.gz.
func openTar(ctx context.Context, fsys fs.FS, name string, wds bool) (Source, error) {
	return openTars(ctx, fsys, []string{name}, wds)
}

// openTars opens tar shards in order as one source.
func openTars(ctx context.Context, fsys fs.FS, names []string, wds bool) (Source, error) {
	format := "tar"
	if wds {
		format = "webdataset"
	}
	l := newListed(ctx, format, fsys)
	for _, name := range names {
		f, err := fsys.Open(ctx, name, fs.OpenOptions{})
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("pack: %w", err)
		}
		if gzipped(f) {
			f.Close()
			l.Close()
			return openTarGzs(ctx, fsys, names, wds)
		}
		fi := l.addFile(name, f)
		ms, err := listTar(ctx, f, name)
		if err != nil {
			l.Close()
			return nil, err
		}
		if !wds {
			for _, m := range ms {
				l.samples = append(l.samples, Sample{Name: m.name, Size: m.size})
				l.ext1 = append(l.ext1, extent{file: fi, off: m.off, size: m.size})
			}
			continue
		}
		if l.extents == nil {
			l.extents = [][]extent{}
		}
		err = groupWebDataset(name, ms, func(key string, exts []string, group []member) error {
			hdr := containerHeader(exts, group)
			es := []extent{{file: -1, size: int64(len(hdr)), lit: hdr}}
			size := int64(len(hdr))
			for _, m := range group {
				es = append(es, extent{file: fi, off: m.off, size: m.size})
				size += m.size
			}
			l.samples = append(l.samples, Sample{Name: key, Size: size})
			l.extents = append(l.extents, es)
			return nil
		})
		if err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// splitKey splits a WebDataset member name into its key (the path up to
// the first dot of the last element) and its extension (the rest, lower
// case), as webdataset's base_plus_ext does; ok is false for names
// webdataset skips (no dot, or a __meta__ member at the top level).
func splitKey(name string) (key, ext string, ok bool) {
	if !strings.Contains(name, "/") && strings.HasPrefix(name, "__") && strings.HasSuffix(name, "__") {
		return "", "", false
	}
	dir, base := path.Split(name)
	i := strings.IndexByte(base, '.')
	if i <= 0 {
		return "", "", false
	}
	return dir + base[:i], strings.ToLower(base[i+1:]), true
}

// keyGroup collects consecutive members with the same key into one
// WebDataset sample, as webdataset's group_by_keys does, and hands each
// finished group to emit.
type keyGroup struct {
	archive string
	emit    func(key string, exts []string, group []member) error
	key     string
	exts    []string
	group   []member
}

// add adds member m; ok is false for a name webdataset skips. A member
// with a new key first emits the group before it.
func (g *keyGroup) add(m member) (ok bool, err error) {
	k, ext, ok := splitKey(m.name)
	if !ok {
		return false, nil
	}
	if k != g.key || len(g.group) == 0 {
		if err := g.flush(); err != nil {
			return true, err
		}
		g.key = k
	}
	for _, e := range g.exts {
		if e == ext {
			return true, fmt.Errorf("%w: %s: sample %s has two members with extension %q", ErrData, g.archive, k, ext)
		}
	}
	g.exts = append(g.exts, ext)
	g.group = append(g.group, m)
	return true, nil
}

// flush emits the group being collected, if any.
func (g *keyGroup) flush() error {
	if len(g.group) == 0 {
		return nil
	}
	err := g.emit(g.key, g.exts, g.group)
	g.exts, g.group = nil, nil
	return err
}

// groupWebDataset groups consecutive members with the same key into
// samples.
func groupWebDataset(archive string, ms []member, emit func(key string, exts []string, group []member) error) error {
	g := keyGroup{archive: archive, emit: emit}
	for _, m := range ms {
		if _, err := g.add(m); err != nil {
			return err
		}
	}
	return g.flush()
}

// Container layout constants (see doc.go).
const (
	containerMagic   = "FFWD"
	containerVersion = 1
)

// containerHeader encodes the header of a WebDataset sample.
func containerHeader(exts []string, group []member) []byte {
	n := 12
	for _, e := range exts {
		n += 2 + len(e) + 8
	}
	b := make([]byte, 0, n)
	b = append(b, containerMagic...)
	b = binary.LittleEndian.AppendUint32(b, containerVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(exts)))
	for i, e := range exts {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(e)))
		b = append(b, e...)
		b = binary.LittleEndian.AppendUint64(b, uint64(group[i].size))
	}
	return b
}

// ErrContainer: bytes that are not a WebDataset container.
var ErrContainer = errors.New("pack: not a WebDataset container")

// DecodeWebDataset splits a WebDataset container (see doc.go) into its
// members by extension. The values are subslices of b (no copy).
func DecodeWebDataset(b []byte) (map[string][]byte, error) {
	if len(b) < 12 || string(b[:4]) != containerMagic {
		return nil, fmt.Errorf("%w: no FFWD magic", ErrContainer)
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != containerVersion {
		return nil, fmt.Errorf("%w: version %d", ErrContainer, v)
	}
	count := binary.LittleEndian.Uint32(b[8:])
	pos := 12
	type ent struct {
		ext  string
		size uint64
	}
	var ents []ent
	for i := uint32(0); i < count; i++ {
		if pos+2 > len(b) {
			return nil, fmt.Errorf("%w: header cut short at entry %d", ErrContainer, i)
		}
		l := int(binary.LittleEndian.Uint16(b[pos:]))
		pos += 2
		if pos+l+8 > len(b) {
			return nil, fmt.Errorf("%w: header cut short at entry %d", ErrContainer, i)
		}
		ents = append(ents, ent{string(b[pos : pos+l]), binary.LittleEndian.Uint64(b[pos+l:])})
		pos += l + 8
	}
	out := make(map[string][]byte, len(ents))
	for _, e := range ents {
		if e.size > uint64(len(b)-pos) {
			return nil, fmt.Errorf("%w: member %q of %d bytes runs past the end", ErrContainer, e.ext, e.size)
		}
		out[e.ext] = b[pos : pos+int(e.size) : pos+int(e.size)]
		pos += int(e.size)
	}
	if pos != len(b) {
		return nil, fmt.Errorf("%w: %d bytes after the last member", ErrContainer, len(b)-pos)
	}
	return out, nil
}

// streamTars is a source over gzip tar archives, read front to back once.
type streamTars struct {
	fsys  fs.FS
	names []string
	wds   bool
}

func openTarGz(ctx context.Context, fsys fs.FS, name string, wds bool) (Source, error) {
	return openTarGzs(ctx, fsys, []string{name}, wds)
}

func openTarGzs(ctx context.Context, fsys fs.FS, names []string, wds bool) (Source, error) {
	return &streamTars{fsys: fsys, names: names, wds: wds}, nil
}

func (s *streamTars) Format() string {
	if s.wds {
		return "webdataset"
	}
	return "tar.gz"
}

func (s *streamTars) Close() error { return nil }

func (s *streamTars) Walk(ctx context.Context, fn func(Sample, io.Reader) error) error {
	for _, name := range s.names {
		if err := s.walkOne(ctx, name, fn); err != nil {
			return err
		}
	}
	return nil
}

func (s *streamTars) walkOne(ctx context.Context, name string, fn func(Sample, io.Reader) error) error {
	f, err := s.fsys.Open(ctx, name, fs.OpenOptions{})
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	defer f.Close()
	var r io.Reader = bufio.NewReaderSize(io.NewSectionReader(f, 0, f.Size()), 1<<20)
	if gzipped(f) {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrData, name, err)
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	// WebDataset: the members of the current key, held until the key changes.
	var data [][]byte
	g := keyGroup{archive: name, emit: func(key string, exts []string, group []member) error {
		hdr := containerHeader(exts, group)
		size := int64(len(hdr))
		readers := []io.Reader{bytes.NewReader(hdr)}
		for _, d := range data {
			size += int64(len(d))
			readers = append(readers, bytes.NewReader(d))
		}
		data = nil
		return fn(Sample{Name: key, Size: size}, io.MultiReader(readers...))
	}}
	count := 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %s: bad gzip tar archive after %d members: %w", ErrData, name, count, err)
		}
		ok, err := regular(name, h)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		count++
		if !s.wds {
			cr := &countReader{r: tr}
			if err := fn(Sample{Name: h.Name, Size: h.Size}, cr); err != nil {
				return err
			}
			continue
		}
		if ok, err := g.add(member{name: h.Name, size: h.Size}); err != nil || !ok {
			if err != nil {
				return err
			}
			continue
		}
		b := make([]byte, h.Size)
		if _, err := io.ReadFull(tr, b); err != nil {
			return fmt.Errorf("%w: %s: member %s: %w", ErrData, name, h.Name, err)
		}
		data = append(data, b)
	}
	return g.flush()
}

// countReader passes reads through (a named type so that io.Copy sees no
// WriterTo it should not use on a tar reader).
type countReader struct{ r io.Reader }

func (c *countReader) Read(p []byte) (int, error) { return c.r.Read(p) }

// openWebDataset opens WebDataset shards: one tar (or gzip tar) file, or a
// directory of them (*.tar, *.tar.gz, *.tgz, in name order).
func openWebDataset(ctx context.Context, fsys fs.FS, name string, isDir bool) (Source, error) {
	if !isDir {
		return openTars(ctx, fsys, []string{name}, true)
	}
	ents, err := fsys.List(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("pack: list %s: %w", name, err)
	}
	var names []string
	for _, e := range ents {
		l := strings.ToLower(e.Name)
		if !e.IsDir && (strings.HasSuffix(l, ".tar") || strings.HasSuffix(l, ".tar.gz") || strings.HasSuffix(l, ".tgz")) {
			names = append(names, path.Join(name, e.Name))
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: directory %s holds no WebDataset shard (*.tar, *.tar.gz, *.tgz)", ErrUsage, name)
	}
	sort.Strings(names)
	return openTars(ctx, fsys, names, true)
}
