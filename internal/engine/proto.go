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
// A body longer than MaxChunk travels as a streamed body (see doc.go): a
// series of chunks of at most MaxChunk bytes each, so no size is capped by
// the frame format; maxBody only bounds what one request may make the engine
// hold in memory at once (a streamed ffw_write holds one chunk).
const (
	maxHeader = 16 << 20
	MaxChunk  = 16 << 20
	maxBody   = 1 << 40
	maxFDs    = 4
	// streamMark in a frame's body-length word announces a streamed body.
	streamMark = 0xFFFFFFFF
)

// frame is one request or response. A streamed body that the operation
// reads itself (see streamOps) is in stream, not in body.
type frame struct {
	header []byte
	body   []byte
	fds    []int
	stream *chunkReader
}

// chunkReader reads a streamed body: after the u64 total, chunks of
// u32 length + bytes (each at most MaxChunk) until total bytes came.
type chunkReader struct {
	c     io.Reader
	total int64 // declared length
	left  int64 // bytes of the body not yet read
	chunk int64 // bytes of the current chunk not yet read
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	if r.chunk == 0 {
		var pre [4]byte
		if _, err := io.ReadFull(r.c, pre[:]); err != nil {
			return 0, unexpected(err)
		}
		n := int64(binary.LittleEndian.Uint32(pre[:]))
		if n == 0 || n > MaxChunk || n > r.left {
			return 0, fmt.Errorf("%w: streamed body chunk of %d bytes with %d of %d left (chunks are 1..%d bytes)",
				ErrProtocol, n, r.left, r.total, MaxChunk)
		}
		r.chunk = n
	}
	if int64(len(p)) > r.chunk {
		p = p[:r.chunk]
	}
	n, err := r.c.Read(p)
	r.chunk -= int64(n)
	r.left -= int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// drain discards the rest of the body, keeping the connection in step.
func (r *chunkReader) drain() error {
	_, err := io.Copy(io.Discard, r)
	return err
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
	if bl != streamMark && bl > MaxChunk {
		closeFDs(f.fds)
		return f, fmt.Errorf("%w: body of %d bytes in one frame (at most %d; longer bodies are streamed)", ErrProtocol, bl, MaxChunk)
	}
	f.header = make([]byte, hl)
	if _, err := io.ReadFull(c, f.header); err != nil {
		closeFDs(f.fds)
		return f, unexpected(err)
	}
	if bl == streamMark {
		var total [8]byte
		if _, err := io.ReadFull(c, total[:]); err != nil {
			closeFDs(f.fds)
			return f, unexpected(err)
		}
		n := int64(binary.LittleEndian.Uint64(total[:]))
		if n < 0 || n > maxBody {
			closeFDs(f.fds)
			return f, fmt.Errorf("%w: streamed body of %d bytes (at most %d)", ErrProtocol, n, int64(maxBody))
		}
		f.stream = &chunkReader{c: c, total: n, left: n}
		return f, nil
	}
	f.body = make([]byte, bl)
	if _, err := io.ReadFull(c, f.body); err != nil {
		closeFDs(f.fds)
		return f, unexpected(err)
	}
	return f, nil
}

// readBody reads a whole streamed body into memory, for operations that
// do not read theirs as a stream.
func (f *frame) readBody() error {
	if f.stream == nil {
		return nil
	}
	r := f.stream
	f.stream = nil
	f.body = make([]byte, r.total)
	if _, err := io.ReadFull(r, f.body); err != nil {
		f.body = nil
		return unexpected(err)
	}
	return nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// encodeHeader marshals a header (batch replies come encoded already).
func encodeHeader(header any) ([]byte, error) {
	if raw, ok := header.(json.RawMessage); ok {
		return raw, nil
	}
	h, err := json.Marshal(header)
	if err != nil {
		return nil, fmt.Errorf("engine: encode header: %w", err)
	}
	return h, nil
}

// appendFrame appends a whole frame to dst: body in the frame when it is
// at most chunk bytes, else streamed in chunks of at most chunk bytes.
func appendFrame(dst, h, body []byte, chunk int) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(h)))
	if len(body) <= chunk {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(body)))
		dst = append(dst, h...)
		return append(dst, body...)
	}
	dst = binary.LittleEndian.AppendUint32(dst, streamMark)
	dst = append(dst, h...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(body)))
	for len(body) > 0 {
		k := min(len(body), chunk)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(k))
		dst = append(dst, body[:k]...)
		body = body[k:]
	}
	return dst
}

// writeFrame sends a header (marshalled to JSON), a body and descriptors,
// in one message where possible. A body longer than MaxChunk is streamed
// (written chunk by chunk, never copied whole).
func writeFrame(c *net.UnixConn, header any, body []byte, fds []int) error {
	h, err := encodeHeader(header)
	if err != nil {
		return err
	}
	streamed := len(body) > MaxChunk
	var buf []byte
	if streamed {
		buf = appendFrame(make([]byte, 0, 16+len(h)), h, nil, MaxChunk)
		binary.LittleEndian.PutUint32(buf[4:8], streamMark)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(len(body)))
	} else {
		buf = appendFrame(make([]byte, 0, 8+len(h)+len(body)), h, body, MaxChunk)
	}
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
	for streamed && len(body) > 0 {
		k := min(len(body), MaxChunk)
		var pre [4]byte
		binary.LittleEndian.PutUint32(pre[:], uint32(k))
		if _, err := c.Write(pre[:]); err != nil {
			return err
		}
		if _, err := c.Write(body[:k]); err != nil {
			return err
		}
		body = body[k:]
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
