package engine

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrProtocol: a peer sent a frame that does not follow the protocol.
var ErrProtocol = errkind.New(errkind.Usage, "engine: protocol error")

// Limits that keep a bad frame from making the engine allocate without bound.
const (
	maxHeader = 16 << 20
	maxBody   = 1 << 30
	maxFDs    = 4
)

// frame is one request or response.
type frame struct {
	header []byte
	body   []byte
	fds    []int
}

// readFrame reads one frame and any descriptors sent with it.
func readFrame(c *net.UnixConn) (frame, error) {
	var f frame
	var pre [8]byte
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	n, oobn, _, _, err := c.ReadMsgUnix(pre[:], oob)
	if err != nil {
		return f, err
	}
	if n == 0 {
		return f, io.EOF
	}
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return f, fmt.Errorf("%w: bad control message: %v", ErrProtocol, err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err == nil {
				f.fds = append(f.fds, fds...)
			}
		}
	}
	if n < len(pre) {
		if _, err := io.ReadFull(c, pre[n:]); err != nil {
			closeFDs(f.fds)
			return f, unexpected(err)
		}
	}
	hl := binary.LittleEndian.Uint32(pre[0:4])
	bl := binary.LittleEndian.Uint32(pre[4:8])
	if hl > maxHeader {
		closeFDs(f.fds)
		return f, fmt.Errorf("%w: header of %d bytes", ErrProtocol, hl)
	}
	if bl > maxBody {
		closeFDs(f.fds)
		return f, fmt.Errorf("%w: body of %d bytes", ErrProtocol, bl)
	}
	f.header = make([]byte, hl)
	if _, err := io.ReadFull(c, f.header); err != nil {
		closeFDs(f.fds)
		return f, unexpected(err)
	}
	f.body = make([]byte, bl)
	if _, err := io.ReadFull(c, f.body); err != nil {
		closeFDs(f.fds)
		return f, unexpected(err)
	}
	return f, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// writeFrame sends a response header (marshalled to JSON), a body and
// descriptors in one message where possible.
func writeFrame(c *net.UnixConn, header any, body []byte, fds []int) error {
	var h []byte
	if raw, ok := header.(json.RawMessage); ok {
		h = raw // already encoded (batch replies)
	} else {
		var err error
		if h, err = json.Marshal(header); err != nil {
			return fmt.Errorf("engine: encode response: %w", err)
		}
	}
	buf := make([]byte, 8+len(h), 8+len(h)+len(body))
	binary.LittleEndian.PutUint32(buf[0:4], uint32(len(h)))
	binary.LittleEndian.PutUint32(buf[4:8], uint32(len(body)))
	copy(buf[8:], h)
	buf = append(buf, body...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := c.WriteMsgUnix(buf, oob, nil)
	if err != nil {
		return err
	}
	for n < len(buf) {
		m, err := c.Write(buf[n:])
		if err != nil {
			return err
		}
		n += m
	}
	return nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// int64s decodes a body of little-endian int64s.
func int64s(b []byte) ([]int64, error) {
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("%w: body of %d bytes is not a list of int64", ErrProtocol, len(b))
	}
	out := make([]int64, len(b)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out, nil
}

// putInt64s encodes int64s little-endian.
func putInt64s(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}
