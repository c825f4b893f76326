package client

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs/proto"
)

// Short-circuit reads (Options.NoLocalReads, proto.ReadIO.Local): the
// target answers with the path of the committed chunk file holding the
// bytes, which never changes, and the client reads them itself. Bytes the
// target found out of its page cache (ReadResult.Cold) are read
//   - with O_DIRECT if the caller asked (ChunkRead.Direct), in directPiece
//     requests, directParallel at once, straight into the caller's buffer
//     when it is aligned: the device sees requests of the size and depth
//     it serves best, and neither the page cache nor a copy out of it is
//     involved;
//   - through the page cache otherwise (the kernel's read-ahead fetching
//     ahead of the client's reads), which keeps them for the next reader.

// testHookLocalRead, when set (tests only), runs before a local read
// opens its file: a test sees the answer, or makes the file change under
// the read.
var testHookLocalRead func(res *proto.ReadResult)

// readLocal reads a local result's bytes from the chunk file the target
// named and delivers them, checked against sums.
func (c *Client) readLocal(i int, res *proto.ReadResult, direct bool, sums []byte, deliver func(int, int64, fillFunc, []byte) error) error {
	if testHookLocalRead != nil {
		testHookLocalRead(res)
	}
	odirect := direct && res.Cold && res.FileOff%directAlign == 0
	// Only a regular file, never through a symlink, and no blocking open
	// of a FIFO, whatever path the target named.
	flags := os.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK
	f, err := os.OpenFile(res.Path, flags|directFlag(odirect), 0)
	if odirect && errors.Is(err, unix.EINVAL) {
		// A file system without O_DIRECT: read through the page cache.
		odirect = false
		f, err = os.OpenFile(res.Path, flags, 0)
	}
	if err != nil {
		return fmt.Errorf("local read: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() || st.Size() < res.FileOff+res.N {
		return fmt.Errorf("local read: %s is not a regular file holding [%d, +%d) (%v)", res.Path, res.FileOff, res.N, err)
	}
	fill := streamFill(io.NewSectionReader(f, res.FileOff, res.N))
	if odirect {
		fill = directFill(f, res.FileOff)
	}
	if err := deliver(i, res.N, fill, sums); err != nil {
		return fmt.Errorf("local read of %s: %w", res.Path, err)
	}
	c.countLocalRead(res.N)
	return nil
}

func directFlag(on bool) int {
	if on {
		return unix.O_DIRECT
	}
	return 0
}

const (
	directAlign = 4096
	directPiece = 256 << 10
)

var bouncePool = sync.Pool{New: func() any {
	b := make([]byte, directPiece+directAlign)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & (directAlign - 1))
	b = b[off : off+directPiece]
	return &b
}}

// directFill fills a buffer from an O_DIRECT file at off, in directPiece
// reads, directParallel at once (the device serves a few reads in flight
// much faster than one), then checks the sums. A piece of an aligned
// buffer is read straight into it; any other (an unaligned buffer, the
// short tail of a chunk) through an aligned bounce buffer.
func directFill(f *os.File, off int64) fillFunc {
	return func(buf []byte, at0 int64, sums []byte) (bool, error) {
		var g errgroup.Group
		g.SetLimit(directParallel)
		for lo := 0; lo < len(buf); lo += directPiece {
			p := buf[lo:min(lo+directPiece, len(buf))]
			at := off + at0 + int64(lo)
			g.Go(func() error { return readDirect(f, p, at) })
		}
		if err := g.Wait(); err != nil {
			return false, err
		}
		return checkSums(buf, sums), nil
	}
}

const directParallel = 4

// readDirect fills p (at most directPiece bytes) from an O_DIRECT file at
// off (aligned).
func readDirect(f *os.File, p []byte, off int64) error {
	if uintptr(unsafe.Pointer(&p[0]))%directAlign == 0 && len(p)%directAlign == 0 {
		n, err := f.ReadAt(p, off)
		if n == len(p) {
			return nil
		}
		return noEOF(err)
	}
	bp := bouncePool.Get().(*[]byte)
	defer bouncePool.Put(bp)
	want := (len(p) + directAlign - 1) &^ (directAlign - 1)
	n, err := f.ReadAt((*bp)[:want], off)
	if copy(p, (*bp)[:min(n, len(p))]) == len(p) {
		return nil
	}
	return noEOF(err)
}

// noEOF turns a short read's EOF into ErrUnexpectedEOF: the file was
// shorter than the target said.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
