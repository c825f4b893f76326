package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	pathpkg "path"
	"sync"

	"github.com/ffkit/ffkit/fs"
)

// Workdir is the directory a storage benchmark works in: a local
// directory or an ffkit:// URL, created if missing. Every file the
// benchmark creates is tracked and removed by Cleanup unless Keep is set;
// files that were there before are never removed.
type Workdir struct {
	FS fs.FS
	// Dir is the directory inside FS.
	Dir string
	// Path is the user's path (a local path or a URL).
	Path string
	// Remote is true for URL paths: fio cannot run there and this
	// machine's page cache does not hold the files.
	Remote bool
	// Keep leaves the benchmark's files in place.
	Keep bool

	mu      sync.Mutex
	created []string // guarded by mu
	// createdDirs are the directories OpenWorkdir created, deepest first.
	createdDirs []string
}

// OpenWorkdir resolves path and creates the directory if missing.
func OpenWorkdir(ctx context.Context, path string, keep bool) (*Workdir, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: empty path", ErrBadArg)
	}
	f, dir, err := fs.Resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	w := &Workdir{FS: f, Dir: dir, Path: path, Remote: fs.IsURL(path), Keep: keep}
	st, err := f.Stat(ctx, dir)
	switch {
	case err == nil && !st.IsDir:
		return nil, fmt.Errorf("%w: %s is a file, not a directory", ErrBadArg, path)
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		// Remember which directories are new, so Cleanup removes them all.
		for d := dir; ; d = pathpkg.Dir(d) {
			if _, err := f.Stat(ctx, d); err == nil || !errors.Is(err, fs.ErrNotExist) {
				break
			}
			w.createdDirs = append(w.createdDirs, d)
			if d == "/" || d == "." || pathpkg.Dir(d) == d {
				break
			}
		}
		if err := f.MkdirAll(ctx, dir); err != nil {
			return nil, fmt.Errorf("create %s: %w", path, err)
		}
	default:
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	return w, nil
}

// Join returns the path of name inside the directory (for the FS).
func (w *Workdir) Join(name string) string { return fs.Join(w.Dir, name) }

// LocalPath returns name's path on the local disk, for fio and page-cache
// eviction; ok is false on a remote FS.
func (w *Workdir) LocalPath(name string) (string, bool) {
	if w.Remote {
		return "", false
	}
	return w.Join(name), true
}

// Track records a file the benchmark created (a name inside the directory).
func (w *Workdir) Track(name string) {
	w.mu.Lock()
	w.created = append(w.created, name)
	w.mu.Unlock()
}

// Remove removes a tracked file now (a benchmark that makes many files
// removes them as it goes, so the disk does not fill up).
func (w *Workdir) Remove(ctx context.Context, name string) error {
	w.mu.Lock()
	for i, c := range w.created {
		if c == name {
			w.created = append(w.created[:i], w.created[i+1:]...)
			break
		}
	}
	w.mu.Unlock()
	if err := w.FS.Remove(ctx, w.Join(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Cleanup removes the tracked files, and the directories OpenWorkdir
// created if they are empty, unless Keep. It returns the first error.
func (w *Workdir) Cleanup(ctx context.Context) error {
	if w.Keep {
		return nil
	}
	w.mu.Lock()
	created := w.created
	w.created = nil
	w.mu.Unlock()
	var first error
	for _, name := range created {
		if err := w.FS.Remove(ctx, w.Join(name)); err != nil && !errors.Is(err, fs.ErrNotExist) && first == nil {
			first = fmt.Errorf("remove %s: %w", w.Join(name), err)
		}
	}
	for _, d := range w.createdDirs {
		if ents, err := w.FS.List(ctx, d); err != nil || len(ents) != 0 {
			break
		}
		if err := w.FS.Remove(ctx, d); err != nil {
			break
		}
	}
	return first
}

// Cold prepares the named files for a cold read (see MakeCold).
func (w *Workdir) Cold(direct bool, names ...string) (CacheState, error) {
	var local []string
	for _, n := range names {
		if p, ok := w.LocalPath(n); ok {
			local = append(local, p)
		}
	}
	return MakeCold(direct, w.Remote, local...)
}

// Pattern is a block of incompressible bytes that benchmarks write.
// Each written chunk is stamped with its offset so no two chunks of a file
// are identical (storage that deduplicates or compresses gains nothing).
type Pattern struct{ block []byte }

// NewPattern returns a pattern of n random bytes (n >= 8).
func NewPattern(n int, seed uint64) *Pattern {
	n = max(n, 8)
	b := make([]byte, n)
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24)}))
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return &Pattern{block: b}
}

// Chunk returns n bytes of the pattern stamped with off. The slice is
// shared: write it before asking for the next chunk. n <= the pattern size.
func (p *Pattern) Chunk(off int64, n int) []byte {
	b := p.block[:min(n, len(p.block))]
	if len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, uint64(off))
	}
	return b
}

// Size is the largest chunk the pattern gives.
func (p *Pattern) Size() int { return len(p.block) }

// WriteFile writes size bytes (after header) to name in chunks of chunk
// bytes and commits it, tracking it for Cleanup. It is preparation, not
// a measurement.
func (w *Workdir) WriteFile(ctx context.Context, name string, header []byte, size int64, chunk int) error {
	if chunk <= 0 {
		chunk = 4 << 20
	}
	wr, err := w.FS.Create(ctx, w.Join(name))
	if err != nil {
		return fmt.Errorf("create %s: %w", w.Join(name), err)
	}
	defer wr.Close()
	w.Track(name)
	if _, err := wr.Write(header); err != nil {
		return err
	}
	p := NewPattern(chunk, uint64(size))
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := int(min(int64(chunk), size-off))
		if _, err := wr.Write(p.Chunk(off, n)); err != nil {
			return err
		}
		off += int64(n)
	}
	if err := wr.Commit(); err != nil {
		return err
	}
	return nil
}
