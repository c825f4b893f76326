package systest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs/client"
)

// BenchmarkDataPlane measures, on one machine with 3 storage processes and
// 3 replicas, in one run:
//   - large sequential reads through the client vs the lesser of a plain
//     TCP loopback copy and the disk's sequential read (warm: page cache;
//     cold: page cache dropped for the files with fadvise DONTNEED);
//   - large writes vs the local disk's sequential write (fsync at end);
//   - batched 4 KiB random reads: IOPS and CPU time per IO (all processes).
//
// Run: go test -run XXX -bench DataPlane -benchtime 1x ./fs/systest
// FFKIT_BENCH_MB sets the data size per measurement (default 128),
// FFKIT_BENCH_ROUNDS the interleaved rounds (default 3, medians reported),
// FFKIT_BENCH_WRITERS the writes in flight (default 16).
func BenchmarkDataPlane(b *testing.B) {
	mb := 128
	if v, err := strconv.Atoi(os.Getenv("FFKIT_BENCH_MB")); err == nil && v > 0 {
		mb = v
	}
	size := int64(mb) << 20
	for i := 0; i < b.N; i++ {
		runDataPlaneBench(b, size)
	}
}

func runDataPlaneBench(b *testing.B, size int64) {
	c := newCluster(b, 3)
	ctx := context.Background()
	const chunk = 4 << 20
	nChunks := int(size / chunk)
	chains := c.cl.Chains()
	writers := 16
	if v, err := strconv.Atoi(os.Getenv("FFKIT_BENCH_WRITERS")); err == nil && v > 0 {
		writers = v
	}
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("FFKIT_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	mibs := func(start time.Time) float64 { return float64(size) / time.Since(start).Seconds() / (1 << 20) }

	diskFile := filepath.Join(c.dir, "baseline.dat")
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(rand.Uint32())
	}
	diskWriteOnce := func() float64 {
		start := time.Now()
		f, err := os.Create(diskFile)
		if err != nil {
			b.Fatal(err)
		}
		for w := int64(0); w < size; w += int64(len(buf)) {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		f.Sync()
		r := mibs(start)
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
		return r
	}
	diskRead := func() float64 {
		f, _ := os.Open(diskFile)
		defer f.Close()
		start := time.Now()
		for {
			if _, err := f.Read(buf); err != nil {
				break
			}
		}
		return mibs(start)
	}
	payload := make([]byte, chunk)
	for i := range payload {
		payload[i] = byte(rand.Uint32())
	}
	clusterWrite := func(inode uint64) float64 {
		start := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(writers)
		for i := 0; i < nChunks; i++ {
			g.Go(func() error {
				return c.cl.WriteChunk(gctx, chains[i%len(chains)], client.ChunkID{Inode: inode, Index: uint64(i)}, 0, payload)
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		return mibs(start)
	}
	readBufs := make(chan []byte, 8) // reused, as a reader with 8 buffers would
	for i := 0; i < 8; i++ {
		readBufs <- make([]byte, chunk)
	}
	clusterRead := func(inode uint64) float64 {
		start := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for i := 0; i < nChunks; i++ {
			g.Go(func() error {
				buf := <-readBufs
				defer func() { readBufs <- buf }()
				rd := []client.ChunkRead{{Chain: chains[i%len(chains)], Chunk: client.ChunkID{Inode: inode, Index: uint64(i)}, Buf: buf}}
				return c.cl.ReadChunks(gctx, rd)
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		return mibs(start)
	}

	// Interleaved rounds: the machine is shared, so each of our figures is
	// measured right next to its baseline and the median ratio reported.
	type row struct{ ours, base []float64 }
	var write, cold, warm row
	var tcps, diskColds, diskWarms []float64
	for r := 0; r < rounds; r++ {
		inode := uint64(10 + r)
		dw := diskWriteOnce()
		cw := clusterWrite(inode)
		write.ours, write.base = append(write.ours, cw), append(write.base, dw)
		dc := diskRead()
		dropCache(filepath.Join(c.dir, "storage-1"))
		dropCache(filepath.Join(c.dir, "storage-2"))
		dropCache(filepath.Join(c.dir, "storage-3"))
		cc := clusterRead(inode)
		tcp := tcpLoopback(b, size)
		dwarm := diskRead()
		cwarm := clusterRead(inode)
		tcps, diskColds, diskWarms = append(tcps, tcp), append(diskColds, dc), append(diskWarms, dwarm)
		cold.ours, cold.base = append(cold.ours, cc), append(cold.base, min(tcp, dc))
		warm.ours, warm.base = append(warm.ours, cwarm), append(warm.base, min(tcp, dwarm))
		fmt.Printf("round %d: write %.0f vs disk %.0f | cold read %.0f vs min(tcp %.0f, disk %.0f) | warm read %.0f vs min(tcp %.0f, disk %.0f) MiB/s\n",
			r+1, cw, dw, cc, tcp, dc, cwarm, tcp, dwarm)
	}
	ratio := func(x row) (float64, float64, float64) {
		var rs []float64
		for i := range x.ours {
			rs = append(rs, x.ours[i]/x.base[i])
		}
		return median(x.ours), median(x.base), median(rs)
	}

	// Batched 4 KiB random reads: batches of 256, 4 batches in flight.
	nData := nChunks
	cpu0 := c.cpuTime()
	var ios int64
	var mu sync.Mutex
	deadline := time.Now().Add(5 * time.Second)
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for w := 0; w < 4; w++ {
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			bufs := make([]byte, 256*4096)
			for time.Now().Before(deadline) {
				reads := make([]client.ChunkRead, 256)
				for k := range reads {
					i := rng.IntN(nData)
					reads[k] = client.ChunkRead{Chain: chains[i%len(chains)], Chunk: client.ChunkID{Inode: 10, Index: uint64(i)},
						Off: int64(rng.IntN(chunk/4096)) * 4096, Buf: bufs[k*4096 : (k+1)*4096]}
				}
				if err := c.cl.ReadChunks(gctx, reads); err != nil {
					return err
				}
				mu.Lock()
				ios += int64(len(reads))
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	el := time.Since(start).Seconds()
	cpu := c.cpuTime() - cpu0
	iops := float64(ios) / el

	fmt.Printf("\nffkit data plane: 3 storage processes x 2 targets, 3 replicas, one machine; %d MiB per measurement in 4 MiB chunks; median of %d interleaved rounds\n", size>>20, rounds)
	o, bs, r := ratio(write)
	fmt.Printf("%-40s %8.0f MiB/s   baseline %-34s %8.0f MiB/s   ratio %.2fx\n", fmt.Sprintf("write, 4 MiB chunks, %d in flight", writers), o, "disk sequential write + fsync", bs, r)
	wr := r
	o, bs, r = ratio(cold)
	fmt.Printf("%-40s %8.0f MiB/s   baseline %-34s %8.0f MiB/s   ratio %.2fx\n", "sequential read, cold (8 in flight)", o, fmt.Sprintf("min(tcp %.0f, disk cold %.0f)", median(tcps), median(diskColds)), bs, r)
	cr := r
	o, bs, r = ratio(warm)
	fmt.Printf("%-40s %8.0f MiB/s   baseline %-34s %8.0f MiB/s   ratio %.2fx\n", "sequential read, warm (8 in flight)", o, fmt.Sprintf("min(tcp %.0f, disk warm %.0f)", median(tcps), median(diskWarms)), bs, r)
	fmt.Printf("%-40s %8.0f IOPS    CPU %.1f us per read (client + 3 storage processes), warm page cache\n", "4 KiB random reads, batches of 256", iops, cpu.Seconds()/float64(ios)*1e6)
	b.ReportMetric(wr, "write-ratio")
	b.ReportMetric(cr, "read-cold-ratio")
	b.ReportMetric(r, "read-warm-ratio")
	b.ReportMetric(iops, "4k-iops")
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// tcpLoopback copies size bytes over a loopback TCP connection: 1 MiB
// writes, the receiver reading into a 4 MiB buffer (data that lands in
// memory, as a reader's does, not into a small scratch buffer).
func tcpLoopback(b *testing.B, size int64) float64 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		dst := make([]byte, 4<<20)
		for {
			if _, err := io.ReadFull(c, dst); err != nil {
				break
			}
		}
		c.Close()
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	start := time.Now()
	for w := int64(0); w < size; w += int64(len(buf)) {
		conn.Write(buf)
	}
	conn.Close()
	<-done
	return float64(size) / time.Since(start).Seconds() / (1 << 20)
}

// dropCache evicts every file under dir from the page cache.
func dropCache(dir string) {
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			if f, err := os.Open(p); err == nil {
				unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
				f.Close()
			}
		}
		return nil
	})
}

// cpuTime is the CPU time used so far by this process and the storage
// processes.
func (c *cluster) cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	total := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	tick := int64(100) // USER_HZ
	for _, p := range c.storage {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ut, _ := strconv.ParseInt(fields[11], 10, 64)
		st, _ := strconv.ParseInt(fields[12], 10, 64)
		total += time.Duration((ut + st) * int64(time.Second) / tick)
	}
	return total
}

// BenchmarkSeqReadWarm reads the same 128 MiB (4 MiB chunks, 8 in flight)
// again and again from a warm page cache: a steady load for profiling the
// read path (FFKIT_STORAGE_CPUPROFILE profiles the storage processes, see
// `ffkit fs storage`; -cpuprofile the client).
//
//	go test -run XXX -bench SeqReadWarm -benchtime 40x ./fs/systest
func BenchmarkSeqReadWarm(b *testing.B) {
	c := newCluster(b, 3)
	ctx := context.Background()
	const chunk, n = 4 << 20, 32
	chains := c.cl.Chains()
	payload := make([]byte, chunk)
	for i := range payload {
		payload[i] = byte(rand.Uint32())
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := 0; i < n; i++ {
		g.Go(func() error {
			return c.cl.WriteChunk(gctx, chains[i%len(chains)], client.ChunkID{Inode: 1, Index: uint64(i)}, 0, payload)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	bufs := make(chan []byte, 8)
	for i := 0; i < 8; i++ {
		bufs <- make([]byte, chunk)
	}
	read := func() {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for i := 0; i < n; i++ {
			g.Go(func() error {
				buf := <-bufs
				defer func() { bufs <- buf }()
				return c.cl.ReadChunks(gctx, []client.ChunkRead{{Chain: chains[i%len(chains)], Chunk: client.ChunkID{Inode: 1, Index: uint64(i)}, Buf: buf}})
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	read()
	b.SetBytes(chunk * n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		read()
	}
	b.StopTimer()
	fmt.Printf("warm sequential read %.0f MiB/s vs tcp loopback %.0f MiB/s\n", float64(b.N)*chunk*n/b.Elapsed().Seconds()/(1<<20), tcpLoopback(b, chunk*n))
}
