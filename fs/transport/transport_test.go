package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

type echoReq struct {
	N int `json:"n"`
}

func echoServer(t *testing.T, opts Options) *Server {
	t.Helper()
	s, err := Listen("127.0.0.1:0", opts, func(ctx context.Context, r *Request) (any, [][]byte, error) {
		var q echoReq
		if err := r.Decode(&q); err != nil {
			return nil, nil, err
		}
		if q.N < 0 {
			return nil, nil, fmt.Errorf("negative %d", q.N)
		}
		return echoReq{N: q.N + 1}, [][]byte{r.Data, []byte("!")}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestCallMultiplexed(t *testing.T) {
	s := echoServer(t, Options{Token: "secret", Name: "srv"})
	c, err := Dial(context.Background(), s.Addr(), Options{Token: "secret", Name: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Peer() != "srv" {
		t.Fatalf("peer %q", c.Peer())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			payload := bytes.Repeat([]byte{byte(i)}, i*1000)
			var resp echoReq
			data, err := c.Call(context.Background(), 7, echoReq{N: i}, [][]byte{payload[:len(payload)/2], payload[len(payload)/2:]}, &resp)
			if err != nil {
				errs <- err
				return
			}
			if resp.N != i+1 || !bytes.Equal(data, append(payload, '!')) {
				errs <- fmt.Errorf("call %d: got n=%d, %d bytes", i, resp.N, len(data))
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A handler error comes back as a RemoteError with its message.
	_, err = c.Call(context.Background(), 7, echoReq{N: -1}, nil, nil)
	var re *RemoteError
	if !errors.As(err, &re) || !strings.Contains(re.Msg, "negative -1") {
		t.Fatalf("want remote error, got %v", err)
	}
}

func TestWrongTokenRefusedAndLogged(t *testing.T) {
	s := echoServer(t, Options{Token: "secret"})
	var mu sync.Mutex
	var logs []string
	s.SetLogf(func(f string, a ...any) { mu.Lock(); logs = append(logs, fmt.Sprintf(f, a...)); mu.Unlock() })
	// The server proves itself first: a client with another token sees
	// a server that is not a member of its cluster, and stops there.
	_, err := Dial(context.Background(), s.Addr(), Options{Token: "wrong", Name: "intruder"})
	if !errors.Is(err, ErrNotMember) {
		t.Fatalf("want ErrNotMember, got %v", err)
	}
	// A peer that goes on with a wrong proof is refused and logged
	// (refusals are logged at most once a second: retry until ours is).
	deadline := time.Now().Add(time.Minute)
	for {
		nc, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		var buf [handshakeMax]byte
		writeSmall(nc, THello, helloMsg{Name: "intruder", Nonce: newNonce()})
		if _, err := readSmall(nc, &buf); err != nil {
			t.Fatal(err)
		}
		writeSmall(nc, TProof, proofMsg{Proof: make([]byte, 32)})
		f, err := readSmall(nc, &buf)
		nc.Close()
		if err != nil || f.Type != TError || !strings.Contains(string(f.Header), "bad_token") {
			t.Fatalf("want a bad_token error frame, got type %d %q %v", f.Type, f.Header, err)
		}
		mu.Lock()
		ok := strings.Contains(strings.Join(logs, "\n"), "wrong cluster token")
		got := append([]string(nil), logs...)
		mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refusal not logged: %q", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestOversizedAndMalformedFramesRejected(t *testing.T) {
	s := echoServer(t, Options{Token: "secret", MaxFrame: 1 << 20})
	// Oversized request after a good handshake: the server drops the
	// connection and keeps serving others.
	c, err := Dial(context.Background(), s.Addr(), Options{Token: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = c.Call(ctx, 7, echoReq{}, [][]byte{make([]byte, 2<<20)}, nil)
	if err == nil {
		t.Fatal("oversized frame accepted")
	}
	c.Close()
	// Garbage on a raw connection.
	for _, junk := range [][]byte{{0, 0, 0, 1, 9}, {0xff, 0xff, 0xff, 0xff}, []byte("GET / HTTP/1.1\r\n\r\n")} {
		nc, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		nc.Write(junk)
		nc.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 10)
		if n, _ := nc.Read(buf); n != 0 {
			t.Fatalf("server answered junk with %q", buf[:n])
		}
		nc.Close()
	}
	c2, err := Dial(context.Background(), s.Addr(), Options{Token: "secret"})
	if err != nil {
		t.Fatalf("server died after bad frames: %v", err)
	}
	defer c2.Close()
	if _, err := c2.Call(context.Background(), 7, echoReq{N: 1}, nil, nil); err != nil {
		t.Fatal(err)
	}
}

func TestPartitionDropsTraffic(t *testing.T) {
	var p Partition
	s := echoServer(t, Options{Token: "secret", Name: "b", Faults: &p})
	c, err := Dial(context.Background(), s.Addr(), Options{Token: "secret", Name: "a", Faults: &p})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Block("a", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Call(ctx, 7, echoReq{}, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("partitioned call: %v", err)
	}
	if _, err := Dial(context.Background(), s.Addr(), Options{Token: "secret", Name: "a", Faults: &p}); !errors.Is(err, ErrPartitioned) {
		t.Fatalf("partitioned dial: %v", err)
	}
	p.Heal()
	if _, err := c.Call(context.Background(), 7, echoReq{}, nil, nil); err != nil {
		t.Fatalf("after heal: %v", err)
	}
}

func TestDecodeFrameRoundTrip(t *testing.T) {
	f := Frame{ID: 42, Type: TReply, Method: 3, Header: []byte(`{"a":1}`), Data: []byte("data")}
	g, err := DecodeFrame(EncodeFrame(f), DefaultMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	if g.ID != 42 || g.Type != TReply || g.Method != 3 || string(g.Header) != `{"a":1}` || string(g.Data) != "data" {
		t.Fatalf("got %+v", g)
	}
	b := EncodeFrame(f)
	b[16+3] = 0xff // header length past the end
	if _, err := DecodeFrame(b, DefaultMaxFrame); !errors.Is(err, ErrFrame) {
		t.Fatalf("bad header length: %v", err)
	}
}

func FuzzDecodeFrame(f *testing.F) {
	f.Add(EncodeFrame(Frame{ID: 1, Type: TRequest, Method: 2, Header: []byte("{}"), Data: []byte("x")}))
	f.Add([]byte{0, 0, 0, 16})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeFrame(b, 1<<20)
		if err != nil {
			return
		}
		// A decoded frame re-encodes to the same bytes.
		if !bytes.Equal(EncodeFrame(fr), b) {
			t.Fatalf("round trip differs")
		}
		// ReadFrame agrees with DecodeFrame.
		fr2, err := ReadFrame(bytes.NewReader(b), 1<<20)
		if err != nil || fr2.ID != fr.ID || !bytes.Equal(fr2.Data, fr.Data) {
			t.Fatalf("ReadFrame disagrees: %v", err)
		}
	})
}

func TestCallIntoSink(t *testing.T) {
	s := echoServer(t, Options{Token: "secret"})
	c, err := Dial(context.Background(), s.Addr(), Options{Token: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	payload := bytes.Repeat([]byte("0123456789"), 100000)
	dst := make([]byte, len(payload)+1)
	var resp echoReq
	err = c.CallInto(context.Background(), 7, echoReq{N: 4}, [][]byte{payload}, &resp, func(r io.Reader, n int) error {
		if n != len(dst) {
			return fmt.Errorf("sink got n=%d", n)
		}
		_, err := io.ReadFull(r, dst)
		return err
	})
	if err != nil || resp.N != 5 || !bytes.Equal(dst, append(payload, '!')) {
		t.Fatalf("CallInto: %v n=%d", err, resp.N)
	}
	// A sink that reads less leaves the connection usable; errors of the
	// handler still come back as RemoteError.
	err = c.CallInto(context.Background(), 7, echoReq{N: 1}, [][]byte{payload}, &resp, func(r io.Reader, n int) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	err = c.CallInto(context.Background(), 7, echoReq{N: -1}, nil, &resp, func(r io.Reader, n int) error { return nil })
	var re *RemoteError
	if !errors.As(err, &re) {
		t.Fatalf("want remote error, got %v", err)
	}
	if _, err := c.Call(context.Background(), 7, echoReq{N: 1}, nil, nil); err != nil {
		t.Fatal(err)
	}
}
