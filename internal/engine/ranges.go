package engine

import (
	"context"
	"fmt"

	"github.com/ffkit/ffkit/fs"
)

// readRanges serves raw byte ranges of files: the request lists
// {path, offset, length} triples; the response is one shared-memory segment
// holding the ranges end to end, and the body gives each range's [start,
// end) in it as int64 pairs.
func readRanges(ctx context.Context, s *Server, r *readRangesRequest, in input) (reply, error) {
	closeFDs(in.fds)
	offs := make([]int64, len(r.Ranges)+1)
	for i, rg := range r.Ranges {
		if rg.Offset < 0 || rg.Length < 0 {
			return reply{}, fmt.Errorf("%w: range %d of %s: negative offset or length", ErrBadRequest, i, rg.Path)
		}
		offs[i+1] = offs[i] + rg.Length
	}
	seg, err := newSegment("ffkit-ranges", offs[len(offs)-1])
	if err != nil {
		return reply{}, err
	}
	defer seg.unmap()
	files := map[string]fs.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	byFS := map[fs.FS][]fs.ReadRequest{}
	for i, rg := range r.Ranges {
		fsys, p, err := fs.Resolve(ctx, rg.Path)
		if err != nil {
			seg.close()
			return reply{}, err
		}
		f, ok := files[rg.Path]
		if !ok {
			f, err = fsys.Open(ctx, p, fs.OpenOptions{})
			if err != nil {
				seg.close()
				return reply{}, fmt.Errorf("engine: open %s: %w", rg.Path, err)
			}
			files[rg.Path] = f
		}
		byFS[fsys] = append(byFS[fsys], fs.ReadRequest{File: f, Off: rg.Offset, Buf: seg.mem[offs[i]:offs[i+1]:offs[i+1]]})
	}
	for fsys, reqs := range byFS {
		if err := fsys.ReadBatch(ctx, reqs); err != nil {
			seg.close()
			return reply{}, fmt.Errorf("engine: read ranges on %s: %w", fsys, err)
		}
	}
	pos := make([]int64, 2*len(r.Ranges))
	for i := range r.Ranges {
		pos[2*i], pos[2*i+1] = offs[i], offs[i+1]
	}
	rep := reply{header: ffrReadReply{okField: ok(), Size: offs[len(offs)-1]}, body: putInt64s(pos)}
	if seg.fd >= 0 {
		rep.fds = []int{seg.fd}
	}
	return rep, nil
}

func init() {
	addCode(fs.ErrShortRead, "short_read")
}
