package client

import (
	"bytes"
	"context"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs/proto"
)

// localFixture writes one chunk of 3 MiB + 1000 bytes (a short last block)
// and returns it.
func localFixture(t *testing.T, cl *Client) (ChainID, ChunkID, []byte) {
	t.Helper()
	chain := cl.Chains()[0]
	id := ChunkID{Inode: 7, Index: 0}
	data := make([]byte, 3<<20+1000)
	for i := range data {
		data[i] = byte(i*31 + i>>11)
	}
	if err := cl.WriteChunk(context.Background(), chain, id, 0, data); err != nil {
		t.Fatal(err)
	}
	return chain, id, data
}

// checkReads reads [off, off+n) of each range given as pairs, in one
// batch, and checks every byte against want (zeros past its end). A range
// with a third element 1 is read into a buffer that is not 4 KiB aligned.
func checkReads(t *testing.T, cl *Client, chain ChainID, id ChunkID, want []byte, ranges ...[3]int) {
	t.Helper()
	var rd []ChunkRead
	for _, r := range ranges {
		buf := make([]byte, r[1]+r[2])[r[2]:]
		rd = append(rd, ChunkRead{Chain: chain, Chunk: id, Off: int64(r[0]), Buf: buf})
	}
	if err := cl.ReadChunks(context.Background(), rd); err != nil {
		t.Fatal(err)
	}
	for i, r := range ranges {
		end := min(r[0]+r[1], len(want))
		if rd[i].N != end-r[0] || !bytes.Equal(rd[i].Buf[:rd[i].N], want[r[0]:end]) {
			t.Fatalf("range [%d,+%d): got %d bytes, not the stored ones", r[0], r[1], rd[i].N)
		}
		for _, b := range rd[i].Buf[rd[i].N:] {
			if b != 0 {
				t.Fatalf("range [%d,+%d): bytes past the chunk's end not zeroed", r[0], r[1])
			}
		}
	}
}

// A large read from a storage service on this host is a short-circuit
// read of the chunk file: the bytes are right (a whole chunk with a short
// last block, past its end, and merged neighbouring ranges scattered to
// their buffers), and the client counts them as local. With
// NoLocalReads, the same reads come over the connection.
func TestLocalReads(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	for _, noLocal := range []bool{false, true} {
		cl, err := Dial(ctx, []string{c.m.Addr()}, Options{Token: "tok", NoLocalReads: noLocal})
		if err != nil {
			t.Fatal(err)
		}
		chain, id, data := localFixture(t, cl)
		before := cl.ReadStats()
		checkReads(t, cl, chain, id, data, [3]int{0, len(data) + 5000})
		checkReads(t, cl, chain, id, data, [3]int{1 << 20, 256 << 10}, [3]int{1<<20 + 256<<10 + 4096, 300 << 10}, [3]int{3 << 20, 64 << 10})
		checkReads(t, cl, chain, id, data, [3]int{4096, 4096}) // small: over the connection
		d := cl.ReadStats().Sub(before)
		want := int64(len(data)) + (256<<10 + 4096 + 300<<10) + 1000
		if noLocal {
			want = 0
		}
		if d.LocalBytes != want || d.Requests != 4 {
			t.Errorf("NoLocalReads=%v: %d bytes read locally in %d requests, want %d in 4 (the ranges at 1 MiB merged)", noLocal, d.LocalBytes, d.Requests, want)
		}
		cl.Close()
	}
}

// A chunk rewritten between the target's answer and the client's open
// (the answered file is gone: a new version is a new file) is read again
// over the connection, and the read returns the new bytes, never a mix.
func TestLocalReadOfReplacedChunk(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl, err := Dial(ctx, []string{c.m.Addr()}, Options{Token: "tok", RetryTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	chain, id, data := localFixture(t, cl)
	newer := bytes.Repeat([]byte{0xa5}, len(data))
	rewrites := 0
	testHookLocalRead = func(*proto.ReadResult) {
		if rewrites == 0 {
			rewrites++
			if err := cl.WriteChunk(ctx, chain, id, 0, newer); err != nil {
				t.Error(err)
			}
		}
	}
	defer func() { testHookLocalRead = nil }()
	before := cl.ReadStats()
	checkReads(t, cl, chain, id, newer, [3]int{0, len(data)})
	if rewrites != 1 {
		t.Fatalf("the hook ran %d times", rewrites)
	}
	// The retry may read locally again (the new file) or over the connection.
	if d := cl.ReadStats().Sub(before); d.Requests < 2 {
		t.Errorf("%d requests: the replaced chunk was not read again", d.Requests)
	}
}

// forChunkFiles runs fn on every chunk file under dir.
func forChunkFiles(t *testing.T, dir string, fn func(f *os.File) error) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Base(filepath.Dir(p)) != "chunks" {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n++
		return fn(f)
	})
	if err != nil || n == 0 {
		t.Fatalf("%d chunk files: %v", n, err)
	}
}

// dropCache evicts every chunk file under dir from the page cache (the
// files are synced: their pages are clean).
func dropCache(t *testing.T, dir string) {
	forChunkFiles(t, dir, func(f *os.File) error { return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED) })
}

// Bytes out of the page cache are read with O_DIRECT (the target says
// they are cold): into aligned buffers directly, through a bounce buffer
// into unaligned ones and for the chunk's short last block.
func TestLocalReadsCold(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl, err := Dial(ctx, []string{c.m.Addr()}, Options{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	chain, id, data := localFixture(t, cl)
	var cold, warm int
	testHookLocalRead = func(res *proto.ReadResult) {
		if res.Cold {
			cold++
		} else {
			warm++
		}
	}
	defer func() { testHookLocalRead = nil }()
	for _, unaligned := range []int{0, 1} {
		dropCache(t, c.dir)
		cold, warm = 0, 0
		before := cl.ReadStats()
		checkReads(t, cl, chain, id, data, [3]int{0, len(data) + 5000, unaligned})
		checkReads(t, cl, chain, id, data, [3]int{1 << 20, 256 << 10, unaligned}, [3]int{1<<20 + 256<<10 + 4096, 300 << 10, unaligned})
		// Two requests: none read again because its bytes failed their CRCs.
		if d := cl.ReadStats().Sub(before); d.LocalBytes != int64(len(data))+256<<10+4096+300<<10 || d.Requests != 2 {
			t.Errorf("%d bytes read locally in %d requests", d.LocalBytes, d.Requests)
		}
		if cold != 2 || warm != 0 {
			t.Errorf("unaligned=%d: %d cold and %d warm local reads, want 2 cold", unaligned, cold, warm)
		}
	}
	// Bytes in the page cache are read through it.
	forChunkFiles(t, c.dir, func(f *os.File) error {
		_, err := io.Copy(io.Discard, f)
		return err
	})
	cold, warm = 0, 0
	checkReads(t, cl, chain, id, data, [3]int{0, 1 << 20, 0})
	if cold != 0 || warm != 1 {
		t.Errorf("cached chunk: %d cold and %d warm local reads, want 1 warm", cold, warm)
	}
}
