package sparsesample

import (
	"os"
	"path/filepath"
	"testing"
)

// A written sample checks equal; one changed byte, anywhere (here at a
// window's edge, inside no mark and inside one), is found.
func TestWriteCheck(t *testing.T) {
	const size = 20<<20 + 1
	p := filepath.Join(t.TempDir(), "s")
	if err := Write(p, size); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Check(f, 0, size); err != nil {
		t.Fatal(err)
	}
	for _, at := range []int64{8 << 20, 3, size / 2, size - 1} {
		b := []byte{0}
		f.ReadAt(b, at)
		f.WriteAt([]byte{b[0] ^ 1}, at)
		if Check(f, 0, size) == nil {
			t.Fatalf("a changed byte at %d was not found", at)
		}
		f.WriteAt(b, at)
	}
}
