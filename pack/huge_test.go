package pack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/internal/sparsesample"
)

// vmHWM is this process's peak resident set size in bytes.
func vmHWM(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmHWM")
	return 0
}

// Samples of 1 GiB and 4 GiB + 1 pack from a directory, to shards and to
// one .ffr file, with the peak RSS bounded by the staging window, not the
// sample; the packed bytes equal the source's. FFKIT_TEST_HUGE=1 (needs
// about 11 GiB of disk under $TMPDIR; the sources are sparse).
func TestHugeSamples(t *testing.T) {
	if os.Getenv("FFKIT_TEST_HUGE") != "1" {
		t.Skip("set FFKIT_TEST_HUGE=1 to pack 1 GiB and 4 GiB + 1 samples")
	}
	ctx := context.Background()
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
			for _, target := range []string{"ds", "one.ffr"} {
				s, err := Open(ctx, src, Options{})
				if err != nil {
					t.Fatal(err)
				}
				out := filepath.Join(dir, target)
				if _, err := Pack(ctx, s, out, Config{ShardSize: 64 << 20, Align: AlignAuto}); err != nil {
					t.Fatal(err)
				}
				s.Close()
				r, err := ffrecord.Open(ctx, []string{out}, ffrecord.ReadOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if r.N() != 3 {
					t.Fatalf("%d samples", r.N())
				}
				file, off, length, err := r.Locate(1)
				if err != nil || length != size {
					t.Fatalf("huge sample: %d bytes, %v", length, err)
				}
				path := r.Files()[file].Path
				r.Close()
				of, err := os.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				if err := sparsesample.Check(of, off, size); err != nil {
					t.Fatalf("%s: %v", target, err)
				}
				of.Close()
				os.RemoveAll(out)
				os.Remove(out + ".index.jsonl")
			}
			if hwm := vmHWM(t); hwm > 512<<20 {
				t.Fatalf("peak RSS %d MiB packing a %d-byte sample", hwm>>20, size)
			}
		})
	}
}
