package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

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
		if grid := meta[9]; grid != 0 {
			t.Fatalf("batch %d of samples of different lengths has grid %d", b, grid)
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

// connectStream adds a request connection to the server behind control (as
// Python's Engine.connection does) and returns the client end.
func connectStream(t *testing.T, control *net.UnixConn) *net.UnixConn {
	t.Helper()
	local, remote := socketPair(t)
	f, err := remote.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	remote.Close()
	h, _ := json.Marshal(map[string]any{"op": "connect"})
	msg := make([]byte, 8, 8+len(h))
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(h)))
	msg = append(msg, h...)
	if _, _, err := control.WriteMsgUnix(msg, unix.UnixRights(int(f.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	fr, err := readFrame(control)
	if err != nil || !strings.Contains(string(fr.header), `"ok":true`) {
		t.Fatalf("connect: %s %v", fr.header, err)
	}
	return local
}

// openRing opens a loader over samples and maps its ring.
func openRing(t *testing.T, c *net.UnixConn, path string, extra map[string]any) (handle any, ring []byte, board, slots, slotSize int) {
	t.Helper()
	req := map[string]any{"op": "loader_open", "paths": []string{path}, "batch_size": 4, "seed": 1, "world_size": 1, "check_data": true}
	for k, v := range extra {
		req[k] = v
	}
	h, _, fds := call(t, c, req, nil)
	if len(fds) != 1 {
		t.Fatalf("open: %v", h)
	}
	slots, slotSize, board = int(h["slots"].(float64)), int(h["slot_size"].(float64)), int(h["board"].(float64))
	if h["waiting_word"] != float64(boardWaiting) || h["wake_word"] != float64(boardWake) {
		t.Fatalf("open reply names the wait words %v and %v", h["waiting_word"], h["wake_word"])
	}
	ring, err := unix.Mmap(fds[0], 0, board+slots*slotSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(ring) })
	return h["handle"], ring, board, slots, slotSize
}

// TestLoaderStreamSleepsUntilWoken: with every slot lent, the engine sleeps
// on the board's wake word, and a release written to the board and woken
// as Python does it (bump the word, FUTEX_WAKE) brings the next batch. The
// sleep's safety timeout is made an hour long, so only the wake-up can.
func TestLoaderStreamSleepsUntilWoken(t *testing.T) {
	defer func(d time.Duration) { wakeTimeout = d }(wakeTimeout)
	wakeTimeout = time.Hour
	var samples [][]byte
	for i := 0; i < 200; i++ {
		samples = append(samples, []byte(strings.Repeat(string(rune('a'+i%26)), 1+i%50)))
	}
	path := writeDataset(t, samples)
	server, control := socketPair(t)
	defer control.Close()
	done := make(chan error, 1)
	go func() { done <- NewServer().Serve(context.Background(), server) }()
	handle, ring, board, slots, slotSize := openRing(t, control, path, map[string]any{"prefetch": 1, "hold": 1, "ahead": 0})
	if want := 2*1 + 2 + 1; slots != want {
		t.Fatalf("%d slots, want 2*prefetch+2+hold+ahead = %d", slots, want)
	}
	stream := connectStream(t, control)
	defer stream.Close()
	h, _ := json.Marshal(map[string]any{"op": "loader_stream", "handle": handle})
	msg := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, uint32(len(h))), 0)
	if _, err := stream.Write(append(msg, h...)); err != nil {
		t.Fatal(err)
	}
	word := func(i int) *uint32 { return (*uint32)(unsafe.Pointer(&ring[4*i])) }
	next := func() (slot int, seq uint32) {
		t.Helper()
		stream.SetReadDeadline(time.Now().Add(30 * time.Second))
		f, err := readFrame(stream)
		if err != nil {
			t.Fatalf("no batch: %v", err)
		}
		meta, _ := int64s(f.body)
		if len(meta) < batchMeta {
			t.Fatalf("reply %s", f.header)
		}
		slot, seq, n := int(meta[0]), uint32(meta[1]), int(meta[2])
		base := board + slot*slotSize
		for k := 0; k < n; k++ {
			i := meta[batchMeta+k]
			s, e := meta[batchMeta+n+2*k], meta[batchMeta+n+2*k+1]
			if !bytes.Equal(ring[base+int(s):base+int(e)], samples[i]) {
				t.Fatalf("sample %d differs", i)
			}
		}
		return slot, seq
	}
	// Take every slot without releasing: the engine must end up asleep.
	var held [][2]uint32
	for range slots {
		s, q := next()
		held = append(held, [2]uint32{uint32(s), q})
	}
	for deadline := time.Now().Add(30 * time.Second); atomic.LoadUint32(word(boardWaiting)) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the engine never waited for a slot")
		}
		time.Sleep(time.Millisecond)
	}
	// Release the oldest batches one at a time as Python does: a release
	// wakes the engine only if the waiting word names its lend number or
	// an earlier one. After a wake-up the engine refills every released
	// slot.
	released := 0
	for wakes := 0; wakes < 10; {
		rel := held[0]
		held = held[1:]
		atomic.StoreUint32(word(int(rel[0])), rel[1])
		released++
		w := atomic.LoadUint32(word(boardWaiting))
		if w == 0 || rel[1]-w >= 1<<31 {
			if len(held) == 0 {
				t.Fatalf("every batch released and the engine asked for no wake-up (waiting word %d)", w)
			}
			continue
		}
		atomic.AddUint32(word(boardWake), 1)
		futexWake(word(boardWake))
		wakes++
		for ; released > 0; released-- {
			s, q := next()
			held = append(held, [2]uint32{uint32(s), q})
		}
		for deadline := time.Now().Add(30 * time.Second); atomic.LoadUint32(word(boardWaiting)) == 0; {
			if time.Now().After(deadline) {
				t.Fatal("the engine did not wait for a slot again")
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Closing the loader while the producer sleeps ends it (no hang, no
	// touching the unmapped ring afterwards).
	if h, _, _ := call(t, control, map[string]any{"op": "close", "handle": handle}, nil); h["ok"] != true {
		t.Fatalf("close: %v", h)
	}
	stream.Close()
	control.Close()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestLoaderRingSlots: the ring has room for the planned batches, those in
// flight and those held; a memory budget takes planned slots off first,
// then shrinks the slots, and refuses a budget that cannot hold a sample.
func TestLoaderRingSlots(t *testing.T) {
	var samples [][]byte
	for i := 0; i < 64; i++ {
		samples = append(samples, bytes.Repeat([]byte{byte(i)}, 1000))
	}
	path := writeDataset(t, samples)
	server, control := socketPair(t)
	defer control.Close()
	go NewServer().Serve(context.Background(), server)
	open := func(budget int) map[string]any {
		h, _, fds := call(t, control, map[string]any{"op": "loader_open", "paths": []string{path}, "batch_size": 8,
			"world_size": 1, "prefetch": 3, "hold": 2, "ahead": 1, "memory_budget": budget}, nil)
		closeFDs(fds)
		return h
	}
	const slot = 8192 // 8 samples of 1000 bytes, rounded up to pages
	for _, c := range []struct {
		budget, slots, slotSize int
	}{
		{0, 2*3 + 2 + 2 + 1, slot}, // no budget: every planned batch has a slot
		{100 * slot, 11, slot},     // a budget that fits them all changes nothing
		{8 * slot, 8, slot},        // planned slots go first...
		{6 * slot, 6, slot},        // ...down to prefetch + hold + ahead
		{6 * 3000, 6, 4096},        // then the slots shrink (to whole pages)
	} {
		h := open(c.budget)
		if h["error"] != nil {
			t.Fatalf("budget %d: %v", c.budget, h["error"])
		}
		if got := int(h["slots"].(float64)); got != c.slots {
			t.Errorf("budget %d: %d slots, want %d", c.budget, got, c.slots)
		}
		if got := int(h["slot_size"].(float64)); got != c.slotSize {
			t.Errorf("budget %d: slot size %d, want %d", c.budget, got, c.slotSize)
		}
	}
	if h := open(6 * 500); h["code"] != "budget" {
		t.Errorf("a budget too small for one sample per slot: %v", h)
	}
}

// TestLoaderStreamFencedByReclaim: a stream request that the engine reads
// only after a reclaim naming it (Python closed the stream at once, e.g.
// on Ctrl-C, and rewound) is refused, and the loader has not moved: the
// next stream starts with the first batch. Before the fence, the late
// stream took that batch and lost it on its closed connection.
func TestLoaderStreamFencedByReclaim(t *testing.T) {
	var samples [][]byte
	for i := 0; i < 40; i++ {
		samples = append(samples, bytes.Repeat([]byte{byte(i)}, 10+i))
	}
	path := writeDataset(t, samples)
	server, control := socketPair(t)
	defer control.Close()
	go NewServer().Serve(context.Background(), server)
	handle, _, _, _, _ := openRing(t, control, path, nil)
	if h, _, _ := call(t, control, map[string]any{"op": "loader_reclaim", "handle": handle, "stream": 1}, nil); h["ok"] != true {
		t.Fatalf("reclaim: %v", h)
	}
	stream := func(n int) (map[string]any, []int64) {
		t.Helper()
		c := connectStream(t, control)
		defer c.Close()
		h, _ := json.Marshal(map[string]any{"op": "loader_stream", "handle": handle, "stream": n})
		msg := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, uint32(len(h))), 0)
		if _, err := c.Write(append(msg, h...)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		f, err := readFrame(c)
		if err != nil {
			t.Fatalf("stream %d: %v", n, err)
		}
		var rh map[string]any
		json.Unmarshal(f.header, &rh)
		meta, _ := int64s(f.body)
		return rh, meta
	}
	if h, _ := stream(1); h["error"] == nil || !strings.Contains(h["error"].(string), "reclaimed") {
		t.Fatalf("a stream fenced off by a reclaim started: %v", h)
	}
	h, meta := stream(2)
	if h["batch"] != true || len(meta) < batchMeta {
		t.Fatalf("stream 2: %v", h)
	}
	if step := meta[4]; step != 0 {
		t.Fatalf("stream 2 starts at step %d: the refused stream took a batch", step)
	}
}
