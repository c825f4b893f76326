package transport

import (
	"bytes"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ffkit/ffkit/fs/trust"
)

// countConn counts the writes that reach the socket.
type countConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestTLSFramesBatched: large frames written concurrently over TLS
// arrive whole and in one piece each, and leave in a few large writes,
// not one per TLS record (crypto/tls alone: 256 writes per 4 MiB).
func TestTLSFramesBatched(t *testing.T) {
	b, err := trust.Ensure(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := b.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	p1, p2 := net.Pipe()
	cc := &countConn{Conn: p1}
	tc := newTLSClient(cc, b.ClientConfig())
	ts := tls.Server(p2, scfg)
	defer tc.Close()
	defer ts.Close()
	const frames, size = 3, 2 << 20
	got := make(chan Frame, frames)
	go func() {
		for range frames {
			f, err := ReadFrame(ts, DefaultMaxFrame)
			if err != nil {
				t.Error(err)
				close(got)
				return
			}
			got <- f
		}
	}()
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	before := cc.writes.Load()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range frames {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := bytes.Repeat([]byte{byte(i + 1)}, size)
			if err := writeFrame(tc, &mu, uint64(i+1), TRequest, 7, []byte(`{}`), [][]byte{data[:size/2], data[size/2:]}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for range frames {
		f, ok := <-got
		if !ok {
			t.Fatal("reader failed")
		}
		if len(f.Data) != size || string(f.Header) != "{}" || !bytes.Equal(f.Data, bytes.Repeat([]byte{byte(f.ID)}, size)) {
			t.Fatalf("frame %d: %d bytes, header %q, not the bytes sent", f.ID, len(f.Data), f.Header)
		}
		f.Release()
	}
	writes := cc.writes.Load() - before
	if max := int64(frames * (size/batchSize + 2)); writes > max {
		t.Fatalf("%d frames of %d bytes took %d socket writes, want at most %d", frames, size, writes, max)
	}
	t.Logf("%d frames of %d bytes: %d socket writes", frames, size, writes)
	// A small frame afterwards goes out at once (nothing held back).
	werr := make(chan error, 1)
	go func() { werr <- writeFrame(tc, &mu, 9, TRequest, 7, []byte(`{}`), [][]byte{[]byte("x")}) }()
	f, err := ReadFrame(ts, DefaultMaxFrame)
	if werr := <-werr; werr != nil {
		t.Fatal(werr)
	}
	if err != nil || string(f.Data) != "x" {
		t.Fatalf("small frame: %v %q", err, f.Data)
	}
}
