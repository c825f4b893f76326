package client

import (
	"bytes"
	"context"
	iofs "io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/storage"
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
	checkReadsDirect(t, cl, chain, id, want, false, ranges...)
}

// checkReadsDirect is checkReads with ChunkRead.Direct set to direct.
func checkReadsDirect(t *testing.T, cl *Client, chain ChainID, id ChunkID, want []byte, direct bool, ranges ...[3]int) {
	t.Helper()
	var rd []ChunkRead
	for _, r := range ranges {
		buf := make([]byte, r[1]+r[2])[r[2]:]
		rd = append(rd, ChunkRead{Chain: chain, Chunk: id, Off: int64(r[0]), Buf: buf, Direct: direct})
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
	var requests []int64
	for _, noLocal := range []bool{false, true} {
		cl := c.dial(t, Options{NoLocalReads: noLocal})
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
		if d.LocalBytes != want {
			t.Errorf("NoLocalReads=%v: %d bytes read locally, want %d", noLocal, d.LocalBytes, want)
		}
		requests = append(requests, d.Requests)
	}
	// Local reads take no request more: none is read again.
	if requests[0] != requests[1] {
		t.Errorf("%d requests with local reads, %d without", requests[0], requests[1])
	}
}

// A chunk rewritten between the target's answer and the client's open
// (the answered file is gone: a new version is a new file) is read again
// over the connection, and the read returns the new bytes, never a mix.
func TestLocalReadOfReplacedChunk(t *testing.T) {
	c := startInproc(t)
	ctx := context.Background()
	cl := c.dial(t, Options{RetryTimeout: 20 * time.Second})
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

// cachedShare returns the part of a file's pages in the page cache.
func cachedShare(t *testing.T, path string) float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return float64(n) / float64(len(vec))
}

// Bytes out of the page cache (the target says they are cold) are read
// with O_DIRECT when the caller asks (ChunkRead.Direct): into aligned
// buffers directly, through a bounce buffer into unaligned ones and for
// the chunk's short last block, and the page cache stays cold. Without
// Direct they are read through the page cache, which keeps them.
func TestLocalReadsCold(t *testing.T) {
	c := startInproc(t)
	cl := c.dial(t, Options{})
	chain, id, data := localFixture(t, cl)
	var cold, warm int
	var paths []string
	testHookLocalRead = func(res *proto.ReadResult) {
		if res.Cold {
			cold++
		} else {
			warm++
		}
		paths = append(paths, res.Path)
	}
	defer func() { testHookLocalRead = nil }()
	for _, direct := range []bool{true, false} {
		for _, unaligned := range []int{0, 1} {
			dropCache(t, c.dir)
			cold, warm, paths = 0, 0, nil
			before := cl.ReadStats()
			checkReadsDirect(t, cl, chain, id, data, direct, [3]int{0, len(data) + 5000, unaligned})
			if cold != 1 || warm != 0 {
				t.Fatalf("direct=%v unaligned=%d: %d cold and %d warm local reads of an uncached chunk", direct, unaligned, cold, warm)
			}
			if share := cachedShare(t, paths[0]); direct && share > 0.1 || !direct && share < 0.9 {
				t.Errorf("direct=%v: %.0f%% of the chunk file cached after reading it", direct, 100*share)
			}
			checkReadsDirect(t, cl, chain, id, data, direct, [3]int{1 << 20, 256 << 10, unaligned}, [3]int{1<<20 + 256<<10 + 4096, 300 << 10, unaligned})
			// Two requests: none read again because its bytes failed their CRCs.
			if d := cl.ReadStats().Sub(before); d.LocalBytes != int64(len(data))+256<<10+4096+300<<10 || d.Requests != 2 {
				t.Errorf("direct=%v unaligned=%d: %d bytes read locally in %d requests", direct, unaligned, d.LocalBytes, d.Requests)
			}
		}
	}
}

// A path that is a symlink (even to the right file), a FIFO or a
// directory is not read (and a FIFO does not block the open): the range
// comes over the connection, right.
func TestLocalReadRefusesOddFiles(t *testing.T) {
	c := startInproc(t)
	cl := c.dial(t, Options{})
	chain, id, data := localFixture(t, cl)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	for _, odd := range []string{link, fifo, dir} {
		testHookLocalRead = func(res *proto.ReadResult) {
			if odd == link {
				os.Symlink(res.Path, link)
			}
			res.Path = odd
		}
		before := cl.ReadStats()
		checkReads(t, cl, chain, id, data, [3]int{0, 1 << 20, 0})
		if d := cl.ReadStats().Sub(before); d.LocalBytes != 0 {
			t.Errorf("%s: %d bytes read locally", odd, d.LocalBytes)
		}
	}
	testHookLocalRead = nil
}

// When only one storage service is on this host (here the others refuse
// local reads, as services on other hosts would), large reads go to its
// replicas once it has answered one: after the first read every byte of
// the large reads is read locally; small reads still spread by chunk.
func TestLocalReadsPreferThisHost(t *testing.T) {
	c := startInprocWith(t, func(node int, cfg *storage.Config) { cfg.NoLocalReads = node != 1 })
	cl := c.dial(t, Options{})
	chain := cl.Chains()[0]
	data := make([]byte, 1<<20)
	var ids []ChunkID
	for i := range 16 {
		id := ChunkID{Inode: 5, Index: uint64(i)}
		if err := cl.WriteChunk(context.Background(), chain, id, 0, data); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Until a read lands on node 1 by its chunk's hash, no node is known
	// to be here.
	for _, id := range ids {
		checkReads(t, cl, chain, id, data, [3]int{0, 1 << 20, 0})
	}
	before := cl.ReadStats()
	for _, id := range ids {
		checkReads(t, cl, chain, id, data, [3]int{0, 1 << 20, 0})
	}
	if d := cl.ReadStats().Sub(before); d.LocalBytes != d.Bytes || d.Bytes != 16<<20 {
		t.Errorf("%d of %d bytes read locally", d.LocalBytes, d.Bytes)
	}
}
