package pack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"

	"github.com/ffkit/ffkit/fs"
)

// openDir lists every regular file under dir: one sample per file, named
// by its slash-separated path relative to dir, in byte order of that path.
func openDir(ctx context.Context, fsys fs.FS, dir string) (*listed, error) {
	l := newListed(ctx, "files", fsys)
	l.perSample = true
	type ent struct {
		rel  string
		size int64
	}
	var ents []ent
	local := fsys.String() == "local"
	var walk func(d, rel string) error
	walk = func(d, rel string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		list, err := fsys.List(ctx, d)
		if err != nil {
			return fmt.Errorf("pack: list %s: %w", d, err)
		}
		for _, e := range list {
			full, r := path.Join(d, e.Name), path.Join(rel, e.Name)
			if e.IsDir {
				if err := walk(full, r); err != nil {
					return err
				}
				continue
			}
			size := e.Size
			if local { // follow symlinks to files; skip devices, fifos, sockets
				st, err := os.Stat(full)
				if err != nil {
					return fmt.Errorf("pack: %w", err)
				}
				if !st.Mode().IsRegular() {
					continue
				}
				size = st.Size()
			}
			ents = append(ents, ent{r, size})
		}
		return nil
	}
	if err := walk(dir, ""); err != nil {
		return nil, err
	}
	sort.Slice(ents, func(a, b int) bool { return ents[a].rel < ents[b].rel })
	l.samples = make([]Sample, len(ents))
	l.ext1 = make([]extent, len(ents))
	for i, e := range ents {
		l.samples[i] = Sample{Name: e.rel, Size: e.size}
		l.ext1[i] = extent{file: l.addFile(path.Join(dir, e.rel), nil), size: e.size}
	}
	return l, nil
}

// openJSONL indexes the lines of a JSON Lines file: each non-empty line
// (without its "\n" or "\r\n") is one sample, named FILE:LINE.
func openJSONL(ctx context.Context, fsys fs.FS, name string) (*listed, error) {
	f, err := fsys.Open(ctx, name, fs.OpenOptions{})
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	l := newListed(ctx, "jsonl", fsys)
	fi := l.addFile(name, f)
	base := path.Base(name)
	br := bufio.NewReaderSize(io.NewSectionReader(f, 0, f.Size()), 1<<20)
	var off int64
	line := 0
	for {
		if line%65536 == 0 && ctx.Err() != nil {
			l.Close()
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
			l.Close()
			return nil, fmt.Errorf("pack: read %s: %w", name, err)
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
			l.samples = append(l.samples, Sample{Name: base + ":" + strconv.Itoa(line), Size: content})
			l.ext1 = append(l.ext1, extent{file: fi, off: off, size: content})
		}
		off += length
		if err == io.EOF {
			break
		}
	}
	return l, nil
}
