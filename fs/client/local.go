package client

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs/proto"
)

// Short-circuit reads (Options.NoLocalReads, proto.ReadIO.Local): the
// target answers with the path of the committed chunk file holding the
// bytes, which never changes, and the client reads them itself. Bytes the
// target found out of its page cache (ReadResult.Cold) are read
//   - with O_DIRECT if the caller asked (ChunkRead.Direct), in directPiece
//     requests straight into the caller's buffer when it is aligned: the
//     device sees requests of the size it serves best, and neither the
//     page cache nor a copy out of it is involved;
//   - through the page cache otherwise (the kernel's read-ahead fetching
//     ahead of the client's reads), which keeps them for the next reader.

// testHookLocalRead, when set (tests only), runs before a local read
// opens its file: a test sees the answer, or makes the file change under
// the read.
var testHookLocalRead func(res *proto.ReadResult)

// readLocal reads a local result's bytes from the chunk file the target
// named and delivers them, checked against sums.
func (c *Client) readLocal(i int, res *proto.ReadResult, direct bool, sums []byte, deliver func(int, int64, io.Reader, []byte) error) error {
	if testHookLocalRead != nil {
		testHookLocalRead(res)
	}
	odirect := direct && res.Cold && res.FileOff%directAlign == 0
	flags := os.O_RDONLY
	if odirect {
		flags |= unix.O_DIRECT
	}
	f, err := os.OpenFile(res.Path, flags, 0)
	if odirect && errors.Is(err, unix.EINVAL) {
		// A file system without O_DIRECT: read through the page cache.
		odirect = false
		f, err = os.Open(res.Path)
	}
	if err != nil {
		return fmt.Errorf("local read: %w", err)
	}
	defer f.Close()
	var rd io.Reader = io.NewSectionReader(f, res.FileOff, res.N)
	if odirect {
		rd = &directReader{f: f, off: res.FileOff, end: res.FileOff + res.N}
	}
	if err := deliver(i, res.N, rd, sums); err != nil {
		return fmt.Errorf("local read of %s: %w", res.Path, err)
	}
	c.countLocalRead(res.N)
	return nil
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

// directReader reads [off, end) of an O_DIRECT file in order. A Read into
// an aligned buffer of whole blocks goes straight there; any other (an
// unaligned buffer, the short tail of a chunk) through an aligned bounce
// buffer.
type directReader struct {
	f        *os.File
	off, end int64
}

func (d *directReader) Read(p []byte) (int, error) {
	if d.off >= d.end {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), d.end-d.off, directPiece)]
	if len(p) == 0 {
		return 0, nil
	}
	if uintptr(unsafe.Pointer(&p[0]))%directAlign == 0 && len(p)%directAlign == 0 {
		n, err := d.f.ReadAt(p, d.off)
		d.off += int64(n)
		if n == len(p) {
			err = nil
		}
		return n, noEOF(err)
	}
	bp := bouncePool.Get().(*[]byte)
	defer bouncePool.Put(bp)
	want := (len(p) + directAlign - 1) &^ (directAlign - 1)
	n, err := d.f.ReadAt((*bp)[:want], d.off)
	n = copy(p, (*bp)[:min(n, len(p))])
	d.off += int64(n)
	if n == len(p) {
		err = nil
	}
	return n, noEOF(err)
}

// noEOF turns a short read's EOF into ErrUnexpectedEOF: the file was
// shorter than the target said.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
