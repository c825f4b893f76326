package transport

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Frame types.
const (
	TRequest  = 1
	TReply    = 2
	TError    = 3
	THello    = 4
	THelloOK  = 5
	TProof    = 6
	prefixLen = 4
	fixedLen  = 16 // id, type, reserved, method, header length
)

// DefaultMaxFrame bounds a frame: a full 64 MiB chunk plus headers.
const DefaultMaxFrame = 64<<20 + 1<<20

// ErrFrame: a malformed or oversized frame.
var ErrFrame = errkind.New(errkind.Data, "transport: bad frame")

// Frame is one decoded frame. Header and Data point into one buffer that
// belongs to the receiver.
type Frame struct {
	buf    []byte // the pooled buffer Header and Data point into
	ID     uint64
	Type   byte
	Method uint16
	Header []byte
	Data   []byte
}

// appendHead encodes the frame prefix and fixed fields for a frame with the
// given header and data lengths.
func appendHead(dst []byte, id uint64, typ byte, method uint16, hdrLen, dataLen int) []byte {
	var b [prefixLen + fixedLen]byte
	binary.BigEndian.PutUint32(b[0:], uint32(fixedLen+hdrLen+dataLen))
	binary.BigEndian.PutUint64(b[4:], id)
	b[12] = typ
	binary.BigEndian.PutUint16(b[14:], method)
	binary.BigEndian.PutUint32(b[16:], uint32(hdrLen))
	return append(dst, b[:]...)
}

// EncodeFrame returns f as bytes (tests and small frames; the hot path
// uses writev).
func EncodeFrame(f Frame) []byte {
	b := appendHead(nil, f.ID, f.Type, f.Method, len(f.Header), len(f.Data))
	b = append(b, f.Header...)
	return append(b, f.Data...)
}

// ReadFrame reads one frame from r, rejecting frames longer than max.
func ReadFrame(r io.Reader, max int) (Frame, error) {
	var p [prefixLen]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(p[:])
	if n < fixedLen || uint64(n) > uint64(max) {
		return Frame{}, fmt.Errorf("%w: length %d outside [%d, %d]", ErrFrame, n, fixedLen, max)
	}
	buf := GetBuffer(int(n))
	if _, err := io.ReadFull(r, buf); err != nil {
		PutBuffer(buf)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, fmt.Errorf("transport: frame of %d bytes cut short: %w", n, err)
	}
	f, err := decodeBody(buf)
	if err != nil {
		PutBuffer(buf)
		return f, err
	}
	f.buf = buf
	return f, nil
}

// Release recycles the frame's buffer; Header and Data are invalid after.
func (f *Frame) Release() {
	if f.buf != nil {
		PutBuffer(f.buf)
		f.buf = nil
	}
}

// DecodeFrame decodes one complete frame held in b (prefix included).
func DecodeFrame(b []byte, max int) (Frame, error) {
	if len(b) < prefixLen {
		return Frame{}, fmt.Errorf("%w: %d bytes, shorter than the length prefix", ErrFrame, len(b))
	}
	n := binary.BigEndian.Uint32(b)
	if n < fixedLen || uint64(n) > uint64(max) {
		return Frame{}, fmt.Errorf("%w: length %d outside [%d, %d]", ErrFrame, n, fixedLen, max)
	}
	if uint64(len(b)-prefixLen) != uint64(n) {
		return Frame{}, fmt.Errorf("%w: length says %d bytes, have %d", ErrFrame, n, len(b)-prefixLen)
	}
	return decodeBody(b[prefixLen:])
}

func decodeBody(buf []byte) (Frame, error) {
	f := Frame{
		ID:     binary.BigEndian.Uint64(buf[0:]),
		Type:   buf[8],
		Method: binary.BigEndian.Uint16(buf[10:]),
	}
	if f.Type < TRequest || f.Type > TProof || buf[9] != 0 {
		return Frame{}, fmt.Errorf("%w: type %d reserved %d", ErrFrame, f.Type, buf[9])
	}
	h := binary.BigEndian.Uint32(buf[12:])
	if uint64(h) > uint64(len(buf)-fixedLen) {
		return Frame{}, fmt.Errorf("%w: header length %d exceeds frame body %d", ErrFrame, h, len(buf)-fixedLen)
	}
	f.Header = buf[fixedLen : fixedLen+int(h)]
	f.Data = buf[fixedLen+int(h):]
	return f, nil
}
