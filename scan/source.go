package scan

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/apache/arrow-go/v18/arrow"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
)

// userPath rebuilds the user-facing form of inner, a path inside the FS
// that base (a user path or URL) resolved to.
func userPath(base, inner string) string {
	if fs.IsURL(base) {
		scheme, auth, _, err := fs.SplitURL(base)
		if err == nil {
			return scheme + "://" + auth + "/" + strings.TrimLeft(inner, "/")
		}
	}
	return inner
}

func hasGlob(s string) bool { return strings.ContainsAny(s, "*?[") }

// hidden names are skipped when a directory is expanded: ffkit's own work
// directories (_ffkit), staging files and the usual _SUCCESS markers.
func hidden(name string) bool { return strings.HasPrefix(name, "_") || strings.HasPrefix(name, ".") }

// ExpandInputs turns files, globs (in the last path element) and
// directories (searched recursively for *.parquet) into a sorted list of
// Parquet file paths.
func ExpandInputs(ctx context.Context, inputs []string) ([]string, error) {
	var out []string
	for _, in := range inputs {
		fsys, inner, err := fs.Resolve(ctx, in)
		if err != nil {
			return nil, err
		}
		if hasGlob(inner) {
			dir, pat := path.Split(inner)
			if hasGlob(dir) {
				return nil, fmt.Errorf("%w: %q: wildcards are only supported in the last path element", ErrUsage, in)
			}
			if dir == "" {
				dir = "."
			}
			ents, err := fsys.List(ctx, strings.TrimSuffix(dir, "/"))
			if err != nil {
				return nil, fmt.Errorf("scan: list %s: %w", dir, err)
			}
			n := 0
			for _, e := range ents {
				if ok, err := path.Match(pat, e.Name); err != nil {
					return nil, fmt.Errorf("%w: bad pattern %q: %v", ErrUsage, in, err)
				} else if ok && !e.IsDir {
					out = append(out, userPath(in, path.Join(dir, e.Name)))
					n++
				}
			}
			if n == 0 {
				return nil, fmt.Errorf("%w: %q matches no file", ErrUsage, in)
			}
			continue
		}
		st, err := fsys.Stat(ctx, inner)
		if err != nil {
			return nil, fmt.Errorf("scan: input %s: %w", in, err)
		}
		if !st.IsDir {
			out = append(out, in)
			continue
		}
		var found []string
		var walk func(dir string) error
		walk = func(dir string) error {
			ents, err := fsys.List(ctx, dir)
			if err != nil {
				return fmt.Errorf("scan: list %s: %w", dir, err)
			}
			for _, e := range ents {
				if hidden(e.Name) {
					continue
				}
				p := path.Join(dir, e.Name)
				if e.IsDir {
					if err := walk(p); err != nil {
						return err
					}
				} else if strings.HasSuffix(e.Name, ".parquet") {
					found = append(found, userPath(in, p))
				}
			}
			return nil
		}
		if err := walk(inner); err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%w: directory %s holds no .parquet file", ErrUsage, in)
		}
		out = append(out, found...)
	}
	sort.Strings(out)
	return out, nil
}

// Source is a set of opened Parquet files that share the columns a job reads.
type Source struct {
	Files     []*File
	BytesRead *atomic.Int64
}

// OpenSource expands inputs and opens every file's footer, in parallel.
func OpenSource(ctx context.Context, inputs []string, parallel int) (*Source, error) {
	paths, err := ExpandInputs(ctx, inputs)
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: no input files", ErrUsage)
	}
	src := &Source{Files: make([]*File, len(paths)), BytesRead: new(atomic.Int64)}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(parallel, 4))
	for i, p := range paths {
		g.Go(func() error {
			f, err := OpenFile(gctx, p, src.BytesRead)
			if err != nil {
				return err
			}
			src.Files[i] = f
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		src.Close()
		return nil, err
	}
	return src, nil
}

// Close closes every file.
func (s *Source) Close() {
	for _, f := range s.Files {
		if f != nil {
			f.Close()
		}
	}
}

// Rows is the total number of rows.
func (s *Source) Rows() int64 {
	var n int64
	for _, f := range s.Files {
		n += f.Rows
	}
	return n
}

// Schema returns the schema of the named columns (all columns of the first
// file when names is nil), checking that every file has them with the same
// types. The error names the first file that disagrees.
func (s *Source) Schema(names []string) (*arrow.Schema, error) {
	first := s.Files[0]
	if names == nil {
		for _, f := range first.Schema.Fields() {
			names = append(names, f.Name)
		}
	}
	fields := make([]arrow.Field, len(names))
	for i, n := range names {
		idx := first.Schema.FieldIndices(n)
		if len(idx) != 1 {
			return nil, fmt.Errorf("%w: unknown column %q: %s has %s", ErrUsage, n, first.Path, fieldNames(first.Schema))
		}
		fields[i] = first.Schema.Field(idx[0])
	}
	for _, f := range s.Files[1:] {
		for _, want := range fields {
			idx := f.Schema.FieldIndices(want.Name)
			if len(idx) != 1 {
				return nil, fmt.Errorf("%w: column %q is in %s but not in %s", ErrSchema, want.Name, first.Path, f.Path)
			}
			if got := f.Schema.Field(idx[0]).Type; !arrow.TypeEqual(got, want.Type) {
				return nil, fmt.Errorf("%w: column %q is %s in %s but %s in %s", ErrSchema, want.Name, want.Type, first.Path, got, f.Path)
			}
		}
	}
	return arrow.NewSchema(fields, nil), nil
}

// indexCache maps column names to each file's own indices.
type indexCache struct {
	mu sync.Mutex
	m  map[*File][]int // guarded by mu
}

func (c *indexCache) of(f *File, names []string) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[*File][]int{}
	}
	if idx, ok := c.m[f]; ok {
		return idx
	}
	idx := make([]int, len(names))
	for i, n := range names {
		idx[i] = f.Schema.FieldIndices(n)[0]
	}
	c.m[f] = idx
	return idx
}
