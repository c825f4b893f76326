package clusterfs

import (
	"context"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs/client"
)

// Write-behind of small writes (fs.WriteFile of OpenWrite).
//
// A chunk write is a chain write: every replica writes a new version of the
// chunk and syncs it, so a 4 KiB write at a random offset costs about as
// much as rewriting its chunk. A WriteFile therefore keeps writes smaller
// than wbDirect in memory, per chunk, as extents (overlapping and adjacent
// ones merged, the newer bytes winning), and writes them back:
//
//   - on Flush, Sync, Close and Truncate (so close-to-open consistency and
//     the durability of Sync are those of a write-through handle: the
//     bytes are on every replica before the length is published);
//   - when the handle holds more than Options.WriteBehind dirty bytes (64
//     MiB by default; the writer that crosses the limit writes everything
//     back before it returns);
//   - before the session is renewed (every 10 s of writing).
//
// Writing back, a chunk's extents become one chain write: when there are
// several, the span from the first to the last is read, the extents laid
// over it, and the span written (one chunk rewrite instead of one per
// extent). Filling the gaps from what the chunk holds would overwrite
// another writer's bytes written into those gaps in the meantime, so it is
// done only while this handle is the only one open for writing on the file
// in this process (FS.writers); otherwise each extent is written as it is.
// Writers in other processes writing small pieces into the same chunk at
// the same time should use Sync between their writes (as with any
// write-behind cache); whole-range writes (wbDirect and larger, which the
// FUSE mount's write windows are) are never buffered or gap-filled.
//
// ReadAt through the handle sees its buffered writes (they are laid over
// what it reads). Writes of wbDirect bytes or more go through at once,
// dropping the buffered bytes they overwrite.
const wbDirect = 128 << 10

// writerCount counts the open WriteFiles per inode of one FS.
type writerCount struct {
	mu sync.Mutex
	n  map[uint64]int
}

func (c *writerCount) add(inode uint64, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[uint64]int{}
	}
	c.n[inode] += d
	if c.n[inode] <= 0 {
		delete(c.n, inode)
	}
}

func (c *writerCount) alone(inode uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[inode] <= 1
}

// extent is buffered bytes at off inside a chunk.
type extent struct {
	off  int64
	data []byte
}

func (e extent) end() int64 { return e.off + int64(len(e.data)) }

// dirtyChunk is the buffered writes of one chunk: extents sorted by
// offset, neither overlapping nor adjacent.
type dirtyChunk struct {
	exts []extent
}

// put lays b at off over the chunk's extents, merging the ones it touches;
// it returns the change in buffered bytes.
func (d *dirtyChunk) put(off int64, b []byte) int64 {
	end := off + int64(len(b))
	// The extents that overlap or touch [off, end).
	i := 0
	for i < len(d.exts) && d.exts[i].end() < off {
		i++
	}
	j := i
	for j < len(d.exts) && d.exts[j].off <= end {
		j++
	}
	if i == j {
		d.exts = slices.Insert(d.exts, i, extent{off, slices.Clone(b)})
		return int64(len(b))
	}
	lo, hi := min(off, d.exts[i].off), max(end, d.exts[j-1].end())
	var old int64
	buf := make([]byte, hi-lo)
	for _, e := range d.exts[i:j] {
		copy(buf[e.off-lo:], e.data)
		old += int64(len(e.data))
	}
	copy(buf[off-lo:], b)
	d.exts = slices.Replace(d.exts, i, j, extent{lo, buf})
	return int64(len(buf)) - old
}

// cut drops the buffered bytes in [off, end); it returns the change in
// buffered bytes (<= 0).
func (d *dirtyChunk) cut(off, end int64) int64 {
	var out []extent
	var delta int64
	for _, e := range d.exts {
		if e.end() <= off || e.off >= end {
			out = append(out, e)
			continue
		}
		delta -= int64(len(e.data))
		if e.off < off {
			out = append(out, extent{e.off, e.data[:off-e.off]})
			delta += off - e.off
		}
		if e.end() > end {
			out = append(out, extent{end, e.data[end-e.off:]})
			delta += e.end() - end
		}
	}
	d.exts = out
	return delta
}

// overlay copies the buffered bytes in [off, off+len(p)) of the chunk into p.
func (d *dirtyChunk) overlay(p []byte, off int64) {
	end := off + int64(len(p))
	for _, e := range d.exts {
		if e.end() <= off || e.off >= end {
			continue
		}
		lo, hi := max(off, e.off), min(end, e.end())
		copy(p[lo-off:hi-off], e.data[lo-e.off:hi-e.off])
	}
}

// buffer keeps a small write; it reports whether the handle now holds more
// than Options.WriteBehind bytes. Called with w.mu held.
func (w *wfile) buffer(p []byte, off int64) (over bool) {
	if w.dirty == nil {
		w.dirty = map[uint64]*dirtyChunk{}
	}
	w.pieces(off, p, func(idx uint64, in int64, b []byte) {
		d := w.dirty[idx]
		if d == nil {
			d = &dirtyChunk{}
			w.dirty[idx] = d
		}
		w.dirtyBytes += d.put(in, b)
	})
	return w.dirtyBytes > w.fs.opts.WriteBehind
}

// dropBuffered drops the buffered bytes a direct write of [off, off+n)
// overwrites. Called with w.mu held.
func (w *wfile) dropBuffered(off int64, n int) {
	if len(w.dirty) == 0 {
		return
	}
	cs := w.layout.ChunkSize
	for o, end := off, off+int64(n); o < end; {
		idx := uint64(o / cs)
		in := o % cs
		k := min(end-o, cs-in)
		if d := w.dirty[idx]; d != nil {
			w.dirtyBytes += d.cut(in, in+k)
			if len(d.exts) == 0 {
				delete(w.dirty, idx)
			}
		}
		o += k
	}
}

// overlayBuffered lays the buffered bytes over p, read at off. Called with
// w.mu held.
func (w *wfile) overlayBuffered(p []byte, off int64) {
	if len(w.dirty) == 0 {
		return
	}
	w.pieces(off, p, func(idx uint64, in int64, b []byte) {
		if d := w.dirty[idx]; d != nil {
			d.overlay(b, in)
		}
	})
}

// writeBack writes every buffered extent to its chunk. It holds wbMu for
// writing, so no direct write or read of the handle runs meanwhile; the
// buffered bytes are taken out of the handle only once written (a failed
// write-back keeps the ones not written, and Flush, Sync or Close report
// the error).
func (w *wfile) writeBack(ctx context.Context) error {
	w.wbMu.Lock()
	defer w.wbMu.Unlock()
	w.mu.Lock()
	dirty := w.dirty
	w.dirty, w.dirtyBytes = nil, 0
	w.mu.Unlock()
	if len(dirty) == 0 {
		return nil
	}
	alone := w.fs.writers.alone(w.inode)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.fs.opts.WriteParallel * 4)
	var mu sync.Mutex
	failed := map[uint64]*dirtyChunk{}
	for idx, d := range dirty {
		g.Go(func() error {
			err := w.writeChunkBack(gctx, idx, d, alone)
			if err != nil {
				mu.Lock()
				failed[idx] = d
				mu.Unlock()
			}
			return err
		})
	}
	err := g.Wait()
	if len(failed) > 0 {
		// Keep what was not written; newer writes buffered meanwhile win.
		w.mu.Lock()
		if w.dirty == nil {
			w.dirty = map[uint64]*dirtyChunk{}
		}
		for idx, d := range failed {
			nd := &dirtyChunk{}
			var n int64
			for _, e := range d.exts {
				n += nd.put(e.off, e.data)
			}
			if cur := w.dirty[idx]; cur != nil {
				for _, e := range cur.exts {
					n += nd.put(e.off, e.data)
				}
				for _, e := range cur.exts {
					n -= int64(len(e.data))
				}
			}
			w.dirty[idx] = nd
			w.dirtyBytes += n
		}
		w.mu.Unlock()
	}
	if err != nil {
		return wrap("write", w.fs.String()+w.name, err)
	}
	return nil
}

// writeChunkBack writes one chunk's extents: as one span when there are
// several and gap filling is safe, else one write each.
func (w *wfile) writeChunkBack(ctx context.Context, idx uint64, d *dirtyChunk, alone bool) error {
	chain := w.layout.Chain(idx)
	id := client.ChunkID{Inode: w.inode, Index: idx}
	if len(d.exts) == 1 || !alone {
		for _, e := range d.exts {
			if err := w.fs.chunks.WriteChunk(ctx, chain, id, e.off, e.data); err != nil {
				return err
			}
		}
		return nil
	}
	lo, hi := d.exts[0].off, d.exts[len(d.exts)-1].end()
	span := make([]byte, hi-lo)
	if err := w.fs.chunks.ReadChunks(ctx, []client.ChunkRead{{Chain: chain, Chunk: id, Off: lo, Buf: span}}); err != nil {
		return err
	}
	d.overlay(span, lo)
	return w.fs.chunks.WriteChunk(ctx, chain, id, lo, span)
}
