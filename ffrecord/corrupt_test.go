package ffrecord

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Every corruption class gives a precise error of kind Data, never a panic.

func damaged(t *testing.T, name string, edit func([]byte) []byte) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(p, edit(b), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustFail(t *testing.T, err error, target error, substr ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", target)
	}
	if !errors.Is(err, target) || errkind.Of(err) != errkind.Data {
		t.Fatalf("error %q (kind %v), want %v", err, errkind.Of(err), target)
	}
	for _, s := range substr {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not mention %q", err, s)
		}
	}
}

func openPath(p string) (*Reader, error) {
	return Open(context.Background(), []string{p}, ReadOptions{Warn: func(string) {}})
}

func TestFlippedHeaderByte(t *testing.T) {
	// small.ffr's header is 132 bytes; every single-bit flip in it must
	// fail at open.
	for off := range 132 {
		for _, bit := range []byte{0x01, 0x80} {
			p := damaged(t, "small.ffr", func(b []byte) []byte { b[off] ^= bit; return b })
			r, err := openPath(p)
			if err == nil {
				r.Close()
				t.Fatalf("header byte %d bit %#x flipped: opened", off, bit)
			}
			if errkind.Of(err) != errkind.Data || !strings.Contains(err.Error(), p) {
				t.Fatalf("header byte %d: %v", off, err)
			}
		}
	}
	// A flipped CRC-array byte is reported as the header checksum.
	p := damaged(t, "small.ffr", func(b []byte) []byte { b[20] ^= 1; return b })
	_, err := openPath(p)
	mustFail(t, err, ErrChecksum, "header checksum mismatch", "[4, 132)")
}

func TestFlippedSampleByte(t *testing.T) {
	ctx := context.Background()
	// sample 4 of small.ffr spans [212, 252)
	p := damaged(t, "small.ffr", func(b []byte) []byte { b[230] ^= 0x10; return b })
	r, err := openPath(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = r.ReadBatch(ctx, []int64{1, 4, 7})
	mustFail(t, err, ErrChecksum, "sample 4", "[212, 252)", p)
	var se *SampleError
	if !errors.As(err, &se) || se.Index != 4 || se.Local != 4 || se.Off != 212 || se.Len != 40 || se.Path != p {
		t.Fatalf("sample error %+v", se)
	}
	if _, err := r.ReadBatch(ctx, []int64{0, 3, 5, 9}); err != nil {
		t.Fatalf("good samples: %v", err)
	}
	rn, _ := Open(ctx, []string{p}, ReadOptions{NoVerify: true})
	if s, err := rn.ReadOne(ctx, 4); err != nil || len(s) != 40 {
		t.Fatalf("NoVerify: %v", err)
	}
	rn.Close()
	rep, err := Verify(ctx, []string{p}, VerifyOptions{})
	if err != nil || rep.OK || len(rep.Faults) != 1 || rep.Faults[0].Local != 4 || rep.Faults[0].Kind != FaultChecksum || rep.Checked != 9 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

func TestTruncatedInsideSample(t *testing.T) {
	ctx := context.Background()
	// cut inside sample 6 [300, 356)
	p := damaged(t, "small.ffr", func(b []byte) []byte { return b[:320] })
	_, err := openPath(p)
	mustFail(t, err, ErrTruncated, "sample 6", "[300, 356)", "320 bytes")
	var se *SampleError
	if !errors.As(err, &se) || se.Local != 6 {
		t.Fatalf("%+v", se)
	}
	// cut exactly at the start of sample 6: sample 6 is the first missing
	p = damaged(t, "small.ffr", func(b []byte) []byte { return b[:300] })
	_, err = openPath(p)
	mustFail(t, err, ErrTruncated, "sample 6")
	rep, err := Verify(ctx, []string{p}, VerifyOptions{})
	if err != nil || rep.OK || rep.Checked != 6 || len(rep.Faults) != 1 || rep.Faults[0].Kind != FaultTruncated || rep.Faults[0].Local != 6 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	// In a directory, the global index is named.
	rep, err = Verify(ctx, []string{filepath.Join(goldenDir, "small.ffr"), p}, VerifyOptions{})
	if err != nil || rep.Faults[0].Index != 16 {
		t.Fatalf("verify two files: %+v %v", rep, err)
	}
	// cut inside the header
	p = damaged(t, "small.ffr", func(b []byte) []byte { return b[:100] })
	_, err = openPath(p)
	mustFail(t, err, ErrTruncated, "cut inside the header")
}

func TestTruncatedInsideLastSample(t *testing.T) {
	ctx := context.Background()
	// the last sample [492, 572): the format cannot tell, so its checksum fails
	p := damaged(t, "small.ffr", func(b []byte) []byte { return b[:530] })
	r, err := openPath(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = r.ReadOne(ctx, 9)
	mustFail(t, err, ErrChecksum, "sample 9", "last sample")
	rep, _ := Verify(ctx, []string{p}, VerifyOptions{})
	if rep.OK || len(rep.Faults) != 1 || rep.Faults[0].Local != 9 || rep.Checked != 9 {
		t.Fatalf("verify: %+v", rep)
	}
}

func TestGarbageFiles(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	dir := t.TempDir()
	for _, size := range []int{0, 1, 5, 11, 12, 13, 24, 100, 4096, 1 << 20} {
		for k := range 5 {
			b := make([]byte, size)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			p := filepath.Join(dir, "garbage.ffr")
			os.WriteFile(p, b, 0o644)
			r, err := openPath(p)
			if err == nil {
				// possible only if the bytes happen to form a valid header
				r.Close()
				t.Fatalf("garbage of %d bytes (try %d) opened", size, k)
			}
			if errkind.Of(err) != errkind.Data || !strings.Contains(err.Error(), p) {
				t.Fatalf("garbage %d bytes: %v", size, err)
			}
			rep, err := Verify(ctx, []string{p}, VerifyOptions{})
			if err != nil || rep.OK || len(rep.Faults) == 0 {
				t.Fatalf("verify garbage: %+v %v", rep, err)
			}
		}
	}
	// The reference opens a 5-byte garbage file as ~4e8 samples.
	p := filepath.Join(dir, "five.ffr")
	os.WriteFile(p, []byte("hello"), 0o644)
	_, err := openPath(p)
	mustFail(t, err, ErrCorrupt, "5 bytes")
}

func TestAbsurdN(t *testing.T) {
	for _, n := range []int64{1 << 62, 1<<63 - 1, -1, 11, 1000} {
		p := damaged(t, "small.ffr", func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[4:12], uint64(n))
			return b
		})
		_, err := openPath(p)
		if n > 11 || n < 0 {
			mustFail(t, err, ErrCorrupt, "n = ")
		} else {
			// plausible n: the header checksum catches it
			mustFail(t, err, ErrChecksum)
		}
	}
	// An absurd n with a zero (legacy) header checksum: structure checks still catch it.
	p := damaged(t, "small.ffr", func(b []byte) []byte {
		binary.LittleEndian.PutUint32(b[0:4], 0)
		binary.LittleEndian.PutUint64(b[4:12], 1<<40)
		return b
	})
	_, err := openPath(p)
	mustFail(t, err, ErrCorrupt, "impossible")
}

func TestLegacyCorruptOffsets(t *testing.T) {
	// Without a header checksum, offsets that go backwards are caught.
	p := damaged(t, "small.ffr", func(b []byte) []byte {
		binary.LittleEndian.PutUint32(b[0:4], 0)
		binary.LittleEndian.PutUint64(b[52+8*5:], 100) // offset of sample 5
		return b
	})
	_, err := openPath(p)
	mustFail(t, err, ErrCorrupt, "sample 5", "backwards")
}

// StoredCRC gives what Checksum of a sample's bytes must be (bench read's
// pread baseline checks samples with it), and a flipped byte shows.
func TestStoredCRC(t *testing.T) {
	ctx := context.Background()
	p := damaged(t, "small.ffr", func(b []byte) []byte { b[230] ^= 0x10; return b }) // sample 4
	r, err := Open(ctx, []string{p}, ReadOptions{NoVerify: true, Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range r.N() {
		b, err := r.ReadOne(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		want, err := r.StoredCRC(i)
		if err != nil {
			t.Fatal(err)
		}
		if got := Checksum(b); (got == want) != (i != 4) {
			t.Fatalf("sample %d: stored %08x, computed %08x", i, want, got)
		}
	}
	if _, err := r.StoredCRC(r.N()); err == nil {
		t.Fatal("StoredCRC past the end: no error")
	}
}
