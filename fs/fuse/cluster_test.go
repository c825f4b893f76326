package fuse_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ffkit/ffkit/internal/testbin"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/clusterfs"
	"github.com/ffkit/ffkit/fs/fuse"
	"github.com/ffkit/ffkit/fs/fuse/fusetest"
)

// ffkitBinary builds cmd/ffkit once (the cluster runs as real processes).
func ffkitBinary(t *testing.T) string {
	t.Helper()
	return testbin.Path(t)
}

// testCluster is `ffkit fs up` started by a test: 3 storage processes,
// 3 replicas, short failure detection.
type testCluster struct {
	url, authority string
	storagePIDs    []int
	metaPIDs       []int
	fs             *clusterfs.FS
}

func startCluster(t *testing.T) *testCluster {
	t.Helper()
	needFUSE(t)
	bin := ffkitBinary(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "fs", "up", "--dir", dir, "--storage", "3", "--replicas", "3",
		"--targets-per-storage", "1", "--chunk-size", "1MiB", "--heartbeat", "200ms", "--fail-timeout", "1500ms")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	c := &testCluster{}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(90 * time.Second)
	for c.url == "" || len(c.storagePIDs) < 3 || len(c.metaPIDs) == 0 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("ffkit fs up exited before it was ready (logs in %s/logs)", dir)
			}
			if strings.HasPrefix(l, "ffkit://") {
				c.url = l
				continue
			}
			if f := strings.Fields(l); len(f) == 3 && f[0] == "pid" && strings.HasPrefix(f[1], "storage") {
				pid, _ := strconv.Atoi(f[2])
				c.storagePIDs = append(c.storagePIDs, pid)
			}
			if f := strings.Fields(l); len(f) == 3 && f[0] == "pid" && strings.HasPrefix(f[1], "meta") {
				pid, _ := strconv.Atoi(f[2])
				c.metaPIDs = append(c.metaPIDs, pid)
			}
		case <-timeout:
			t.Fatalf("ffkit fs up not ready in 90s (logs in %s/logs)", dir)
		}
	}
	c.authority = strings.TrimPrefix(c.url, "ffkit://")
	tok, err := client.ReadTokenFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.fs, err = clusterfs.Open(ctx, c.authority, clusterfs.Options{Token: tok, RetryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("connect to %s: %v", c.url, err)
	}
	t.Cleanup(func() { c.fs.Close() })
	return c
}

func TestPOSIXCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := startCluster(t)
	ctx := context.Background()
	if err := c.fs.MkdirAll(ctx, "/posix"); err != nil {
		t.Fatal(err)
	}
	mnt, _ := mount(t, c.fs, "/posix", fuse.Options{})
	fusetest.RunPOSIX(t, mnt, c.fs, "/posix")
	t.Run("RemoveTreeAtRootMount", func(t *testing.T) { removeTreeAtRootMount(t, c) })
	// Last, on the same cluster: it kills the metadata servers.
	t.Run("CreatesSurviveMetaRestart", func(t *testing.T) { createsSurviveMetaRestart(t, c) })
}

// TestKillStorageDuringFio: fio writes a file with checksums through the
// mount, then verifies it by reading it back while a storage process is
// killed: reads fail over to another replica and fio finds every block good.
func TestKillStorageDuringFio(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed")
	}
	c := startCluster(t)
	mnt, srv := mount(t, c.fs, "/", fuse.Options{ReadAhead: -1}) // every read goes to storage
	job := []string{"--name=killtest", "--directory=" + mnt, "--rw=write", "--bs=128k", "--size=48M",
		"--verify=crc32c", "--verify_state_save=0", "--ioengine=psync", "--direct=1", "--output-format=terse"}
	if out, err := exec.Command("fio", append(job, "--do_verify=0")...).CombinedOutput(); err != nil {
		t.Fatalf("fio write: %v\n%s", err, out)
	}
	// Read it back read-only (the mount's batched read path), verifying
	// every block against the checksums written, at ~24 MiB/s: ~2 s of reads.
	read := append([]string{}, job...)
	read[2] = "--rw=read"
	verify := exec.Command("fio", append(read, "--rate=24m")...)
	var out strings.Builder
	verify.Stdout, verify.Stderr = &out, &out
	if err := verify.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	victim := c.storagePIDs[1]
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatalf("kill storage %d: %v", victim, err)
	}
	if err := verify.Wait(); err != nil {
		t.Fatalf("fio verify while storage %d was killed: %v\n%s", victim, err, out.String())
	}
	if strings.Contains(out.String(), "verify:") || strings.Contains(out.String(), "bad") {
		t.Fatalf("fio reported bad data:\n%s", out.String())
	}
	st := srv.Stats()
	if st.Batches == 0 || st.ReadBytes < 48<<20 {
		t.Errorf("the verify did not read through the batched path: %+v", st)
	}
	t.Logf("killed storage pid %d during the verify; mount stats %+v", victim, st)
}

// TestParquetPyarrowCluster: pyarrow writes a Parquet file through a
// mount of the cluster and reads it back (whole, and one row group), and
// the native client sees the same file.
func TestParquetPyarrowCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	if err := exec.Command("python3", "-c", "import pyarrow.parquet").Run(); err != nil {
		t.Skip("pyarrow is not installed (scripts/setup.sh installs it): skipping the Parquet test")
	}
	c := startCluster(t)
	mnt, _ := mount(t, c.fs, "/", fuse.Options{})
	script := `
import sys, pyarrow as pa, pyarrow.parquet as pq
mnt = sys.argv[1]
n = 300000
t = pa.table({"id": pa.array(range(n), pa.int64()), "name": pa.array(["row%d" % i for i in range(n)])})
pq.write_table(t, mnt + "/t.parquet", row_group_size=100000)
assert pq.read_table(mnt + "/t.parquet").equals(t), "read back through the mount differs"
pf = pq.ParquetFile(mnt + "/t.parquet")
assert pf.metadata.num_row_groups == 3, pf.metadata.num_row_groups
assert pf.read_row_group(1).column("id")[0].as_py() == 100000
print("ok")
`
	out, err := exec.Command("python3", "-c", script, mnt).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("pyarrow through the cluster mount: %v\n%s", err, out)
	}
	st, err := os.Stat(filepath.Join(mnt, "t.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	got := readClusterFile(t, c, "/t.parquet")
	if int64(len(got)) != st.Size() || string(got[:4]) != "PAR1" || string(got[len(got)-4:]) != "PAR1" {
		t.Fatalf("native read of the Parquet file: %d bytes (mount says %d), magic %q...%q",
			len(got), st.Size(), got[:min(4, len(got))], got[max(0, len(got)-4):])
	}
}

func readClusterFile(t *testing.T, c *testCluster, name string) []byte {
	t.Helper()
	ctx := context.Background()
	f, err := c.fs.Open(ctx, name, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, f.Size())
	if err := c.fs.ReadBatch(ctx, []fs.ReadRequest{{File: f, Buf: buf}}); err != nil {
		t.Fatal(err)
	}
	return buf
}

// createsSurviveMetaRestart: creates a mount answered before they
// reached the metadata service (pipelined, see fs/fuse/pending.go) land
// even when every metadata server is killed right after they were
// answered: the mount's client retries them with their request ids until
// 'fs up' has restarted a server; fsync of the directory returns once
// they have, and then they are all there, seen by another client.
// A mount of the cluster's root ("/", as `fs mount URL/ MNT` makes it):
// rm -rf of a directory whose files the mount wrote removes it. The
// directory's path was spelled "//d" by the root and "/d" by the
// directory itself, so rmdir waited for none of the pipelined unlinks of
// its files and failed with ENOTEMPTY.
func removeTreeAtRootMount(t *testing.T, c *testCluster) {
	mnt, _ := mount(t, c.fs, "/", fuse.Options{AttrTimeout: time.Minute})
	for r := 0; r < 3; r++ {
		d := filepath.Join(mnt, fmt.Sprintf("rmtree%d", r))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 100; i++ {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d", i)), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.RemoveAll(d); err != nil {
			t.Fatalf("rm -rf through a mount of /: %v", err)
		}
		if _, err := c.fs.Stat(context.Background(), "/"+filepath.Base(d)); err == nil {
			t.Fatalf("%s still in the storage after rm -rf", d)
		}
	}
}

func createsSurviveMetaRestart(t *testing.T, c *testCluster) {
	ctx := context.Background()
	if err := c.fs.MkdirAll(ctx, "/cr/d"); err != nil {
		t.Fatal(err)
	}
	if len(c.metaPIDs) == 0 {
		t.Fatal("fs up named no metadata server")
	}
	mnt, srv := mount(t, c.fs, "/cr", fuse.Options{AttrTimeout: time.Minute})
	dir := filepath.Join(mnt, "d")
	if _, err := os.ReadDir(dir); err != nil { // the listing: every new name is known missing
		t.Fatal(err)
	}
	const n = 200
	for i := range n {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), os.O_CREATE|os.O_WRONLY, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 { // some are written too
			if _, err := f.Write([]byte("data")); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, pid := range c.metaPIDs {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if srv.Stats().CreatesAsync == 0 {
		t.Error("no create was answered early: the test tests nothing")
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil { // waits for every create to land
		t.Fatal(err)
	}
	d.Close()
	ents, err := c.fs.List(ctx, "/cr/d")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != n {
		t.Fatalf("after fsync of the directory another client lists %d files, want %d", len(ents), n)
	}
	for i, e := range ents {
		want := int64(0)
		if i%50 == 0 {
			want = 4
		}
		if e.Name != fmt.Sprintf("f%03d", i) || e.Size != want || !e.HasOwner || e.Perm != 0o640 {
			t.Errorf("entry %d: %+v, want f%03d of %d bytes, mode 0640", i, e, i, want)
		}
	}
}
