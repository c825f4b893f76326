package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/internal/sparsesample"
)

// Samples of 1 GiB and 4 GiB + 1 pack onto the cluster with the CLI,
// verify there, and come back with their bytes (the cluster counterpart of
// pack's TestHugeSamples). FFKIT_TEST_HUGE=1; needs about 25 GiB of disk
// under $TMPDIR (the cluster keeps replicas) and several minutes.
func TestCLIPackHugeSamplesCluster(t *testing.T) {
	if os.Getenv("FFKIT_TEST_HUGE") != "1" {
		t.Skip("set FFKIT_TEST_HUGE=1 to pack 1 GiB and 4 GiB + 1 samples onto a cluster")
	}
	u := startUp(t, t.TempDir())
	for _, size := range []int64{1 << 30, 4<<30 + 1} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "src")
			os.MkdirAll(src, 0o755)
			os.WriteFile(filepath.Join(src, "a-small"), []byte("before"), 0o644)
			os.WriteFile(filepath.Join(src, "c-small"), []byte("after"), 0o644)
			if err := sparsesample.Write(filepath.Join(src, "b-huge"), size); err != nil {
				t.Fatal(err)
			}
			ds := fmt.Sprintf("%s/huge-%d", u.url, size)
			u.must(t, "pack", src, "-o", ds, "--shard-size", "64M")
			u.must(t, "verify", ds)
			back := filepath.Join(dir, "back")
			u.must(t, "fs", "get", ds, back)
			os.RemoveAll(src)
			u.must(t, "fs", "rm", "-r", ds)
			samples, err := openSamples(back)
			if err != nil {
				t.Fatal(err)
			}
			if len(samples) != 3 || samples[1].length != size {
				t.Fatalf("%d samples back, want 3 with the second of %d bytes", len(samples), size)
			}
			if !bytes.Equal(readSample(t, samples[0]), []byte("before")) || !bytes.Equal(readSample(t, samples[2]), []byte("after")) {
				t.Fatal("the small samples around the huge one differ")
			}
			h := samples[1]
			of, err := os.Open(h.path)
			if err != nil {
				t.Fatal(err)
			}
			defer of.Close()
			if err := sparsesample.Check(of, h.off, size); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// sampleAt is where a sample's bytes lie in a local dataset.
type sampleAt struct {
	path        string
	off, length int64
}

// openSamples locates every sample of the local dataset p.
func openSamples(p string) ([]sampleAt, error) {
	ctx := context.Background()
	r, err := ffrecord.Open(ctx, []string{p}, ffrecord.ReadOptions{})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out []sampleAt
	for i := range r.N() {
		file, off, length, err := r.Locate(int64(i))
		if err != nil {
			return nil, err
		}
		out = append(out, sampleAt{r.Files()[file].Path, off, length})
	}
	return out, nil
}

// readSample reads a small sample's bytes.
func readSample(t *testing.T, s sampleAt) []byte {
	t.Helper()
	f, err := os.Open(s.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, s.length)
	if _, err := f.ReadAt(b, s.off); err != nil {
		t.Fatal(err)
	}
	return b
}
