package systest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/internal/testbin"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/proto"
)

var ffkitBin string

func TestMain(m *testing.M) {
	if os.Getenv("FFKIT_ATTACK") != "" {
		// This binary re-run as another user (security_test.go): no build.
		os.Exit(m.Run())
	}
	if role := os.Getenv("SYSTEST_XHOST_HELPER"); role != "" {
		// This binary re-run inside a namespace (xhost_bench_test.go).
		os.Exit(xhostHelper(role))
	}
	var err error
	ffkitBin, err = testbin.Get()
	if err != nil {
		fmt.Fprintf(os.Stderr, "systest: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

const (
	hb          = 100 * time.Millisecond
	failTimeout = time.Second
)

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

func (p *proc) kill() {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// cluster is mgmtd + storage processes; nodes 1..n, 2 targets each.
type cluster struct {
	t         testing.TB
	dir       string
	tokenFile string
	token     string
	faults    string
	mgmtdAddr string
	mgmtd     *proc
	storage   map[int]*proc
	n         int
	cl        *client.Client
}

func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), storage: map[int]*proc{}, n: n}
	c.tokenFile = filepath.Join(c.dir, "token")
	c.token = fmt.Sprintf("systest-token-%d", rand.Uint64())
	if err := os.WriteFile(c.tokenFile, []byte(c.token), 0o600); err != nil {
		t.Fatal(err)
	}
	c.faults = filepath.Join(c.dir, "faults")
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(c.dir, "config"))
	t.Cleanup(c.stop)
	c.startMgmtd()
	for i := 1; i <= n; i++ {
		c.startStorage(i)
	}
	c.waitServing(20 * time.Second)
	var err error
	c.cl, err = client.Dial(context.Background(), []string{c.mgmtdAddr}, client.Options{Token: c.token,
		RetryTimeout: 30 * time.Second, RequestTimeout: 2 * time.Second, RefreshInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *cluster) stop() {
	if c.cl != nil {
		c.cl.Close()
	}
	for _, p := range c.storage {
		p.kill()
	}
	c.mgmtd.kill()
	if c.t.Failed() {
		for _, name := range []string{"mgmtd.log", "storage-1.log", "storage-2.log", "storage-3.log"} {
			b, _ := os.ReadFile(filepath.Join(c.dir, name))
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			c.t.Logf("---- %s (tail) ----\n%s", name, b)
		}
	}
}

// start runs ffkit with args, returning the process and its first stdout line.
func (c *cluster) start(name string, args ...string) (*proc, string) {
	c.t.Helper()
	logf, err := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(ffkitBin, args...)
	cmd.Env = append(os.Environ(), "FFKIT_FAULT_FILE="+c.faults, "XDG_CONFIG_HOME="+filepath.Join(c.dir, "config"))
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), log: logf}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
		}
		cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	select {
	case l, ok := <-lines:
		if !ok {
			<-p.done
			b, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
			c.t.Fatalf("%s exited before serving:\n%s", name, b)
		}
		return p, l
	case <-time.After(30 * time.Second):
		p.kill()
		c.t.Fatalf("%s did not start", name)
	}
	return nil, ""
}

func (c *cluster) startMgmtd() {
	listen := "127.0.0.1:0"
	if c.mgmtdAddr != "" {
		listen = c.mgmtdAddr
	}
	p, line := c.start("mgmtd", "fs", "mgmtd", "--dir", filepath.Join(c.dir, "mgmtd"), "--listen", listen,
		"--token-file", c.tokenFile, "--replicas", "3", "--expect-targets", fmt.Sprint(2*c.n),
		"--heartbeat", hb.String(), "--fail-timeout", failTimeout.String(), "--chunk-size", "1MiB")
	c.mgmtd = p
	c.mgmtdAddr = strings.TrimPrefix(line, "ffkit://")
}

func (c *cluster) startStorage(i int) {
	args := []string{"fs", "storage", "--mgmtd", "ffkit://" + c.mgmtdAddr, "--node", fmt.Sprint(i), "--token-file", c.tokenFile,
		"--heartbeat", hb.String(), "--fail-timeout", failTimeout.String()}
	for j := 1; j <= 2; j++ {
		args = append(args, "--target", c.targetDir(i, j))
	}
	c.storage[i], _ = c.start(fmt.Sprintf("storage-%d", i), args...)
}

func (c *cluster) targetDir(node, j int) string {
	return filepath.Join(c.dir, fmt.Sprintf("storage-%d", node), fmt.Sprintf("target-%d", j))
}

func (c *cluster) killStorage(i int) {
	c.storage[i].kill()
	delete(c.storage, i)
}

func (c *cluster) routing() *proto.Routing {
	c.t.Helper()
	if c.cl != nil {
		c.cl.Refresh(context.Background())
		return c.cl.Routing()
	}
	cl, err := client.Dial(context.Background(), []string{c.mgmtdAddr}, client.Options{Token: c.token, RequestTimeout: time.Second})
	if err != nil {
		return &proto.Routing{}
	}
	defer cl.Close()
	return cl.Routing()
}

func allServing(r *proto.Routing, nodes int) bool {
	if len(r.Chains) == 0 {
		return false
	}
	n := 0
	for _, ch := range r.Chains {
		for _, t := range ch.Targets {
			if t.State != proto.Serving {
				return false
			}
			n++
		}
	}
	return n == 2*nodes
}

func (c *cluster) waitServing(d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		r := c.routing()
		if allServing(r, c.n) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster not all serving after %v: %+v", d, r.Chains)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitChain waits until cond holds for chain id.
func (c *cluster) waitChain(id proto.ChainID, d time.Duration, what string, cond func(*proto.Chain) bool) *proto.Chain {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		r := c.routing()
		if ch := r.Chain(id); ch != nil && cond(ch) {
			return ch
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("chain %d: %s: not reached after %v: %s", id, what, d, r.Chain(id))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// model tracks the acknowledged content of chunks (one writer per chunk).
type model struct {
	mu     sync.Mutex
	chunks map[client.ChunkID][]byte // guarded by mu
	chain  map[client.ChunkID]client.ChainID
	writes map[client.ChunkID]int // acknowledged writes per chunk
}

func newModel() *model {
	return &model{chunks: map[client.ChunkID][]byte{}, chain: map[client.ChunkID]client.ChainID{}, writes: map[client.ChunkID]int{}}
}

func (m *model) apply(chain client.ChainID, id client.ChunkID, off int, data []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.chunks[id]
	if len(b) < off+len(data) {
		b = append(b, make([]byte, off+len(data)-len(b))...)
	}
	copy(b[off:], data)
	m.chunks[id] = b
	m.chain[id] = chain
	m.writes[id]++
}

// writer streams writes to its own chunks until stop; every write must
// eventually be acknowledged (the client retries through reconfiguration).
func (c *cluster) writer(ctx context.Context, m *model, inode uint64, seed uint64, errs chan<- error, count *int64, mu *sync.Mutex) {
	rng := rand.New(rand.NewPCG(seed, inode))
	chains := c.cl.Chains()
	for i := 0; ctx.Err() == nil; i++ {
		id := client.ChunkID{Inode: inode, Index: uint64(i % 3)}
		chain := chains[int(inode+uint64(i%3))%len(chains)]
		off := rng.IntN(96 << 10)
		data := make([]byte, rng.IntN(32<<10)+1)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		if err := c.cl.WriteChunk(context.Background(), chain, id, int64(off), data); err != nil {
			errs <- fmt.Errorf("write %d of inode %d: %w", i, inode, err)
			return
		}
		m.apply(chain, id, off, data)
		mu.Lock()
		*count++
		mu.Unlock()
	}
}

// writers runs k writers until the returned stop is called, which
// returns the number of acknowledged writes.
func (c *cluster) writers(m *model, k int) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, k)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var n int64
	for w := 0; w < k; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c.writer(ctx, m, uint64(100+w), 42, errs, &n, &mu)
		}(w)
	}
	return func() int64 {
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			c.t.Fatal(err)
		}
		return n
	}
}

// progress waits until at least k more writes were acknowledged.
func waitWrites(t *testing.T, m *model, k int, d time.Duration) {
	t.Helper()
	count := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		n := 0
		for _, w := range m.writes {
			n += w
		}
		return n
	}
	start := count()
	deadline := time.Now().Add(d)
	for count() < start+k {
		if time.Now().After(deadline) {
			t.Fatalf("writes stalled: %d acknowledged in %v (wanted %d)", count()-start, d, k)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// check verifies the invariants: every acknowledged write readable through
// the client; every serving replica of every chunk identical (version,
// checksum, length, bytes); nothing pending. With exactVersions, each
// chunk's version equals its acknowledged writes (no write applied twice).
func (c *cluster) check(m *model, exactVersions bool) {
	c.t.Helper()
	ctx := context.Background()
	m.mu.Lock()
	defer m.mu.Unlock()
	var reads []client.ChunkRead
	for id, b := range m.chunks {
		reads = append(reads, client.ChunkRead{Chain: m.chain[id], Chunk: id, Buf: make([]byte, len(b)+100)})
	}
	if err := c.cl.ReadChunks(ctx, reads); err != nil {
		c.t.Fatalf("read back: %v", err)
	}
	for _, rd := range reads {
		want := append(append([]byte(nil), m.chunks[rd.Chunk]...), make([]byte, 100)...)
		if !bytes.Equal(rd.Buf, want) || rd.N != len(m.chunks[rd.Chunk]) {
			c.t.Fatalf("chunk %v: read back differs from acknowledged writes (n=%d want %d)", rd.Chunk, rd.N, len(m.chunks[rd.Chunk]))
		}
	}
	// Replica comparison, retried briefly: a write's tail may lag by a tick.
	var lastErr error
	for attempt := 0; attempt < 50; attempt++ {
		if lastErr = c.compareReplicas(m, exactVersions); lastErr == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatal(lastErr)
}

func (c *cluster) compareReplicas(m *model, exactVersions bool) error {
	ctx := context.Background()
	r := c.routing()
	inodes := map[uint64]bool{}
	for id := range m.chunks {
		inodes[id.Inode] = true
	}
	for _, ch := range r.Chains {
		for inode := range inodes {
			var ref []proto.ChunkMeta
			for i, t := range ch.Readable() {
				metas, err := c.cl.ReplicaChunks(ctx, ch.ID, t.ID, inode)
				if err != nil {
					return fmt.Errorf("chain %d target %d inode %d: %w", ch.ID, t.ID, inode, err)
				}
				if i == 0 {
					ref = metas
					continue
				}
				if fmt.Sprint(metas) != fmt.Sprint(ref) {
					return fmt.Errorf("chain %d: replicas differ for inode %d: target %d %v vs target %d %v", ch.ID, inode, ch.Targets[0].ID, ref, t.ID, metas)
				}
			}
			for _, meta := range ref {
				want, ok := m.chunks[meta.Chunk]
				if !ok || m.chain[meta.Chunk] != ch.ID {
					continue
				}
				if exactVersions && meta.CommitVer != uint64(m.writes[meta.Chunk]) {
					return fmt.Errorf("chunk %v: version %d after %d acknowledged writes (a write applied twice or lost)", meta.Chunk, meta.CommitVer, m.writes[meta.Chunk])
				}
				for _, t := range ch.Readable() {
					got, err := c.cl.ReadReplica(ctx, ch.ID, t.ID, meta.Chunk, 0, int64(len(want))+10)
					if err != nil {
						return fmt.Errorf("chunk %v on target %d: %w", meta.Chunk, t.ID, err)
					}
					if !bytes.Equal(got, want) {
						return fmt.Errorf("chunk %v on target %d: bytes differ from acknowledged writes", meta.Chunk, t.ID)
					}
				}
			}
		}
	}
	return nil
}

func isUnavailable(err error) bool {
	return err != nil && (errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "unavailable") || strings.Contains(err.Error(), "gave up"))
}
