package storage

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// DirectWriter is implemented by a VFS that can write a chunk's bytes
// around the page cache (OS does, with O_DIRECT).
//
// Why: a chunk is written once per replica and then read from any of
// them; through the page cache every replica's pwrite copies the bytes
// into freshly allocated cache pages, which on the cross-host benchmark
// was the largest CPU cost of a write (more than TLS both ways and the
// checksums together: 9-10 CPU s per GiB written by the client, about
// 5.5 with direct writes). With O_DIRECT the device takes the bytes from
// one aligned buffer; the chunk's fsync still makes them durable (it
// flushes the device's cache with the file's metadata). The chunk's
// preferred replica for reads (proto.ChunkHash) still writes through the
// page cache, so reads that follow a write find the chunk cached there,
// and the hosts cache one copy of it, not three.
type DirectWriter interface {
	// WriteDirect writes a whole number of DirectAlign blocks from the
	// start of data to the file name at off (a multiple of DirectAlign)
	// and returns how many bytes it wrote; the caller writes the rest
	// (and all of data when it returns 0) through the page cache. It
	// returns 0 and no error where direct writes are not supported.
	WriteDirect(name string, data []byte, off int64) (int, error)
}

// DirectAlign is the alignment of direct writes: offsets, lengths and
// buffers.
const DirectAlign = 4096

// directOff is set when O_DIRECT failed with EINVAL (a file system
// without it, such as tmpfs) or FFKIT_STORAGE_DIRECT=0 turned it off.
var directOff atomic.Bool

func init() {
	if os.Getenv("FFKIT_STORAGE_DIRECT") == "0" {
		directOff.Store(true)
	}
}

// alignedBufs recycles the aligned buffers direct writes copy into (the
// payload arrives at an arbitrary place in a transport frame).
var alignedBufs sync.Pool

func alignedBuf(n int) *[]byte {
	if b, ok := alignedBufs.Get().(*[]byte); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	raw := make([]byte, n+DirectAlign)
	a := (DirectAlign - int(uintptr(unsafe.Pointer(&raw[0]))%DirectAlign)) % DirectAlign
	b := raw[a : a+n : a+n]
	return &b
}

func (OS) WriteDirect(name string, data []byte, off int64) (int, error) {
	n := len(data) &^ (DirectAlign - 1)
	if n == 0 || off%DirectAlign != 0 || directOff.Load() {
		return 0, nil
	}
	f, err := os.OpenFile(name, os.O_WRONLY|syscall.O_DIRECT, 0)
	if errors.Is(err, syscall.EINVAL) {
		directOff.Store(true)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := data[:n]
	if uintptr(unsafe.Pointer(&data[0]))%DirectAlign != 0 {
		b := alignedBuf(n)
		defer alignedBufs.Put(b)
		buf = *b
		copy(buf, data)
	}
	if _, err := f.WriteAt(buf, off); err != nil {
		return 0, fmt.Errorf("direct write: %w", err)
	}
	return n, nil
}

var _ DirectWriter = OS{}

// writeData writes data at off of the new chunk file f (named p): the
// aligned blocks directly where the VFS can (unless cache), the rest
// through f.
func (t *Target) writeData(f File, p string, data []byte, off int64, cache bool) error {
	done := 0
	if dw, ok := t.vfs.(DirectWriter); ok && !cache {
		n, err := dw.WriteDirect(p, data, off)
		if err != nil {
			return err
		}
		done = n
	}
	if done < len(data) {
		if _, err := f.WriteAt(data[done:], off+int64(done)); err != nil {
			return err
		}
	}
	return nil
}
