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
//
// Reserve hands out the next bytes of the file as slices of the staged
// chunks, for other goroutines to fill (pack reads many sources at once
// straight into their places); a chunk is written once it is full and every
// reservation in it has been released. At most maxLive chunks are staged.
//
// A write of any size is staged a window (at most copyWindow bytes) at a
// time: a chunk is written back only once nothing in it is still reserved,
// so one reservation of more than maxLive chunks would wait for itself
// forever. Reserve therefore refuses more than MaxReserve bytes; Write,
// ReadFrom and CopyFromAt take any length.
const (
	writeChunk = 4 << 20
	writeDepth = 4
	allocStep  = 64 << 20
	maxLive    = 8 // 32 MiB staged per writer at most
	copyWindow = 4 * writeChunk
)

// MaxReserve is the largest reservation Reserve hands out: with other
// reservations outstanding it still spans fewer than maxLive chunks.
const MaxReserve = copyWindow

// ErrReserveTooLarge: a Reserve of more than MaxReserve bytes.
var ErrReserveTooLarge = errors.New("localfs: reservation larger than MaxReserve; write the bytes with Write or CopyFromAt")

var chunkPool = sync.Pool{New: func() any { b := AlignedBuffer(writeChunk); return &b }}

// wchunk is one staged chunk.
type wchunk struct {
	buf     *[]byte
	off     int64 // file offset of buf[0]
	used    int   // bytes handed out; only the owner goroutine grows it
	pending int   // reservations not yet released; guarded by writer.mu
}

type writer struct {
	f    *os.File // buffered descriptor
	df   *os.File // O_DIRECT descriptor, nil where unsupported or not yet needed
	name string

	mu      sync.Mutex // guards the fields below up to err
	cond    *sync.Cond // on mu: a chunk was written back, or a reservation released
	cur     *wchunk    // the chunk being filled, nil between chunks
	nextOff int64      // file offset of the next chunk to start
	live    int        // chunks staged and not yet written back
	held    int        // reservations not yet released
	err     error      // first error, sticky

	sem chan struct{}  // one token per write in flight
	wg  sync.WaitGroup // chunk writes started and not finished

	committed bool
	triedDir  bool
	allocEnd  int64 // bytes reserved with fallocate; -1 once unsupported
}

func newWriter(f *os.File, name string) *writer {
	w := &writer{f: f, name: name, sem: make(chan struct{}, writeDepth)}
	w.cond = sync.NewCond(&w.mu)
	return w
}

func (w *writer) setErr(err error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.setErrLocked(err)
}

func (w *writer) setErrLocked(err error) error {
	if w.err == nil && err != nil {
		w.err = wrapSpace(fmt.Errorf("write %s: %w", w.name, err))
		w.cond.Broadcast()
	}
	return w.err
}

func (w *writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// size is the number of bytes handed out so far.
func (w *writer) sizeLocked() int64 {
	if w.cur != nil {
		return w.cur.off + int64(w.cur.used)
	}
	return w.nextOff
}

// piece is part of a reservation: a slice of one chunk.
type piece struct {
	c   *wchunk
	buf []byte
}

// take hands out the next n bytes (n > 0) as pieces of chunks, each piece
// counted as pending in its chunk until release. Only the owner goroutine
// calls it.
func (w *writer) take(n int64) ([]piece, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []piece
	for n > 0 {
		if w.err != nil {
			w.releaseLocked(out)
			return nil, w.err
		}
		if w.cur == nil {
			for w.live >= maxLive && w.err == nil {
				w.cond.Wait()
			}
			if w.err != nil {
				continue
			}
			w.cur = &wchunk{buf: chunkPool.Get().(*[]byte), off: w.nextOff}
			w.nextOff += writeChunk
			w.live++
		}
		c := w.cur
		k := min(n, int64(writeChunk-c.used))
		out = append(out, piece{c, (*c.buf)[c.used : int64(c.used)+k]})
		c.used += int(k)
		c.pending++
		w.held++
		n -= k
		if c.used == writeChunk {
			w.cur = nil // full: written once its reservations are released
		}
	}
	return out, nil
}

// release returns pieces; a full chunk with nothing pending is written.
func (w *writer) release(ps []piece) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.releaseLocked(ps)
}

func (w *writer) releaseLocked(ps []piece) {
	for _, p := range ps {
		p.c.pending--
		w.held--
		if p.c.pending == 0 && p.c.used == writeChunk {
			w.submitLocked(p.c)
		}
	}
	w.cond.Broadcast()
}

// submitLocked starts the write of a full chunk; it never blocks.
func (w *writer) submitLocked(c *wchunk) {
	if !w.triedDir {
		w.triedDir = true
		if df, err := os.OpenFile(w.f.Name(), os.O_WRONLY|unix.O_DIRECT, 0); err == nil {
			w.df = df
		}
	}
	if w.allocEnd >= 0 && c.off+writeChunk > w.allocEnd {
		end := max(w.allocEnd, c.off) + allocStep
		if err := unix.Fallocate(int(w.f.Fd()), 0, w.allocEnd, end-w.allocEnd); err != nil {
			w.allocEnd = -1 // not supported here: write without reserving
		} else {
			w.allocEnd = end
		}
	}
	dst := w.df
	if dst == nil {
		dst = w.f
	}
	w.wg.Add(1)
	go func() {
		w.sem <- struct{}{}
		_, err := dst.WriteAt(*c.buf, c.off)
		<-w.sem
		chunkPool.Put(c.buf)
		w.mu.Lock()
		w.live--
		w.setErrLocked(err)
		w.cond.Broadcast()
		w.mu.Unlock()
		w.wg.Done()
	}()
}

// Reserve hands out the next n bytes of the file as one or more slices to
// fill, from any goroutine; call release (once) when they are filled. The
// bytes land in the file in reservation order whatever the order of the
// releases. Reserve blocks while too many chunks are staged, so release
// each reservation without waiting for a later Reserve to return.
func (w *writer) Reserve(n int64) (bufs [][]byte, release func(), err error) {
	if n <= 0 {
		return nil, func() {}, w.failed()
	}
	if n > MaxReserve {
		return nil, nil, fmt.Errorf("%w (%d bytes)", ErrReserveTooLarge, n)
	}
	ps, err := w.take(n)
	if err != nil {
		return nil, nil, err
	}
	bufs = make([][]byte, len(ps))
	for i, p := range ps {
		bufs[i] = p.buf
	}
	var once sync.Once
	return bufs, func() { once.Do(func() { w.release(ps) }) }, nil
}

func (w *writer) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, w.failed()
	}
	n := 0
	for n < len(p) { // a window at a time: see MaxReserve
		k := min(len(p)-n, copyWindow)
		ps, err := w.take(int64(k))
		if err != nil {
			return n, err
		}
		for _, pc := range ps {
			n += copy(pc.buf, p[n:])
		}
		w.release(ps)
	}
	return n, w.failed()
}

// ReadFrom writes what r yields until io.EOF, reading straight into the
// staged chunks (one copy instead of two). A read error fails the writer:
// part of r's bytes are already written.
func (w *writer) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	for {
		// Reserve what is left of the current chunk (a whole one if none),
		// read into it, and give back what the read did not fill. Only
		// this goroutine hands out bytes, so the unfilled tail is still
		// the last thing handed out.
		w.mu.Lock()
		room := int64(writeChunk)
		if w.cur != nil {
			room = int64(writeChunk - w.cur.used)
		}
		w.mu.Unlock()
		ps, err := w.take(room)
		if err != nil {
			return total, err
		}
		c, buf := ps[0].c, ps[0].buf
		n, rerr := io.ReadFull(r, buf)
		total += int64(n)
		if n < len(buf) {
			w.mu.Lock()
			c.used -= len(buf) - n
			if w.cur == nil && c.used < writeChunk {
				w.cur = c // it is not full after all
			}
			w.mu.Unlock()
		}
		w.release(ps)
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			return total, w.failed()
		case rerr != nil:
			return total, w.setErr(fmt.Errorf("reading the source: %w", rerr))
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
	if n <= 0 {
		return 0, w.failed()
	}
	var done int64
	for done < n { // a window at a time: see MaxReserve
		k := min(n-done, copyWindow)
		bufs, release, err := w.Reserve(k)
		if err != nil {
			return done, err
		}
		err = ReadAtInto(r, off+done, bufs, par)
		if err == nil && tee != nil {
			for _, b := range bufs {
				tee.Write(b)
			}
		}
		release()
		if err != nil {
			return done, w.setErr(fmt.Errorf("reading the source at byte %d: %w", off+done, err))
		}
		done += k
	}
	return n, nil
}

// ReadAtInto fills bufs, in order, with the bytes of r from off on, with up
// to par reads in flight (pieces of at least 256 KiB). A short read is
// io.ErrUnexpectedEOF.
func ReadAtInto(r io.ReaderAt, off int64, bufs [][]byte, par int) error {
	type job struct {
		b   []byte
		off int64
	}
	var jobs []job
	pos := off
	for _, b := range bufs {
		pieces := max(1, min(int64(max(par, 1)), int64(len(b))/copyPiece))
		size := (int64(len(b)) + pieces - 1) / pieces
		for a := int64(0); a < int64(len(b)); a += size {
			e := min(a+size, int64(len(b)))
			jobs = append(jobs, job{b[a:e], pos + a})
		}
		pos += int64(len(b))
	}
	read := func(j job) error {
		got, err := r.ReadAt(j.b, j.off)
		if got == len(j.b) {
			return nil
		}
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if len(jobs) == 1 || par <= 1 {
		for _, j := range jobs {
			if err := read(j); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, par)
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() { defer wg.Done(); errs[i] = read(j); <-sem }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// drain waits until every reservation is released and every chunk write
// has finished.
func (w *writer) drain() error {
	w.mu.Lock()
	for w.held > 0 {
		w.cond.Wait()
	}
	w.mu.Unlock()
	w.wg.Wait()
	return w.failed()
}

// WriteAt overwrites bytes already written at off (a header written last,
// as FFRecord writers do). The file stays unpublished until Commit.
func (w *writer) WriteAt(p []byte, off int64) (int, error) {
	if err := w.drain(); err != nil {
		return 0, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	end := off + int64(len(p))
	size := w.sizeLocked()
	if off < 0 || end > size {
		return 0, w.setErrLocked(fmt.Errorf("WriteAt [%d, %d) past the %d bytes written", off, end, size))
	}
	staged := w.nextOff // bytes before this are on their way to disk
	if w.cur != nil {
		staged = w.cur.off
	}
	if off < staged {
		k := min(end, staged) - off
		if _, err := w.f.WriteAt(p[:k], off); err != nil {
			return 0, w.setErrLocked(err)
		}
	}
	if end > staged { // the part still staged
		from := max(off, staged)
		copy((*w.cur.buf)[from-staged:], p[from-off:])
	}
	return len(p), nil
}

// release frees what is staged once nothing is in flight.
func (w *writer) releaseAll() {
	w.wg.Wait()
	w.mu.Lock()
	if w.cur != nil && w.cur.pending == 0 {
		chunkPool.Put(w.cur.buf)
		w.cur = nil
	}
	w.mu.Unlock()
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
	var size int64
	if err == nil {
		w.mu.Lock()
		size = w.sizeLocked()
		if c := w.cur; c != nil && c.used > 0 {
			if _, werr := w.f.WriteAt((*c.buf)[:c.used], c.off); werr != nil {
				err = w.setErrLocked(werr)
			}
		}
		w.mu.Unlock()
	}
	w.releaseAll()
	if err == nil && w.allocEnd > 0 {
		err = w.f.Truncate(size) // drop the unused reservation
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

// Close abandons an uncommitted file. Reservations still being filled by
// other goroutines must have been released first.
func (w *writer) Close() error {
	if w.committed {
		return nil
	}
	w.committed = true
	w.setErr(errors.New("closed"))
	w.releaseAll()
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
