package localfs_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/fstest"
	"github.com/ffkit/ffkit/fs/localfs"
)

func TestConformance(t *testing.T) {
	fstest.Run(t, localfs.New(), t.TempDir())
}

func TestDirectUnaligned(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3*localfs.Align+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	name := filepath.Join(dir, "d")
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := localfs.New().Open(context.Background(), name, fs.OpenOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range [][2]int{{0, 1}, {1, 4095}, {4095, 2}, {100, 3 * 4096}, {len(data) - 5, 5}, {0, len(data)}} {
		buf := make([]byte, c[1])
		if err := localfs.ReadFull(f, buf, int64(c[0])); err != nil {
			t.Fatalf("ReadFull(off %d, len %d): %v", c[0], c[1], err)
		}
		if !bytes.Equal(buf, data[c[0]:c[0]+c[1]]) {
			t.Fatalf("off %d len %d: wrong bytes", c[0], c[1])
		}
	}
	aligned := localfs.AlignedBuffer(4096)
	if !localfs.IsAligned(aligned) {
		t.Fatal("AlignedBuffer is not aligned")
	}
}

func TestResolve(t *testing.T) {
	f, p, err := fs.Resolve(context.Background(), "/tmp/x")
	if err != nil || f.String() != "local" || p != "/tmp/x" {
		t.Fatalf("Resolve(/tmp/x) = %v %q %v", f, p, err)
	}
	if _, _, err := fs.Resolve(context.Background(), "nosuch://h:1/x"); err == nil {
		t.Fatal("unknown scheme resolved")
	}
	s, a, path, err := fs.SplitURL("ffkit://h1:1,h2:2/data/x")
	if err != nil || s != "ffkit" || a != "h1:1,h2:2" || path != "/data/x" {
		t.Fatalf("SplitURL = %q %q %q %v", s, a, path, err)
	}
}
