package systest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs/client"
)

// The cross-host bandwidth benchmark (issue 16): the namespace cluster of
// startNSCluster (mgmtd and a metadata server on host 0, one storage
// service with two targets on each of hosts 1-3, 2 chains of 3 replicas,
// TLS between hosts, no short-circuit reads), and a client on host 4,
// against plain TCP over the same veth pairs and bridge, in the same run:
//
//   - read:  the client reads large chunks (4 MiB, 8 in flight) written
//     before, from the page caches of the storage hosts; plain TCP: one
//     stream from each storage host to the client, all at once;
//   - and both again over TLS 1.3 with the cluster's certificates (what
//     every connection between hosts uses), as a second baseline;
//   - write: the client writes 4 MiB chunks (16 in flight) through the
//     chain heads, each replicated to 3 hosts and fsynced there; the bound
//     is min(plain TCP client -> storage hosts, the disk's sequential
//     write with fsync) / 3 replicas.
//
// Rounds alternate the four measurements; medians are reported. The client
// side runs as this test binary re-executed inside host 4's namespace
// (SYSTEST_XHOST_HELPER=client), the TCP ends on hosts 1-3 likewise
// (SYSTEST_XHOST_HELPER=tcp).
//
// CPU seconds per GiB moved are reported for both ends of every
// measurement (client process; storage or TCP server processes).
//
//	FFKIT_BENCH_NETNS=1 [FFKIT_BENCH_MB=256] [FFKIT_BENCH_ROUNDS=3] \
//	    [FFKIT_BENCH_LINK=1gbit] [FFKIT_BENCH_CPUPROFILE=DIR] \
//	    [FFKIT_BENCH_ONLY=cluster_write,tcp_write] \
//	    go test -run TestCrossHostBandwidth -v -timeout 30m ./fs/systest
//
// FFKIT_BENCH_LINK limits every host's link (tc tbf on its eth0 egress) to
// a NIC's rate; FFKIT_BENCH_CPUPROFILE writes CPU profiles of the client
// (one per measurement) to DIR (with FFKIT_STORAGE_CPUPROFILE=DIR/stor, of
// the storage processes too); FFKIT_BENCH_ONLY runs only the named
// measurements (comma-separated; for profiling one of them).
func TestCrossHostBandwidth(t *testing.T) {
	if os.Getenv("FFKIT_BENCH_NETNS") == "" {
		t.Skip("a benchmark: set FFKIT_BENCH_NETNS=1")
	}
	mb, rounds := 256, 3
	if v, err := strconv.Atoi(os.Getenv("FFKIT_BENCH_MB")); err == nil && v > 0 {
		mb = v
	}
	if v, err := strconv.Atoi(os.Getenv("FFKIT_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	c := startNSCluster(t, 2)
	if rate := os.Getenv("FFKIT_BENCH_LINK"); rate != "" {
		// Every host's link sends at most rate (tc tbf on its eth0), as a
		// real NIC would; unset, a veth pair moves bytes as fast as the
		// CPUs copy them.
		for _, h := range c.nn.hosts {
			if err := tcCmd(h, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "512kb", "latency", "50ms"); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("links limited to %s each way per host (tc tbf)", rate)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var servers, tcpPids, storPids []string
	for i := 1; i <= 3; i++ {
		storPids = append(storPids, strconv.Itoa(c.storage[i].cmd.Process.Pid))
	}
	if os.Getenv("FFKIT_STORAGE_CPUPROFILE") != "" {
		// Storage processes write their profiles when they stop.
		t.Cleanup(func() {
			for i := 1; i <= 3; i++ {
				c.storage[i].cmd.Process.Signal(unix.SIGTERM)
				<-c.storage[i].done
			}
		})
	}
	for i := 1; i <= 3; i++ {
		addr := c.nn.ip(i) + ":7300"
		cmd := exec.Command("nsenter", "--net=/run/netns/"+c.nn.hosts[i], self, "-test.run", "^TestCrossHostBandwidth$")
		cmd.Env = append(os.Environ(), "SYSTEST_XHOST_HELPER=tcp", "SYSTEST_XHOST_LISTEN="+addr, "SYSTEST_XHOST_TOKEN_FILE="+c.tokenFile)
		p := startNS(t, cmd, filepath.Join(c.dir, fmt.Sprintf("tcp-%d.log", i)))
		servers = append(servers, addr)
		tcpPids = append(tcpPids, strconv.Itoa(p.cmd.Process.Pid))
	}
	// The disk baseline, on the targets' file system, before the client
	// runs (not beside it).
	res := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		res["disk_write"] = append(res["disk_write"], diskSeqWrite(t, filepath.Join(c.dir, "disk-baseline.dat"), int64(mb)<<20))
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+c.nn.hosts[nsClient], self, "-test.run", "^TestCrossHostBandwidth$", "-test.v")
	cmd.Env = append(os.Environ(), "SYSTEST_XHOST_HELPER=client", "SYSTEST_XHOST_SERVERS="+strings.Join(servers, ","),
		"SYSTEST_XHOST_TCP_PIDS="+strings.Join(tcpPids, ","), "SYSTEST_XHOST_STORAGE_PIDS="+strings.Join(storPids, ","),
		"SYSTEST_XHOST_MGMTD="+strings.TrimPrefix(c.url, "ffkit://"), "SYSTEST_XHOST_TOKEN_FILE="+c.tokenFile,
		"SYSTEST_XHOST_PROFILE="+os.Getenv("FFKIT_BENCH_CPUPROFILE"), "SYSTEST_XHOST_ONLY="+os.Getenv("FFKIT_BENCH_ONLY"), "SYSTEST_XHOST_MB="+strconv.Itoa(mb), "SYSTEST_XHOST_ROUNDS="+strconv.Itoa(rounds), "FFKIT_LOCAL_READS=0")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cpu := map[string][][2]float64{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		l := sc.Text()
		if f := strings.Fields(l); len(f) == 4 && f[0] == "XHOSTCPU" {
			// CPU seconds per GiB moved: client side, server side.
			cl, _ := strconv.ParseFloat(f[2], 64)
			sv, _ := strconv.ParseFloat(f[3], 64)
			cpu[f[1]] = append(cpu[f[1]], [2]float64{cl, sv})
			continue
		}
		if !strings.HasPrefix(l, "XHOST ") {
			continue
		}
		f := strings.Fields(l)
		v, _ := strconv.ParseFloat(f[2], 64)
		res[f[1]] = append(res[f[1]], v)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("client helper: %v", err)
	}
	med := map[string]float64{}
	for k, v := range res {
		med[k] = median(v)
		t.Logf("%-14s MiB/s per round %.0f", k, v)
	}
	var names []string
	for k := range cpu {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		var cl, sv []float64
		for _, v := range cpu[k] {
			cl, sv = append(cl, v[0]), append(sv, v[1])
		}
		t.Logf("%-14s CPU s per GiB: client %.2f, servers %.2f (medians)", k, median(cl), median(sv))
	}
	writeBound := min(med["tcp_write"], med["disk_write"]) / 3
	t.Logf("cross-host, %d MiB per measurement, %d rounds, medians:", mb, rounds)
	t.Logf("  large reads:  cluster %6.0f MiB/s  plain TCP %6.0f MiB/s  ratio %.2f (goal >= 0.8); TLS over TCP %6.0f MiB/s, cluster/TLS %.2f",
		med["cluster_read"], med["tcp_read"], med["cluster_read"]/med["tcp_read"], med["tls_read"], med["cluster_read"]/med["tls_read"])
	t.Logf("  large writes: cluster %6.0f MiB/s  bound min(TCP %.0f, disk %.0f)/3 = %.0f MiB/s  ratio %.2f (goal >= 0.8); TLS over TCP %.0f MiB/s, bound with it %.0f, ratio %.2f",
		med["cluster_write"], med["tcp_write"], med["disk_write"], writeBound, med["cluster_write"]/writeBound,
		med["tls_write"], min(med["tls_write"], med["disk_write"])/3, med["cluster_write"]/(min(med["tls_write"], med["disk_write"])/3))
}

// diskSeqWrite writes n bytes sequentially to path and fsyncs: MiB/s.
func diskSeqWrite(t *testing.T, path string, n int64) float64 {
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(rand.Uint32())
	}
	start := time.Now()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for w := int64(0); w < n; w += int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	f.Sync()
	r := float64(n) / time.Since(start).Seconds() / (1 << 20)
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	f.Close()
	os.Remove(path)
	return r
}

// xhostHelper runs a helper role of TestCrossHostBandwidth inside a
// namespace (called from TestMain); it returns the exit code.
func xhostHelper(role string) int {
	var err error
	switch role {
	case "tcp":
		err = xhostTCPServer(os.Getenv("SYSTEST_XHOST_LISTEN"))
	case "client":
		err = xhostClient()
	default:
		err = fmt.Errorf("unknown helper role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "xhost %s: %v\n", role, err)
		return 1
	}
	return 0
}

// xhostTCPServer serves plain TCP transfers: a request is one byte, 'r'
// (the server sends) or 'w' (the server receives, then answers one byte),
// and a big-endian uint64 length.
func xhostTCPServer(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// The same on the next port over TLS 1.3 with the cluster's member
	// certificate (the transport's TLS, without its framing).
	tb, err := client.TrustBesideTokenFile(os.Getenv("SYSTEST_XHOST_TOKEN_FILE"))
	if err != nil || tb == nil {
		return fmt.Errorf("cluster trust: %v", err)
	}
	scfg, err := tb.ServerConfig()
	if err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	p, _ := strconv.Atoi(port)
	tln, err := tls.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p+1)), scfg)
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr()) // the first line: serving
	go xhostServe(tln)
	return xhostServe(ln)
}

func xhostServe(ln net.Listener) error {
	buf := make([]byte, 1<<20)
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer conn.Close()
			b := make([]byte, len(buf))
			var hdr [9]byte
			if _, err := io.ReadFull(conn, hdr[:]); err != nil {
				return
			}
			n := int64(binary.BigEndian.Uint64(hdr[1:]))
			switch hdr[0] {
			case 'r':
				for left := n; left > 0; {
					k := min(left, int64(len(b)))
					if _, err := conn.Write(b[:k]); err != nil {
						return
					}
					left -= k
				}
			case 'w':
				if _, err := io.CopyBuffer(io.Discard, io.LimitReader(conn, n), b); err == nil {
					conn.Write([]byte{1})
				}
			}
		}()
	}
}

// xhostTCP moves n bytes in total over conns connections per server at
// once: MiB/s.
func xhostTCP(servers []string, op byte, n int64, tcfg *tls.Config, conns int) (float64, error) {
	per := n / int64(len(servers)*conns)
	start := time.Now()
	var g errgroup.Group
	for i := range len(servers) * conns {
		s := servers[i%len(servers)]
		g.Go(func() error {
			var conn net.Conn
			var err error
			if tcfg != nil {
				host, port, _ := net.SplitHostPort(s)
				p, _ := strconv.Atoi(port)
				conn, err = tls.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(p+1)), tcfg)
			} else {
				conn, err = net.Dial("tcp", s)
			}
			if err != nil {
				return err
			}
			defer conn.Close()
			var hdr [9]byte
			hdr[0] = op
			binary.BigEndian.PutUint64(hdr[1:], uint64(per))
			if _, err := conn.Write(hdr[:]); err != nil {
				return err
			}
			b := make([]byte, 1<<20)
			if op == 'r' {
				_, err = io.CopyBuffer(io.Discard, io.LimitReader(conn, per), b)
				return err
			}
			for left := per; left > 0; {
				k := min(left, int64(len(b)))
				if _, err := conn.Write(b[:k]); err != nil {
					return err
				}
				left -= k
			}
			_, err = io.ReadFull(conn, b[:1])
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return float64(per*int64(len(servers)*conns)) / time.Since(start).Seconds() / (1 << 20), nil
}

// procCPU is the CPU time (user + system, seconds) the processes pids
// used so far (nil: this process).
func procCPU(pids []string) float64 {
	if pids == nil {
		pids = []string{"self"}
	}
	var ticks float64
	for _, p := range pids {
		b, err := os.ReadFile("/proc/" + p + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command name (which may hold spaces): state is
		// the first, utime the 12th, stime the 13th.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 12 {
			u, _ := strconv.ParseFloat(f[11], 64)
			s, _ := strconv.ParseFloat(f[12], 64)
			ticks += u + s
		}
	}
	return ticks / 100 // USER_HZ
}

// xhostProfile writes a CPU profile of this process, until the returned
// function is called, to NAME.pprof in the directory SYSTEST_XHOST_PROFILE
// (FFKIT_BENCH_CPUPROFILE of the test; unset: no profile).
func xhostProfile(name string) func() {
	dir := os.Getenv("SYSTEST_XHOST_PROFILE")
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}

// xhostClient is the client host's side: rounds of plain TCP reads and
// writes and cluster chunk writes and reads, alternating, each result on
// a line "XHOST NAME MiB/s".
func xhostClient() error {
	ctx := context.Background()
	servers := strings.Split(os.Getenv("SYSTEST_XHOST_SERVERS"), ",")
	mb, _ := strconv.Atoi(os.Getenv("SYSTEST_XHOST_MB"))
	rounds, _ := strconv.Atoi(os.Getenv("SYSTEST_XHOST_ROUNDS"))
	tcpPids := strings.Split(os.Getenv("SYSTEST_XHOST_TCP_PIDS"), ",")
	storPids := strings.Split(os.Getenv("SYSTEST_XHOST_STORAGE_PIDS"), ",")
	tokenFile := os.Getenv("SYSTEST_XHOST_TOKEN_FILE")
	token, err := client.ReadTokenFile(tokenFile)
	if err != nil {
		return err
	}
	tb, err := client.TrustBesideTokenFile(tokenFile)
	if err != nil {
		return err
	}
	cl, err := client.Dial(ctx, strings.Split(os.Getenv("SYSTEST_XHOST_MGMTD"), ","), client.Options{Token: token, Trust: tb, NoLocalReads: true})
	if err != nil {
		return err
	}
	defer cl.Close()
	const chunk = 4 << 20
	size := int64(mb) << 20
	nChunks := int(size / chunk)
	chains := cl.Chains()
	payload := make([]byte, chunk)
	for i := range payload {
		payload[i] = byte(rand.Uint32())
	}
	mibs := func(start time.Time) float64 { return float64(nChunks*chunk) / time.Since(start).Seconds() / (1 << 20) }
	write := func(inode uint64) (float64, error) {
		start := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := 0; i < nChunks; i++ {
			g.Go(func() error {
				return cl.WriteChunk(gctx, chains[i%len(chains)], client.ChunkID{Inode: inode, Index: uint64(i)}, 0, payload)
			})
		}
		err := g.Wait()
		return mibs(start), err
	}
	bufs := make(chan []byte, 8)
	for i := 0; i < 8; i++ {
		bufs <- make([]byte, chunk)
	}
	var mu sync.Mutex
	read := func(inode uint64) (float64, error) {
		start := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for i := 0; i < nChunks; i++ {
			g.Go(func() error {
				buf := <-bufs
				defer func() { bufs <- buf }()
				rd := []client.ChunkRead{{Chain: chains[i%len(chains)], Chunk: client.ChunkID{Inode: inode, Index: uint64(i)}, Buf: buf}}
				if err := cl.ReadChunks(gctx, rd); err != nil {
					return err
				}
				if rd[0].N != chunk {
					return fmt.Errorf("chunk %d: %d bytes", i, rd[0].N)
				}
				return nil
			})
		}
		err := g.Wait()
		return mibs(start), err
	}
	report := func(name string, v float64, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("XHOST %s %.1f\n", name, v)
		return nil
	}
	// Warm up: connections, and the data the first read round reads.
	if _, err := write(7000); err != nil {
		return err
	}
	for r := 0; r < rounds; r++ {
		order := []string{"tcp_write", "tcp_write_4c", "tls_write", "tls_write_4c", "cluster_write",
			"tcp_read", "tcp_read_4c", "tls_read", "tls_read_4c", "cluster_read"}
		if r%2 == 1 {
			slices.Reverse(order[:5])
			slices.Reverse(order[5:])
		}
		for _, m := range order {
			if only := os.Getenv("SYSTEST_XHOST_ONLY"); only != "" && !slices.Contains(strings.Split(only, ","), m) {
				continue
			}
			var v float64
			var err error
			var tcfg *tls.Config
			if strings.HasPrefix(m, "tls_") {
				tcfg = tb.ClientConfig()
			}
			conns := 1
			if strings.HasSuffix(m, "_4c") {
				conns = 4
			}
			stop := xhostProfile(fmt.Sprintf("client-%s-r%d", m, r))
			spids := tcpPids
			if strings.HasPrefix(m, "cluster_") {
				spids = storPids
			}
			c0, s0 := procCPU(nil), procCPU(spids)
			switch m {
			case "cluster_write":
				v, err = write(uint64(7100 + r))
			case "cluster_read":
				v, err = read(uint64(7100 + r))
			default:
				op := byte('r')
				if strings.Contains(m, "_write") {
					op = 'w'
				}
				v, err = xhostTCP(servers, op, size, tcfg, conns)
			}
			stop()
			if err == nil {
				gib := float64(size) / (1 << 30)
				fmt.Printf("XHOSTCPU %s %.3f %.3f\n", m, (procCPU(nil)-c0)/gib, (procCPU(spids)-s0)/gib)
			}
			if err := report(m, v, err); err != nil {
				return err
			}
		}
	}
	return nil
}
