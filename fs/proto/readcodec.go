package proto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Batched reads are the cluster's hottest requests (a batch of small
// sample reads is one BatchReadReq per storage service), so their headers
// travel in a compact binary form rather than JSON: the transport uses
// AppendHeader and DecodeHeader (transport.HeaderCodec). Integers are
// uvarints; strings are a uvarint length and the bytes.
//
//	BatchReadReq:  'R' 1, host, count, count x (chain, chain version,
//	               target, inode, index, off, len, flags: 1 sums, 2 local)
//	BatchReadResp: 'r' 1, count, count x (flags: 1 error, 2 path, 4 cold;
//	               n, sums, [path, file offset], [code, message])

const readCodecVersion = 1

// AppendHeader encodes r (transport.HeaderCodec).
func (r BatchReadReq) AppendHeader(b []byte) []byte {
	b = append(b, 'R', readCodecVersion)
	b = appendString(b, r.Host)
	b = binary.AppendUvarint(b, uint64(len(r.IOs)))
	for _, io := range r.IOs {
		b = binary.AppendUvarint(b, uint64(io.Chain))
		b = binary.AppendUvarint(b, io.ChainVer)
		b = binary.AppendUvarint(b, uint64(io.Target))
		b = binary.AppendUvarint(b, io.Chunk.Inode)
		b = binary.AppendUvarint(b, io.Chunk.Index)
		b = binary.AppendUvarint(b, uint64(io.Off))
		b = binary.AppendUvarint(b, uint64(io.Len))
		var flags byte
		if io.Sums {
			flags |= 1
		}
		if io.Local {
			flags |= 2
		}
		b = append(b, flags)
	}
	return b
}

// DecodeHeader decodes what AppendHeader wrote, or the JSON form older
// clients send.
func (r *BatchReadReq) DecodeHeader(h []byte) error {
	d := decoder{b: h, what: "batch read request", kind: ErrBadRequest}
	type plain BatchReadReq // no DecodeHeader method: plain JSON
	if d.json((*plain)(r)) {
		return d.err
	}
	d.magic('R')
	r.Host = d.string()
	n := d.count(8)
	r.IOs = make([]ReadIO, n)
	for i := range r.IOs {
		io := &r.IOs[i]
		io.Chain = ChainID(d.u32())
		io.ChainVer = d.uvarint()
		io.Target = TargetID(d.u32())
		io.Chunk.Inode = d.uvarint()
		io.Chunk.Index = d.uvarint()
		io.Off = d.int64()
		io.Len = d.int64()
		flags := d.byte()
		io.Sums, io.Local = flags&1 != 0, flags&2 != 0
	}
	return d.done()
}

// AppendHeader encodes r (transport.HeaderCodec).
func (r BatchReadResp) AppendHeader(b []byte) []byte {
	b = append(b, 'r', readCodecVersion)
	b = binary.AppendUvarint(b, uint64(len(r.Results)))
	for _, res := range r.Results {
		var flags byte
		if res.Code != "" || res.Msg != "" {
			flags |= 1
		}
		if res.Path != "" {
			flags |= 2
		}
		if res.Cold {
			flags |= 4
		}
		b = append(b, flags)
		b = binary.AppendUvarint(b, uint64(res.N))
		b = binary.AppendUvarint(b, uint64(res.Sums))
		if flags&2 != 0 {
			b = appendString(b, res.Path)
			b = binary.AppendUvarint(b, uint64(res.FileOff))
		}
		if flags&1 != 0 {
			b = appendString(b, res.Code)
			b = appendString(b, res.Msg)
		}
	}
	return b
}

// DecodeHeader decodes what AppendHeader wrote, or the JSON form older
// services send. A malformed reply is an ErrIO (the read is retried).
func (r *BatchReadResp) DecodeHeader(h []byte) error {
	d := decoder{b: h, what: "batch read reply", kind: ErrIO}
	type plain BatchReadResp
	if d.json((*plain)(r)) {
		return d.err
	}
	d.magic('r')
	n := d.count(3)
	r.Results = make([]ReadResult, n)
	for i := range r.Results {
		res := &r.Results[i]
		flags := d.byte()
		res.N = d.int64()
		res.Sums = d.int64()
		res.Cold = flags&4 != 0
		if flags&2 != 0 {
			res.Path = d.string()
			res.FileOff = d.int64()
		}
		if flags&1 != 0 {
			res.Code = d.string()
			res.Msg = d.string()
		}
	}
	return d.done()
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads a binary header; the first problem sticks (later reads
// return zeros) and done reports it, with the offset where it was found.
type decoder struct {
	b    []byte
	off  int
	what string
	kind error // what a malformed header is (ErrBadRequest, ErrIO)
	err  error
}

var errShort = errors.New("truncated")

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s header at byte %d: %w", d.kind, d.what, d.off, err)
	}
}

// json decodes the header into v if it is the JSON form older peers
// send, and reports whether it was (d.err holds the outcome).
func (d *decoder) json(v any) bool {
	if len(d.b) == 0 || d.b[0] != '{' {
		return false
	}
	if err := json.Unmarshal(d.b, v); err != nil {
		d.fail(err)
	}
	return true
}

func (d *decoder) magic(m byte) {
	if len(d.b) < 2 || d.b[0] != m || d.b[1] != readCodecVersion {
		d.fail(fmt.Errorf("not a version %d %q header", readCodecVersion, m))
		return
	}
	d.off = 2
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.off += n
	return v
}

// upTo reads a uvarint no larger than max.
func (d *decoder) upTo(max uint64) uint64 {
	v := d.uvarint()
	if v > max {
		d.fail(fmt.Errorf("value %d out of range", v))
		return 0
	}
	return v
}

func (d *decoder) u32() uint32  { return uint32(d.upTo(math.MaxUint32)) }
func (d *decoder) int64() int64 { return int64(d.upTo(math.MaxInt64)) }

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.b) {
		d.fail(errShort)
		return 0
	}
	d.off++
	return d.b[d.off-1]
}

// count reads an element count; each element takes at least min bytes,
// so a count the rest of the header cannot hold is refused before any
// allocation.
func (d *decoder) count(min int) int {
	v := d.uvarint()
	if v > uint64(len(d.b)-d.off)/uint64(min) {
		d.fail(fmt.Errorf("count %d larger than the header", v))
		return 0
	}
	return int(v)
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail(errShort)
		return ""
	}
	s := string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}

func (d *decoder) done() error {
	if d.err == nil && d.off != len(d.b) {
		d.fail(fmt.Errorf("%d bytes left over", len(d.b)-d.off))
	}
	return d.err
}
