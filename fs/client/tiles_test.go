package client

import (
	"testing"

	"github.com/ffkit/ffkit/fs/proto"
)

// TestTiles: the buffers of a merged span are filled in place when they
// follow each other at block boundaries (a whole file fetched in pieces),
// and through a scratch buffer otherwise.
func TestTiles(t *testing.T) {
	const bs = proto.BlockSize
	read := func(off int64, n int) ChunkRead { return ChunkRead{Off: off, Buf: make([]byte, n)} }
	for _, tc := range []struct {
		name   string
		reads  []ChunkRead
		n      int64 // bytes the target holds from the span's start
		pieces []int // lengths of the pieces, nil: not in place
	}{
		{"one", []ChunkRead{read(0, 3*bs)}, 3 * bs, []int{3 * bs}},
		{"contiguous", []ChunkRead{read(0, 2*bs), read(2*bs, 2*bs), read(4*bs, 100)}, 4*bs + 100, []int{2 * bs, 2 * bs, 100}},
		{"short chunk", []ChunkRead{read(0, 2*bs), read(2*bs, 2*bs)}, 3 * bs, []int{2 * bs, bs}},
		{"short chunk, last piece empty", []ChunkRead{read(0, 2*bs), read(2*bs, 2*bs)}, 2 * bs, []int{2 * bs}},
		{"gap", []ChunkRead{read(0, bs), read(2*bs, bs)}, 3 * bs, nil},
		{"overlap", []ChunkRead{read(0, 2*bs), read(bs, 2*bs)}, 3 * bs, nil},
		{"inside another", []ChunkRead{read(0, 3*bs), read(bs, bs)}, 3 * bs, nil},
		{"inside another, short chunk", []ChunkRead{read(0, 3*bs), read(bs, bs)}, 2 * bs, nil},
		{"inside a block", []ChunkRead{read(0, 100), read(100, bs)}, bs + 100, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := &span{off: tc.reads[0].Off}
			for i := range tc.reads {
				sp.members = append(sp.members, i)
			}
			got := tiles(tc.reads, sp, tc.n)
			if (got == nil) != (tc.pieces == nil) || len(got) != len(tc.pieces) {
				t.Fatalf("tiles: %d pieces, want %v", len(got), tc.pieces)
			}
			for i, p := range got {
				if len(p) != tc.pieces[i] || &p[0] != &tc.reads[i].Buf[0] {
					t.Errorf("piece %d: %d bytes (in place: %v), want %d in reads[%d]", i, len(p), &p[0] == &tc.reads[i].Buf[0], tc.pieces[i], i)
				}
			}
		})
	}
}
