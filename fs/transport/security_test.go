package transport

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/trust"
)

const testToken = "0123456789abcdef0123456789abcdef-cluster-secret"

func tlsServer(t *testing.T, b *trust.Bundle) *Server {
	t.Helper()
	return echoServer(t, Options{Token: testToken, Trust: b, TLSLoopback: true, Name: "srv"})
}

func mustCall(t *testing.T, c *Conn) {
	t.Helper()
	var r echoReq
	out, err := c.Call(context.Background(), 7, echoReq{N: 1}, [][]byte{[]byte("x")}, &r)
	if err != nil || r.N != 2 || string(out) != "x!" {
		t.Fatalf("call: %v %v %q", err, r, out)
	}
}

func TestTLSVerifiesBothSides(t *testing.T) {
	b, err := trust.Ensure(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := trust.Ensure(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := tlsServer(t, b)
	caOnly, err := trust.FromPEM(b.CAPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(context.Background(), s.Addr(), Options{Token: testToken, Trust: caOnly, TLSLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.nc.(*tlsConn); !ok {
		t.Fatalf("connection is %T, want TLS", c.nc)
	}
	mustCall(t, c)
	c.Close()
	// A client trusting another cluster's CA refuses this server.
	if _, err := Dial(context.Background(), s.Addr(), Options{Token: testToken, Trust: other, TLSLoopback: true}); !errors.Is(err, ErrNotMember) {
		t.Fatalf("other CA: want ErrNotMember, got %v", err)
	}
	// A verified server with another token: the token is reported wrong.
	if _, err := Dial(context.Background(), s.Addr(), Options{Token: "wrong", Trust: caOnly, TLSLoopback: true}); !errors.Is(err, ErrBadToken) {
		t.Fatalf("wrong token: want ErrBadToken, got %v", err)
	}
	// A TLS-only listener refuses plaintext peers, even with the token;
	// a client holding the CA goes again with TLS.
	if _, err := Dial(context.Background(), s.Addr(), Options{Token: testToken}); !errors.Is(err, ErrNotMember) {
		t.Fatalf("plaintext client to a TLS-only listener: want ErrNotMember, got %v", err)
	}
	c, err = Dial(context.Background(), s.Addr(), Options{Token: testToken, Trust: caOnly})
	if err != nil {
		t.Fatalf("client with the CA to a TLS-only loopback listener: %v", err)
	}
	if _, ok := c.nc.(*tlsConn); !ok {
		t.Fatalf("connection is %T, want TLS", c.nc)
	}
	mustCall(t, c)
	c.Close()
	// Non-loopback: no plaintext listener and no plaintext dial.
	if _, err := Listen("0.0.0.0:0", Options{Token: testToken}, nil); !errors.Is(err, trust.ErrNoTrust) {
		t.Fatalf("plaintext non-loopback listener: want ErrNoTrust, got %v", err)
	}
	if _, err := Dial(context.Background(), "192.0.2.1:9", Options{Token: testToken}); !errors.Is(err, ErrNotMember) {
		t.Fatalf("plaintext non-loopback dial: want ErrNotMember, got %v", err)
	}
}

// capture is an impostor: it listens, records every byte a client sends
// and answers like a server that does not hold the token. stop closes
// it, waits for its goroutines and returns what it received.
func capture(t *testing.T, ln net.Listener, answer bool) (stop func() []byte) {
	t.Helper()
	var mu sync.Mutex
	got := &bytes.Buffer{}       // guarded by mu
	conns := map[net.Conn]bool{} // guarded by mu
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[nc] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				nc.SetDeadline(time.Now().Add(10 * time.Second))
				if answer {
					var buf [handshakeMax]byte
					f, err := readSmall(nc, &buf)
					mu.Lock()
					got.Write(f.Header)
					mu.Unlock()
					if err != nil {
						return
					}
					writeSmall(nc, THello, helloMsg{Name: "meta", Nonce: newNonce(), Proof: make([]byte, 32)})
				}
				b := make([]byte, 4096)
				for {
					n, err := nc.Read(b)
					mu.Lock()
					got.Write(b[:n])
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	var once sync.Once
	stop = func() []byte {
		once.Do(func() {
			ln.Close()
			mu.Lock()
			for nc := range conns {
				nc.Close()
			}
			mu.Unlock()
			wg.Wait()
		})
		mu.Lock()
		defer mu.Unlock()
		return bytes.Clone(got.Bytes())
	}
	t.Cleanup(func() { stop() })
	return stop
}

func noToken(t *testing.T, got []byte) {
	t.Helper()
	for _, s := range []string{testToken, hex.EncodeToString([]byte(testToken))} {
		if bytes.Contains(got, []byte(s)) {
			t.Fatalf("the impostor received the token: %q", got)
		}
	}
}

// TestImpostorGetsNoToken: a listener on a service's port (a restart, a
// recycled port, a fake metadata server) that does not hold the token
// receives nothing it could use, and the client says why it stopped.
func TestImpostorGetsNoToken(t *testing.T) {
	b, err := trust.Ensure(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		answer bool
		opts   Options
		want   error
	}{
		{"plaintext speaks protocol", true, Options{Token: testToken}, ErrNotMember},
		{"plaintext silent", false, Options{Token: testToken, DialTimeout: 500 * time.Millisecond}, ErrTimeout},
		{"tls", false, Options{Token: testToken, Trust: b, TLSLoopback: true, DialTimeout: 500 * time.Millisecond}, ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			stop := capture(t, ln, tc.answer)
			_, err = Dial(context.Background(), ln.Addr().String(), tc.opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("want %v, got %v", tc.want, err)
			}
			noToken(t, stop())
		})
	}
	// The same port later refuses: reported as refused, not as a token problem.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if _, err := Dial(context.Background(), addr, Options{Token: testToken}); !errors.Is(err, ErrConnRefused) {
		t.Fatalf("closed port: want ErrConnRefused, got %v", err)
	}
}

// floodConns is how many unauthenticated connections TestPreAuthFlood
// holds open: FFKIT_FLOOD_CONNS (15000 as in the issue; default 2000).
func floodConns(t *testing.T) int {
	n := 2000
	if v := os.Getenv("FFKIT_FLOOD_CONNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			t.Fatalf("FFKIT_FLOOD_CONNS=%q: want a positive count", v)
		}
	}
	return n
}

// TestPreAuthFlood: many idle unauthenticated connections, reopened as
// the server drops them, cost bounded memory; an authenticated client
// keeps working and a new one gets in; the log stays short.
func TestPreAuthFlood(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			opts := Options{Token: testToken, DialTimeout: 3 * time.Second}
			if useTLS {
				b, err := trust.Ensure(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				opts.Trust, opts.TLSLoopback = b, true
			}
			s := echoServer(t, opts)
			var logLines atomic.Int64
			s.SetLogf(func(string, ...any) { logLines.Add(1) })
			c, err := Dial(context.Background(), s.Addr(), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)

			n := floodConns(t)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var opened atomic.Int64
			// Attackers: each keeps its share of connections open, silent,
			// and reopens one as soon as the server drops it.
			const attackers = 50
			for a := 0; a < attackers; a++ {
				wg.Add(1)
				go func(share int) {
					defer wg.Done()
					conns := make([]net.Conn, 0, share)
					defer func() {
						for _, nc := range conns {
							nc.Close()
						}
					}()
					for ctx.Err() == nil {
						for len(conns) < share && ctx.Err() == nil {
							nc, err := net.Dial("tcp", s.Addr())
							if err != nil {
								time.Sleep(time.Millisecond)
								continue
							}
							opened.Add(1)
							conns = append(conns, nc)
						}
						// Drop the connections the server closed, keep the rest.
						live := conns[:0]
						for _, nc := range conns {
							nc.SetReadDeadline(time.Now().Add(time.Millisecond))
							var b [1]byte
							if _, err := nc.Read(b[:]); err != nil && !isTimeout(err) {
								nc.Close()
								continue
							}
							live = append(live, nc)
						}
						conns = live
						time.Sleep(5 * time.Millisecond)
					}
				}(n / attackers)
			}
			defer func() { cancel(); wg.Wait() }()
			// Under the flood: the old client works, a new one gets in
			// (retrying while the server refuses it for the flood).
			for opened.Load() < int64(n) {
				mustCall(t, c)
				time.Sleep(10 * time.Millisecond)
			}
			deadline := time.Now().Add(2 * time.Minute)
			for {
				c2, err := Dial(context.Background(), s.Addr(), opts)
				if err == nil {
					mustCall(t, c2)
					c2.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no new authenticated connection under the flood: %v", err)
				}
			}
			var during runtime.MemStats
			runtime.ReadMemStats(&during)
			s.mu.Lock()
			pending := s.pending.Len()
			s.mu.Unlock()
			if pending > MaxPendingHandshakes {
				t.Fatalf("%d handshakes pending, limit %d", pending, MaxPendingHandshakes)
			}
			// The test process holds both ends; the attacker's side is
			// small per connection. The old server took 256 KiB each.
			grew := int64(during.HeapInuse) - int64(before.HeapInuse)
			t.Logf("%d connections opened; heap in use grew %d MiB; %d log lines", opened.Load(), grew>>20, logLines.Load())
			if grew > 100<<20 {
				t.Fatalf("heap grew %d MiB under %d unauthenticated connections", grew>>20, n)
			}
			if logLines.Load() > 200 {
				t.Fatalf("%d log lines for the flood", logLines.Load())
			}
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || strings.Contains(err.Error(), "timeout")
}
