package transport

import (
	"context"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/ffkit/ffkit/fs/trust"
)

// BenchmarkTLSCost compares plaintext and TLS connections on loopback in
// one run: 4 MiB replies (large reads), 4 MiB requests (large writes) and
// 4 KiB replies at random offsets of a 64 MiB buffer (small random
// reads), 4 calls in flight. docs/perf/tls.md has the figures.
func BenchmarkTLSCost(b *testing.B) {
	tb, err := trust.Ensure(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	src := make([]byte, 64<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	type req struct {
		Off int `json:"off"`
		N   int `json:"n"`
	}
	for _, mode := range []string{"plain", "tls"} {
		opts := Options{Token: testToken}
		if mode == "tls" {
			opts.Trust, opts.TLSLoopback = tb, true
		}
		s, err := Listen("127.0.0.1:0", opts, func(ctx context.Context, r *Request) (any, [][]byte, error) {
			var q req
			if err := r.Decode(&q); err != nil {
				return nil, nil, err
			}
			if q.N == 0 {
				return req{}, nil, nil // a write: the data came in the request
			}
			return req{}, [][]byte{src[q.Off : q.Off+q.N]}, nil
		})
		if err != nil {
			b.Fatal(err)
		}
		c, err := Dial(context.Background(), s.Addr(), opts)
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range []struct {
			name  string
			n     int
			write bool
		}{{"read4MiB", 4 << 20, false}, {"write4MiB", 4 << 20, true}, {"read4KiB", 4 << 10, false}} {
			b.Run(w.name+"/"+mode, func(b *testing.B) {
				b.SetBytes(int64(w.n))
				// CPU per GiB moved (both ends are this process): unlike
				// MB/s, it holds still on a machine shared with other jobs.
				cpu0 := cpuSeconds()
				defer func() {
					b.ReportMetric((cpuSeconds()-cpu0)/(float64(b.N)*float64(w.n)/(1<<30)), "cpu-s/GiB")
				}()
				b.SetParallelism(2) // 2 * GOMAXPROCS calls in flight
				b.RunParallel(func(pb *testing.PB) {
					rng := rand.New(rand.NewPCG(1, 2))
					for pb.Next() {
						off := rng.IntN(len(src)/w.n) * w.n
						var data [][]byte
						q := req{Off: off, N: w.n}
						if w.write {
							data, q.N = [][]byte{src[off : off+w.n]}, 0
						}
						out, release, err := c.CallRelease(context.Background(), 7, q, data, nil)
						if err != nil {
							b.Fatal(err)
						}
						if !w.write && len(out) != w.n {
							b.Fatalf("got %d bytes", len(out))
						}
						release()
					}
				})
			})
		}
		c.Close()
		s.Close()
	}
}

// cpuSeconds is the user + system CPU time this process used so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
