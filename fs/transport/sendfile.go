package transport

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// fileSrc says that a reply data part holds bytes of a file: the server
// may send them with sendfile(2) straight from the page cache.
type fileSrc struct {
	f   *os.File
	off int64
	n   int
}

// SendFile tells the server that the reply data part b (a slice the
// handler returns in its data) holds exactly the n=len(b) bytes of f at
// off, and that they do not change while the reply is written (the
// handler keeps f open until AfterReply). The server then sends them with
// sendfile(2): the kernel hands the page-cache pages to the socket, and
// the bytes are not copied through b. A handler still reads b itself when
// it must check it (a checksum) before replying.
func (r *Request) SendFile(b []byte, f *os.File, off int64) {
	if len(b) == 0 || f == nil {
		return
	}
	if r.files == nil {
		r.files = map[*byte]fileSrc{}
	}
	r.files[&b[0]] = fileSrc{f: f, off: off, n: len(b)}
}

// writeFrameFiles is writeFrame for a reply some of whose data parts are
// sent from files (see Request.SendFile); memory parts in between go out
// with writev as usual.
func writeFrameFiles(nc net.Conn, mu *sync.Mutex, id uint64, typ byte, method uint16, hdr []byte, data [][]byte, files map[*byte]fileSrc) error {
	tc, ok := nc.(*net.TCPConn)
	if !ok || len(files) == 0 {
		return writeFrame(nc, mu, id, typ, method, hdr, data)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return writeFrame(nc, mu, id, typ, method, hdr, data)
	}
	n := 0
	for _, d := range data {
		n += len(d)
	}
	head := appendHead(make([]byte, 0, prefixLen+fixedLen+len(hdr)), id, typ, method, len(hdr), n)
	head = append(head, hdr...)
	bufs := net.Buffers{head}
	mu.Lock()
	defer mu.Unlock()
	for _, d := range data {
		if len(d) == 0 {
			continue
		}
		src, ok := files[&d[0]]
		if !ok || src.n != len(d) {
			bufs = append(bufs, d)
			continue
		}
		if len(bufs) > 0 {
			if _, err := bufs.WriteTo(nc); err != nil {
				return err
			}
			bufs = nil
		}
		if err := sendFile(rc, src); err != nil {
			return err
		}
	}
	if len(bufs) > 0 {
		_, err := bufs.WriteTo(nc)
		return err
	}
	return nil
}

// sendFile writes src to the socket with sendfile(2), waiting for the
// socket through the runtime's poller when it is full. A file shorter
// than src.n is an error (the frame is then incomplete and the caller
// closes the connection).
func sendFile(rc syscall.RawConn, src fileSrc) error {
	frc, err := src.f.SyscallConn()
	if err != nil {
		return err
	}
	off, left := src.off, src.n
	var serr error
	cerr := frc.Control(func(sfd uintptr) {
		werr := rc.Write(func(fd uintptr) bool {
			for left > 0 {
				k, e := unix.Sendfile(int(fd), int(sfd), &off, min(left, 1<<30))
				if k > 0 {
					left -= k
				}
				switch {
				case e == unix.EAGAIN:
					return false // wait until the socket is writable
				case e == unix.EINTR:
					continue
				case e != nil:
					serr = e
					return true
				case k == 0:
					serr = io.ErrUnexpectedEOF
					return true
				}
			}
			return true
		})
		if serr == nil {
			serr = werr
		}
	})
	if cerr != nil {
		return cerr
	}
	if serr != nil {
		return fmt.Errorf("transport: sendfile %s at %d (%d bytes left): %w", src.f.Name(), off, left, serr)
	}
	return nil
}
