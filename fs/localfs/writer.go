package localfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

// The writer stages bytes in aligned chunks of writeChunk bytes. A full
// chunk is written with O_DIRECT (a second descriptor on the same temporary
// file) by up to writeDepth writes in flight, so a large file streams to
// the device while the caller fills the next chunk, instead of piling up in
// the page cache and waiting for one long fsync at the end. The tail and
// WriteAt patches go through the ordinary descriptor. A file smaller than
// one chunk never touches O_DIRECT.
//
// Space is reserved ahead of the writes with fallocate (allocStep at a
// time, trimmed at Commit): on ext4 and xfs a direct write into reserved
// space does not extend the file, so the writes in flight do not serialise
// on the inode lock, and the file's blocks stay contiguous.
const (
	writeChunk = 4 << 20
	writeDepth = 4
	allocStep  = 64 << 20
)

var chunkPool = sync.Pool{New: func() any { b := AlignedBuffer(writeChunk); return &b }}

type writer struct {
	f    *os.File // buffered descriptor
	df   *os.File // O_DIRECT descriptor, nil where unsupported or not yet needed
	name string

	cur    *[]byte // the chunk being filled
	curLen int
	curOff int64 // file offset of cur[0]

	sem chan struct{}  // one token per write in flight
	wg  sync.WaitGroup // writes in flight

	mu  sync.Mutex // guards err, set by write goroutines
	err error      // first error, sticky

	committed bool
	triedDir  bool
	allocEnd  int64 // bytes reserved with fallocate; -1 once unsupported
}

func newWriter(f *os.File, name string) *writer {
	return &writer{f: f, name: name, sem: make(chan struct{}, writeDepth)}
}

func (w *writer) setErr(err error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && err != nil {
		w.err = wrapSpace(fmt.Errorf("write %s: %w", w.name, err))
	}
	return w.err
}

func (w *writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *writer) Write(p []byte) (int, error) {
	if err := w.failed(); err != nil {
		return 0, err
	}
	n := 0
	for len(p) > 0 {
		if w.cur == nil {
			w.cur = chunkPool.Get().(*[]byte)
			w.curLen = 0
		}
		c := copy((*w.cur)[w.curLen:], p)
		w.curLen += c
		n += c
		p = p[c:]
		if w.curLen == writeChunk {
			if err := w.submit(); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// ReadFrom writes what r yields until io.EOF, reading straight into the
// staged chunks (one copy instead of two). A read error fails the writer:
// part of r's bytes are already written.
func (w *writer) ReadFrom(r io.Reader) (int64, error) {
	if err := w.failed(); err != nil {
		return 0, err
	}
	var total int64
	for {
		if w.cur == nil {
			w.cur = chunkPool.Get().(*[]byte)
			w.curLen = 0
		}
		n, err := r.Read((*w.cur)[w.curLen:])
		w.curLen += n
		total += int64(n)
		if w.curLen == writeChunk {
			if serr := w.submit(); serr != nil {
				return total, serr
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, w.setErr(fmt.Errorf("reading the source: %w", err))
		}
	}
}

// copyPiece is the smallest piece CopyFromAt reads on its own goroutine.
const copyPiece = 256 << 10

// CopyFromAt writes n bytes of r starting at off, reading them straight
// into the staged chunks with up to par reads in flight (pieces of at least
// 256 KiB), and hands them, in order, to tee (a checksum) unless it is nil.
// A short or failed read fails the writer.
func (w *writer) CopyFromAt(r io.ReaderAt, off, n int64, tee io.Writer, par int) (int64, error) {
	if err := w.failed(); err != nil {
		return 0, err
	}
	par = max(par, 1)
	var done int64
	for done < n {
		if w.cur == nil {
			w.cur = chunkPool.Get().(*[]byte)
			w.curLen = 0
		}
		span := min(n-done, int64(writeChunk-w.curLen))
		dst := (*w.cur)[w.curLen : int64(w.curLen)+span]
		pieces := max(1, min(int64(par), span/copyPiece))
		size := (span + pieces - 1) / pieces
		var wg sync.WaitGroup
		errs := make([]error, pieces)
		for k := range pieces {
			a, b := k*size, min((k+1)*size, span)
			read := func() {
				got, err := r.ReadAt(dst[a:b], off+done+a)
				if got == int(b-a) {
					return
				}
				if err == nil || err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				errs[k] = err
			}
			if pieces == 1 {
				read()
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); read() }()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return done, w.setErr(fmt.Errorf("reading the source: %w", err))
			}
		}
		if tee != nil {
			tee.Write(dst)
		}
		w.curLen += int(span)
		done += span
		if w.curLen == writeChunk {
			if err := w.submit(); err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

// submit hands the full chunk to a background write.
func (w *writer) submit() error {
	if !w.triedDir {
		w.triedDir = true
		if df, err := os.OpenFile(w.f.Name(), os.O_WRONLY|unix.O_DIRECT, 0); err == nil {
			w.df = df
		}
	}
	buf, off := w.cur, w.curOff
	w.cur, w.curOff, w.curLen = nil, w.curOff+writeChunk, 0
	if w.allocEnd >= 0 && off+writeChunk > w.allocEnd {
		if err := unix.Fallocate(int(w.f.Fd()), 0, w.allocEnd, allocStep); err != nil {
			w.allocEnd = -1 // not supported here: write without reserving
		} else {
			w.allocEnd += allocStep
		}
	}
	w.sem <- struct{}{}
	w.wg.Add(1)
	go func() {
		defer func() { <-w.sem; w.wg.Done(); chunkPool.Put(buf) }()
		dst := w.df
		if dst == nil {
			dst = w.f
		}
		if _, err := dst.WriteAt(*buf, off); err != nil {
			w.setErr(err)
		}
	}()
	return w.failed()
}

// drain waits for the writes in flight.
func (w *writer) drain() error {
	w.wg.Wait()
	return w.failed()
}

// WriteAt overwrites bytes already written at off (a header written last,
// as FFRecord writers do). The file stays unpublished until Commit.
func (w *writer) WriteAt(p []byte, off int64) (int, error) {
	if err := w.drain(); err != nil {
		return 0, err
	}
	end := off + int64(len(p))
	if off < 0 || end > w.curOff+int64(w.curLen) {
		return 0, w.setErr(fmt.Errorf("WriteAt [%d, %d) past the %d bytes written", off, end, w.curOff+int64(w.curLen)))
	}
	if off < w.curOff { // the part already on its way to disk
		k := min(end, w.curOff) - off
		if _, err := w.f.WriteAt(p[:k], off); err != nil {
			return 0, w.setErr(err)
		}
	}
	if end > w.curOff { // the part still staged
		from := max(off, w.curOff)
		copy((*w.cur)[from-w.curOff:], p[from-off:])
	}
	return len(p), nil
}

func (w *writer) release() {
	w.wg.Wait()
	if w.cur != nil {
		chunkPool.Put(w.cur)
		w.cur = nil
	}
	if w.df != nil {
		w.df.Close()
		w.df = nil
	}
}

func (w *writer) Commit() error {
	if w.committed {
		return nil
	}
	err := w.drain()
	if err == nil && w.cur != nil && w.curLen > 0 {
		if _, werr := w.f.WriteAt((*w.cur)[:w.curLen], w.curOff); werr != nil {
			err = w.setErr(werr)
		}
	}
	w.release()
	if err == nil && w.allocEnd > 0 {
		err = w.f.Truncate(w.curOff + int64(w.curLen)) // drop the unused reservation
	}
	if err != nil {
		w.Close()
		return err
	}
	err = w.f.Sync()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.f.Name(), w.name)
	}
	if err != nil {
		os.Remove(w.f.Name())
		w.committed = true // nothing left to abandon
		return wrapSpace(fmt.Errorf("commit %s: %w", w.name, err))
	}
	w.committed = true
	return syncDir(filepath.Dir(w.name))
}

func (w *writer) Close() error {
	if w.committed {
		return nil
	}
	w.committed = true
	w.release()
	w.f.Close()
	return os.Remove(w.f.Name())
}

func wrapSpace(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", fs.ErrNoSpace, err)
	}
	return err
}

var _ fs.Writer = (*writer)(nil)
