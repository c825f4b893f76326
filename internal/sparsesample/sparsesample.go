// Package sparsesample makes a sparse file of any size with a few marked
// bytes (at its start, middle and end), and checks a copy of one window by
// window, so that tests of huge samples need the bytes neither in memory
// nor on disk.
package sparsesample

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// Marks are the marked bytes of a sample of size bytes (at least 6), by
// offset; every other byte is zero.
func Marks(size int64) map[int64][]byte {
	return map[int64][]byte{0: []byte("start"), size / 2: []byte("middle"), size - 3: []byte("end")}
}

// Write creates path as a sparse file of size bytes with Marks(size).
func Write(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	for off, m := range Marks(size) {
		if _, err := f.WriteAt(m, off); err != nil {
			f.Close()
			return fmt.Errorf("sparsesample: %s: %w", path, err)
		}
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("sparsesample: %s: %w", path, err)
	}
	return f.Close()
}

// Check compares the size bytes of r at off with a sample written by
// Write; the error names the first window that differs.
func Check(r io.ReaderAt, off, size int64) error {
	marks := Marks(size)
	buf := make([]byte, 8<<20)
	for pos := int64(0); pos < size; pos += int64(len(buf)) {
		n := min(int64(len(buf)), size-pos)
		if _, err := io.ReadFull(io.NewSectionReader(r, off+pos, n), buf[:n]); err != nil {
			return fmt.Errorf("sparsesample: bytes [%d, %d): %w", pos, pos+n, err)
		}
		want := make([]byte, n)
		for moff, m := range marks { // a mark may straddle windows
			for j := range int64(len(m)) {
				if at := moff + j; at >= pos && at < pos+n {
					want[at-pos] = m[j]
				}
			}
		}
		if !bytes.Equal(buf[:n], want) {
			return fmt.Errorf("sparsesample: bytes [%d, %d) of the %d-byte sample differ", pos, pos+n, size)
		}
	}
	return nil
}
