package storage

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ffkit/ffkit/fs/proto"
)

// apply runs one update through prepare+commit.
func apply(t *testing.T, tg *Target, id proto.ChunkID, u update) *version {
	t.Helper()
	c := tg.get(id)
	if !tg.tryAcquire(c) {
		t.Fatalf("chunk %v: write slot held", id)
	}
	defer tg.release(c)
	u.ver = c.commitVer() + 1
	if _, err := tg.prepare(id, c, u); err != nil {
		t.Fatal(err)
	}
	v, err := tg.commit(id, c)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestStoreModel(t *testing.T) {
	dir := t.TempDir()
	tg, err := OpenTarget(OS{}, 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	id := proto.ChunkID{Inode: 3, Index: 1}
	rng := rand.New(rand.NewPCG(7, 8))
	var model []byte
	for i := 0; i < 60; i++ {
		switch rng.IntN(5) {
		case 0:
			l := int64(rng.IntN(300 << 10))
			apply(t, tg, id, update{op: proto.OpTruncate, off: l})
			if int(l) <= len(model) {
				model = model[:l]
			} else {
				model = append(model, make([]byte, int(l)-len(model))...)
			}
		default:
			off := int64(rng.IntN(300 << 10))
			data := make([]byte, rng.IntN(200<<10)+1)
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			apply(t, tg, id, update{op: proto.OpWrite, off: off, data: data})
			if need := int(off) + len(data); need > len(model) {
				model = append(model, make([]byte, need-len(model))...)
			}
			copy(model[off:], data)
		}
		got, v, err := tg.readCommitted(id, 0, proto.MaxChunkSize, false)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("step %d: content differs (len %d vs %d)", i, len(got), len(model))
		}
		if want := blockCRCs(model); len(want) != len(v.crcs) || !equalU32(want, v.crcs) {
			t.Fatalf("step %d: block crcs differ from a fresh computation", i)
		}
		// A ranged read in the middle.
		if len(model) > 10 {
			lo := rng.IntN(len(model))
			n := rng.IntN(len(model)-lo) + 1
			got, _, err := tg.readCommitted(id, int64(lo), int64(n), false)
			if err != nil || !bytes.Equal(got, model[lo:lo+n]) {
				t.Fatalf("ranged read [%d,+%d): %v", lo, n, err)
			}
		}
	}
	// Reopen: the same state comes back; one file per chunk.
	tg2, err := OpenTarget(OS{}, 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := tg2.readCommitted(id, 0, proto.MaxChunkSize, false)
	if err != nil || !bytes.Equal(got, model) {
		t.Fatalf("after reopen: %v", err)
	}
	names, _ := os.ReadDir(filepath.Join(dir, "chunks"))
	if len(names) != 1 {
		t.Fatalf("%d files left", len(names))
	}
	// A pending version survives a reopen as pending; reads refuse it.
	c := tg2.get(id)
	if _, err := tg2.prepare(id, c, update{op: proto.OpWrite, off: 0, data: []byte("x"), ver: c.commitVer() + 1}); err != nil {
		t.Fatal(err)
	}
	tg3, _ := OpenTarget(OS{}, 1, dir)
	if _, _, err := tg3.readCommitted(id, 0, 1, false); !errors.Is(err, proto.ErrNotCommitted) {
		t.Fatalf("pending read: %v", err)
	}
	// Flip a bit in the committed file: the read fails with ErrChecksum.
	m := tg3.Meta(id)
	p := tg3.path(id, m.CommitVer, false)
	b, _ := os.ReadFile(p)
	b[HeaderSize+100] ^= 1
	os.WriteFile(p, b, 0o644)
	tg3.dropPending(id, tg3.get(id))
	if _, _, err := tg3.readCommitted(id, 0, 200, false); !errors.Is(err, proto.ErrChecksum) {
		t.Fatalf("bit flip not caught: %v", err)
	}
	if !tg3.Meta(id).Corrupt {
		t.Fatal("chunk not flagged corrupt")
	}
}

// FuzzDecodeHeader: no input makes the chunk header decoder panic, and a
// header it accepts re-encodes to the same bytes.
func FuzzDecodeHeader(f *testing.F) {
	f.Add(encodeHeader(&version{ver: 3, chainVer: 2, length: 5000, crcs: []uint32{1, 2}}))
	f.Add(encodeHeader(&version{ver: 1, removed: true}))
	f.Add([]byte("FFKCHNK1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeHeader(b)
		if err != nil {
			return
		}
		if enc := encodeHeader(v); !bytes.Equal(enc, b[:len(enc)]) {
			t.Fatalf("re-encoding differs")
		}
	})
}
