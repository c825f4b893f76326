package transport

import (
	"math/bits"
	"sync"
)

// Big buffers (frames of chunk data) are recycled by size class, so that
// streaming 4 MiB chunks does not allocate and zero 4 MiB per request.
const (
	minPooled  = 64 << 10
	numClasses = 12 // 64 KiB .. 128 MiB
)

var bufPools [numClasses]sync.Pool

func class(n int) int {
	if n <= minPooled {
		return 0
	}
	return bits.Len(uint(n-1)) - bits.Len(uint(minPooled-1))
}

// GetBuffer returns a buffer of length n, recycled when possible. Its
// contents are undefined.
func GetBuffer(n int) []byte {
	if n < minPooled {
		return make([]byte, n)
	}
	c := class(n)
	if c >= numClasses {
		return make([]byte, n)
	}
	if p, ok := bufPools[c].Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n, minPooled<<c)
}

// PutBuffer recycles a buffer from GetBuffer. The caller must not use it
// afterwards.
func PutBuffer(b []byte) {
	if cap(b) < minPooled {
		return
	}
	c := class(cap(b))
	if c >= numClasses || minPooled<<c != cap(b) {
		return
	}
	b = b[:0]
	bufPools[c].Put(&b)
}
