package ffrecord

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/errkind"
)

// Errors. Wrapped errors keep their kind (errkind.Of) and match errors.Is.
var (
	// ErrCorrupt: the file's structure is wrong (impossible n, offsets out
	// of order or outside the file, not an FFRecord file).
	ErrCorrupt = errkind.New(errkind.Data, "ffrecord: corrupt file")
	// ErrChecksum: a header or sample checksum does not match its bytes.
	ErrChecksum = errkind.New(errkind.Data, "ffrecord: checksum mismatch")
	// ErrTruncated: the file ends before the data its header describes.
	ErrTruncated = errkind.New(errkind.Data, "ffrecord: truncated file")
	// ErrIndex: a sample index outside [0, N), or a bad request.
	ErrIndex = errkind.New(errkind.Usage, "ffrecord: sample index out of range")
	// ErrNoFiles: a directory holds no *.ffr file, or no path was given.
	ErrNoFiles = errkind.New(errkind.Usage, "ffrecord: no .ffr files")
)

// SampleError is an error about one sample: which file, which sample and
// which bytes.
type SampleError struct {
	Path  string // the file
	Index int64  // global sample index in the dataset (-1 when unknown)
	Local int64  // sample index inside the file
	Off   int64  // first byte of the sample in the file
	Len   int64  // the sample's length according to the header
	Err   error  // what is wrong; matches ErrChecksum, ErrTruncated, ...
}

func (e *SampleError) Error() string {
	idx := fmt.Sprintf("sample %d", e.Local)
	if e.Index >= 0 && e.Index != e.Local {
		idx = fmt.Sprintf("sample %d (sample %d of the file)", e.Index, e.Local)
	}
	return fmt.Sprintf("%s: %s, bytes [%d, %d): %v", e.Path, idx, e.Off, e.Off+e.Len, e.Err)
}

func (e *SampleError) Unwrap() error { return e.Err }

// Layout constants.
const (
	prefixLen = 12 // header checksum + n
	perSample = 12 // crc32 + offset
)

// HeaderLen is the size of the header of a file of n samples.
func HeaderLen(n int64) int64 { return prefixLen + perSample*n }

var crcTable = crc32.IEEETable

// Checksum is the CRC-32 (IEEE) FFRecord stores for a sample.
func Checksum(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

// header is one file's parsed and validated header.
type header struct {
	path     string
	size     int64
	n        int64
	stored   uint32 // header checksum as stored
	computed uint32 // CRC-32 of bytes [4, 12+12n)
	legacy   bool   // stored checksum 0: not checked
	crcs     []uint32
	offsets  []int64
	// damaged is the first sample a truncation damaged or removed, or -1.
	damaged int64
	// broken, for a file opened with ReadOptions.AllowDamaged, is why its
	// samples from damaged on cannot be read (nil: the file is intact).
	broken error
}

func (h *header) hdrLen() int64 { return HeaderLen(h.n) }

// end returns the end offset of sample i (the next sample's start, or the
// file size for the last sample).
func (h *header) end(i int64) int64 {
	if i+1 < h.n {
		return h.offsets[i+1]
	}
	// A truncated file's last sample may start past the end: length 0.
	return max(h.size, h.offsets[i])
}

func (h *header) sampleErr(i int64, err error) *SampleError {
	e := &SampleError{Path: h.path, Index: -1, Local: i, Err: err}
	if i >= 0 && i < int64(len(h.offsets)) {
		e.Off = h.offsets[i]
		e.Len = h.end(i) - e.Off
	}
	return e
}

// headerChunk is the unit the header is read in; the first read is
// headerChunk bytes so that small files open with one read.
const headerChunk = 1 << 20

// readHeader reads and validates the header of f. It returns a non-nil
// header together with the error when the header itself is intact but the
// file is truncated (h.damaged says where), so that verify can still check
// the samples before the cut.
func readHeader(ctx context.Context, f fs.File, path string) (*header, error) {
	size := f.Size()
	h := &header{path: path, size: size, damaged: -1}
	if size < prefixLen {
		return nil, fmt.Errorf("%s: %d bytes, shorter than the %d-byte FFRecord prefix (not an FFRecord file, or cut short): %w",
			path, size, prefixLen, ErrCorrupt)
	}
	first := make([]byte, min(size, headerChunk))
	if err := readFull(f, first, 0); err != nil {
		return nil, fmt.Errorf("%s: read header: %w", path, err)
	}
	h.stored = binary.LittleEndian.Uint32(first[0:4])
	n := int64(binary.LittleEndian.Uint64(first[4:12]))
	if n < 0 {
		return nil, fmt.Errorf("%s: header says n = %d samples (negative): %w", path, n, ErrCorrupt)
	}
	if maxN := (size - prefixLen) / perSample; n > maxN {
		// The header does not fit. If the first offset is readable and
		// points right behind a header of n samples, n is genuine and the
		// file was cut inside its header; otherwise n is garbage.
		need := "more than 2^62"
		if n < (1<<62)/perSample {
			need = fmt.Sprint(HeaderLen(n))
		}
		if n <= (size-prefixLen-8)/4 {
			var b [8]byte
			if err := readFull(f, b[:], prefixLen+4*n); err == nil && int64(binary.LittleEndian.Uint64(b[:])) == HeaderLen(n) {
				h.n = n
				h.damaged = 0
				return h, fmt.Errorf("%s: file is %d bytes but the header of its %d samples needs %s bytes: cut inside the header, samples 0..%d missing: %w",
					path, size, n, need, n-1, ErrTruncated)
			}
		}
		return nil, fmt.Errorf("%s: header says n = %d samples, impossible for a %d-byte file (at most %d): %w",
			path, n, size, maxN, ErrCorrupt)
	}
	h.n = n
	hl := h.hdrLen()
	if hl <= int64(len(first)) && h.stored != 0 {
		// The whole header is at hand: check its checksum first, the most
		// precise diagnosis of a damaged header.
		if c := crc32.Checksum(first[4:hl], crcTable); c != h.stored {
			return nil, fmt.Errorf("%s: header checksum mismatch over bytes [4, %d): stored %08x, computed %08x (a header byte is damaged): %w",
				path, hl, h.stored, c, ErrChecksum)
		}
	}
	if n > 0 {
		// Cheap plausibility check before allocating 12n bytes: the first
		// offset must point behind the header and inside the file.
		var b [8]byte
		if err := readFull(f, b[:], prefixLen+4*n); err != nil {
			return nil, fmt.Errorf("%s: read header: %w", path, err)
		}
		if off0 := int64(binary.LittleEndian.Uint64(b[:])); off0 < hl || off0 > size {
			return nil, fmt.Errorf("%s: sample 0 offset %d is outside the data area [%d, %d] (n = %d): %w",
				path, off0, hl, size, n, ErrCorrupt)
		}
	}
	h.crcs = make([]uint32, n)
	h.offsets = make([]int64, n)
	crc := crc32.Update(0, crcTable, first[4:min(int64(len(first)), hl)])
	// Decode the arrays from the header bytes, chunk by chunk.
	buf := first
	bufOff := int64(0)
	var carry []byte // a field split across chunks
	crcEnd, offEnd := prefixLen+4*n, hl
	pos := int64(prefixLen)
	for pos < hl {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if pos >= bufOff+int64(len(buf)) {
			bufOff = pos
			m := min(hl-pos, headerChunk)
			if int64(cap(buf)) >= m {
				buf = buf[:m]
			} else {
				buf = make([]byte, m)
			}
			if err := readFull(f, buf, pos); err != nil {
				return nil, fmt.Errorf("%s: read header: %w", path, err)
			}
			crc = crc32.Update(crc, crcTable, buf)
		}
		chunk := buf[pos-bufOff : min(int64(len(buf)), hl-bufOff)]
		for len(chunk) > 0 {
			width := int64(4)
			if pos >= crcEnd {
				width = 8
			}
			var field []byte
			if len(carry) > 0 || int64(len(chunk)) < width-int64(len(carry)) {
				take := min(int(width)-len(carry), len(chunk))
				carry = append(carry, chunk[:take]...)
				chunk = chunk[take:]
				pos += int64(take)
				if int64(len(carry)) < width {
					continue
				}
				field, carry = carry, carry[:0:0]
			} else {
				field = chunk[:width]
				chunk = chunk[width:]
				pos += width
			}
			fieldStart := pos - width
			if fieldStart < crcEnd {
				h.crcs[(fieldStart-prefixLen)/4] = binary.LittleEndian.Uint32(field)
			} else if fieldStart < offEnd {
				h.offsets[(fieldStart-crcEnd)/8] = int64(binary.LittleEndian.Uint64(field))
			}
		}
	}
	h.computed = crc
	if h.stored == 0 {
		h.legacy = h.computed != 0
	} else if h.stored != h.computed {
		return nil, fmt.Errorf("%s: header checksum mismatch over bytes [4, %d): stored %08x, computed %08x (a header byte is damaged): %w",
			path, hl, h.stored, h.computed, ErrChecksum)
	}
	if err := h.checkOffsets(); err != nil {
		if h.damaged >= 0 {
			return h, err
		}
		return nil, err
	}
	return h, nil
}

// checkOffsets checks that offsets start behind the header, never go
// backwards and lie inside the file; a file whose offsets run past its end
// was truncated and h.damaged names the first damaged or missing sample.
func (h *header) checkOffsets() error {
	hl := h.hdrLen()
	prev := hl
	for i, off := range h.offsets {
		if off < prev {
			if i == 0 {
				return &SampleError{Path: h.path, Index: -1, Local: 0, Off: off,
					Err: fmt.Errorf("%w: sample 0 starts at byte %d, inside the %d-byte header", ErrCorrupt, off, hl)}
			}
			return &SampleError{Path: h.path, Index: -1, Local: int64(i), Off: off,
				Err: fmt.Errorf("%w: sample %d starts at byte %d, before sample %d (byte %d): offsets go backwards", ErrCorrupt, i, off, i-1, prev)}
		}
		prev = off
	}
	if h.n == 0 || h.offsets[h.n-1] <= h.size {
		return nil
	}
	// Truncated: find the first sample that starts past the end of file;
	// the one before it is cut (or, if it starts exactly at the end, missing).
	i := int64(sort.Search(len(h.offsets), func(k int) bool { return h.offsets[k] > h.size }))
	d := max(i-1, 0)
	h.damaged = d
	e := h.sampleErr(d, nil)
	e.Len = h.offsets[min(d+1, h.n-1)] - e.Off
	if d == h.n-1 {
		e.Len = 0
	}
	e.Err = fmt.Errorf("%w: the file is %d bytes and ends inside or before sample %d; samples %d..%d (%d) are damaged or missing",
		ErrTruncated, h.size, d, d, h.n-1, h.n-d)
	return e
}

// encodeHeader returns the header bytes for the given sample checksums and
// lengths, with the data starting at dataStart (HeaderLen(n) in files the
// reference writes).
func encodeHeader(crcs []uint32, lengths []int64, dataStart int64) []byte {
	n := int64(len(crcs))
	hl := HeaderLen(n)
	b := make([]byte, hl)
	binary.LittleEndian.PutUint64(b[4:12], uint64(n))
	for i, c := range crcs {
		binary.LittleEndian.PutUint32(b[prefixLen+4*i:], c)
	}
	off := dataStart
	base := prefixLen + 4*n
	for i, l := range lengths {
		binary.LittleEndian.PutUint64(b[base+8*int64(i):], uint64(off))
		off += l
	}
	binary.LittleEndian.PutUint32(b[0:4], crc32.Checksum(b[4:], crcTable))
	return b
}

// readFull reads len(b) bytes at off, turning a short read into ErrTruncated.
func readFull(f fs.File, b []byte, off int64) error {
	n, err := f.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, fs.ErrShortRead) {
		return fmt.Errorf("bytes [%d, %d): got only %d: %w", off, off+int64(len(b)), n, ErrTruncated)
	}
	return err
}
