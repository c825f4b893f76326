package ffrecord

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/errkind"
)

// memFile is an in-memory fs.File: the bytes under test.
type memFile struct {
	*bytes.Reader
	size int64
}

func (m memFile) Size() int64  { return m.size }
func (m memFile) Name() string { return "fuzz.ffr" }
func (m memFile) Close() error { return nil }

func newMemFile(b []byte) memFile { return memFile{bytes.NewReader(b), int64(len(b))} }

// FuzzOpen opens arbitrary bytes as an FFRecord file and reads every
// sample. It must never panic, hang or allocate from an unchecked length;
// every failure is a classified error.
func FuzzOpen(f *testing.F) {
	for _, name := range []string{"small.ffr", "empty-and-odd.ffr", "multi/PART_00000.ffr", "multi/PART_00001.ffr"} {
		b, err := os.ReadFile(filepath.Join(goldenDir, name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		legacy := bytes.Clone(b)
		binary.LittleEndian.PutUint32(legacy, 0)
		f.Add(legacy)
		f.Add(b[:len(b)-3])
	}
	f.Add([]byte("hello"))
	f.Add(make([]byte, 12))
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx := context.Background()
		r, err := OpenFiles(ctx, []fs.File{newMemFile(data)}, ReadOptions{Warn: func(string) {}})
		if err != nil {
			if k := errkind.Of(err); k != errkind.Data {
				t.Fatalf("open: unclassified error %v (kind %v)", err, k)
			}
			return
		}
		defer r.Close()
		if HeaderLen(r.N()) > int64(len(data)) {
			t.Fatalf("opened n = %d from %d bytes", r.N(), len(data))
		}
		idx := make([]int64, 0, r.N()+1)
		for i := range r.N() {
			idx = append(idx, i)
			_, off, l, err := r.Locate(i)
			if err != nil || off < HeaderLen(r.N()) || l < 0 || off+l > int64(len(data)) {
				t.Fatalf("sample %d at [%d, +%d) in %d bytes: %v", i, off, l, len(data), err)
			}
		}
		if r.N() > 0 {
			idx = append(idx, 0) // a duplicate
		}
		got, err := r.ReadBatch(ctx, idx)
		if err != nil {
			if !errors.Is(err, ErrChecksum) {
				t.Fatalf("read: %v", err)
			}
			return
		}
		for k, i := range idx {
			_, off, l, _ := r.Locate(i)
			if !bytes.Equal(got[k], data[off:off+l]) {
				t.Fatalf("sample %d differs from the file's bytes", i)
			}
		}
	})
}

var _ fs.File = memFile{}
