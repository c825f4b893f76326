package loader

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// writeFFR writes an FFRecord v1 file (the layout in ffrecord/doc.go).
func writeFFR(t testing.TB, path string, samples [][]byte) {
	t.Helper()
	n := len(samples)
	hdr := make([]byte, 12+12*n)
	binary.LittleEndian.PutUint64(hdr[4:], uint64(n))
	off := int64(len(hdr))
	for i, s := range samples {
		binary.LittleEndian.PutUint32(hdr[12+4*i:], crc32.ChecksumIEEE(s))
		binary.LittleEndian.PutUint64(hdr[12+4*n+8*i:], uint64(off))
		off += int64(len(s))
	}
	binary.LittleEndian.PutUint32(hdr[0:], crc32.ChecksumIEEE(hdr[4:]))
	var buf bytes.Buffer
	buf.Write(hdr)
	for _, s := range samples {
		buf.Write(s)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sampleBytes is the content of global sample i of a test dataset: its
// index in text, then filler whose length varies with i.
func sampleBytes(tag string, i int64) []byte {
	head := fmt.Sprintf("%s-%06d|", tag, i)
	fill := int((i*7919)%97) + 1
	return append([]byte(head), bytes.Repeat([]byte{byte(i)}, fill)...)
}

// makeDataset writes n samples into nfiles files under dir (a directory
// dataset) and returns dir.
func makeDataset(t testing.TB, dir, tag string, n int64, nfiles int) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	per := (n + int64(nfiles) - 1) / int64(nfiles)
	var i int64
	for f := 0; f < nfiles; f++ {
		var ss [][]byte
		for ; i < n && i < int64(f+1)*per; i++ {
			ss = append(ss, sampleBytes(tag, i))
		}
		writeFFR(t, filepath.Join(dir, fmt.Sprintf("PART_%05d.ffr", f)), ss)
	}
	return dir
}

// got is a batch copied out of the loader.
type got struct {
	Epoch, Step int64
	Indices     []int64
	Sources     []int
	Seeds       []uint64
	Data        []string
	Outputs     []any
	Padded      int
}

func snapshot(b *Batch) got {
	g := got{Epoch: b.Epoch, Step: b.Step, Indices: append([]int64(nil), b.Indices...), Seeds: append([]uint64(nil), b.Seeds...),
		Padded: b.Padded, Outputs: append([]any(nil), b.Outputs...)}
	if b.Sources != nil {
		g.Sources = append([]int(nil), b.Sources...)
	}
	for _, s := range b.Samples {
		g.Data = append(g.Data, string(s))
	}
	return g
}

func mustOpen(t testing.TB, paths []string, o Options) *Loader {
	t.Helper()
	l, err := Open(context.Background(), paths, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// drain takes up to max batches (max < 0: all) and returns them.
func drain(t testing.TB, l *Loader, max int) []got {
	t.Helper()
	var out []got
	for max < 0 || len(out) < max {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Next after %d batches: %v", len(out), err)
		}
		out = append(out, snapshot(b))
		b.Release()
	}
	return out
}

// checkContent verifies that every sample's bytes are those of its index.
func checkContent(t testing.TB, tags []string, bs []got) {
	t.Helper()
	for _, b := range bs {
		for i, idx := range b.Indices {
			src := 0
			if b.Sources != nil {
				src = b.Sources[i]
			}
			if want := string(sampleBytes(tags[src], idx)); b.Data[i] != want {
				t.Fatalf("epoch %d batch %d position %d: sample %d of %s has the wrong bytes", b.Epoch, b.Step, i, idx, tags[src])
			}
		}
	}
}

// waitGoroutines waits until the goroutine count falls to at most base,
// and fails with a dump otherwise.
func waitGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines, %d before: leaked\n%s", n, base, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// openFDs counts this process's open descriptors on files under dir (the
// file system's own descriptors, such as pooled io_uring rings, are not
// the loader's to close).
func openFDs(t testing.TB, dir string) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(target, dir) {
			n++
		}
	}
	return n
}

func errorContains(err error, parts ...string) error {
	if err == nil {
		return errors.New("no error")
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			return fmt.Errorf("error %q does not mention %q", err, p)
		}
	}
	return nil
}
