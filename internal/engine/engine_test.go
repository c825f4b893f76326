package engine

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/ffrecord"
)

// socketPair returns two connected Unix stream sockets.
func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// client sends a request and reads the reply, as the Python side does.
func call(t *testing.T, c *net.UnixConn, hdr map[string]any, body []byte) (map[string]any, []byte, []int) {
	t.Helper()
	h, _ := json.Marshal(hdr)
	msg := make([]byte, 8, 8+len(h)+len(body))
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(h)))
	binary.LittleEndian.PutUint32(msg[4:], uint32(len(body)))
	msg = append(append(msg, h...), body...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	f, err := readFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	var rh map[string]any
	if err := json.Unmarshal(f.header, &rh); err != nil {
		t.Fatal(err)
	}
	return rh, f.body, f.fds
}

func writeDataset(t *testing.T, samples [][]byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "d.ffr")
	w, err := ffrecord.Create(context.Background(), p, int64(len(samples)))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if err := w.WriteOne(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServeReadsIntoSharedMemory(t *testing.T) {
	samples := [][]byte{[]byte("zero"), {}, []byte("two!!"), []byte(strings.Repeat("3", 5000))}
	path := writeDataset(t, samples)
	server, client := socketPair(t)
	defer client.Close()
	done := make(chan error, 1)
	go func() { done <- NewServer().Serve(context.Background(), server) }()

	h, _, _ := call(t, client, map[string]any{"op": "hello"}, nil)
	if h["version"] != float64(Version) {
		t.Fatalf("hello: %v", h)
	}
	h, _, _ = call(t, client, map[string]any{"op": "ffr_open", "paths": []string{path}, "check_data": true}, nil)
	if h["n"] != float64(4) {
		t.Fatalf("open: %v", h)
	}
	handle := h["handle"]
	idx := putInt64s([]int64{3, 0, 1, 2, 0})
	h, body, fds := call(t, client, map[string]any{"op": "ffr_read", "handle": handle}, idx)
	if len(fds) != 1 {
		t.Fatalf("read: %v, %d descriptors", h, len(fds))
	}
	size := int(h["size"].(float64))
	mem, err := unix.Mmap(fds[0], 0, size, unix.PROT_READ, unix.MAP_SHARED)
	unix.Close(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	pos, err := int64s(body)
	if err != nil {
		t.Fatal(err)
	}
	for k, i := range []int{3, 0, 1, 2, 0} {
		if got := string(mem[pos[2*k]:pos[2*k+1]]); got != string(samples[i]) {
			t.Errorf("sample %d (request %d): got %q", i, k, got)
		}
	}
	// Errors carry the Go message and a code.
	h, _, _ = call(t, client, map[string]any{"op": "ffr_read", "handle": handle}, putInt64s([]int64{9}))
	if h["code"] != "index" || !strings.Contains(h["error"].(string), "index 9") {
		t.Errorf("bad index: %v", h)
	}
	h, _, _ = call(t, client, map[string]any{"op": "nope"}, nil)
	if h["kind"] != "usage" {
		t.Errorf("unknown op: %v", h)
	}
	client.Close()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func TestLoaderStreamDeliversAnEpoch(t *testing.T) {
	var samples [][]byte
	for i := 0; i < 100; i++ {
		samples = append(samples, []byte(strings.Repeat(string(rune('a'+i%26)), 10+i)))
	}
	path := writeDataset(t, samples)
	server, client := socketPair(t)
	defer client.Close()
	go NewServer().Serve(context.Background(), server)
	h, _, fds := call(t, client, map[string]any{"op": "loader_open", "paths": []string{path}, "batch_size": 16,
		"shuffle": true, "seed": 1, "world_size": 1, "check_data": true}, nil)
	if len(fds) != 1 {
		t.Fatalf("open: %v", h)
	}
	handle := h["handle"]
	slots, slotSize := int(h["slots"].(float64)), int(h["slot_size"].(float64))
	board := int(h["board"].(float64))
	ring, err := unix.Mmap(fds[0], 0, board+slots*slotSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(ring)
	// Pull batches with loader_next, releasing each through the board.
	seen := map[int64]bool{}
	for b := 0; b < 7; b++ {
		h, body, _ := call(t, client, map[string]any{"op": "loader_next", "handle": handle}, nil)
		if h["error"] != nil {
			t.Fatal(h["error"])
		}
		if h["batch"] != true {
			t.Fatalf("batch reply header %v", h)
		}
		meta, _ := int64s(body)
		if len(meta) < batchMeta {
			t.Fatalf("batch body of %d int64s", len(meta))
		}
		slot, seq, n := int(meta[0]), uint32(meta[1]), int(meta[2])
		if epoch, step, cursor := meta[3], meta[4], meta[7]; epoch != 0 || step != int64(b) || (b < 6 && cursor != int64(b+1)*16) {
			t.Fatalf("batch %d: epoch %d step %d cursor %d", b, epoch, step, cursor)
		}
		v := meta[batchMeta:]
		if len(v) != 3*n {
			t.Fatalf("batch of %d samples with %d int64s", n, len(v))
		}
		base := board + slot*slotSize
		for k := 0; k < n; k++ {
			i := v[k]
			if got := string(ring[base+int(v[n+2*k]) : base+int(v[n+2*k+1])]); got != string(samples[i]) {
				t.Fatalf("sample %d: got %q", i, got)
			}
			seen[i] = true
		}
		binary.LittleEndian.PutUint32(ring[4*slot:], seq)
	}
	if len(seen) != 100 {
		t.Fatalf("an epoch delivered %d distinct samples, want 100", len(seen))
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, '{', '}'})
	f.Add([]byte{255, 255, 255, 255, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := socketPair(t)
		defer a.Close()
		go func() {
			b.Write(data)
			b.Close()
		}()
		for {
			fr, err := readFrame(a)
			if err != nil {
				return
			}
			if len(fr.header) > maxHeader {
				t.Fatalf("header of %d bytes accepted", len(fr.header))
			}
		}
	})
}
