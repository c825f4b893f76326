package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestFioArgs(t *testing.T) {
	a, err := FioJob{Filenames: []string{"/d/a:b"}, RW: "randread", BlockSize: 4096, IODepth: 64, Direct: true,
		Runtime: 1500 * time.Millisecond, RampTime: 200 * time.Millisecond}.Args("io_uring")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--output-format=json", "--ioengine=io_uring", "--rw=randread", "--bs=4096",
		"--iodepth=64", "--direct=1", "--time_based", "--runtime=1500ms", "--ramp_time=200ms", `--filename=/d/a\:b`} {
		if !slices.Contains(a, want) {
			t.Errorf("args %v lack %s", a, want)
		}
	}
	// several files in one job: fio's ':' list, each name escaped
	a, err = FioJob{Filenames: []string{"/d/x", "/d/a:b"}, SpreadFiles: true, RW: "randread", BlockSize: 4096}.Args("io_uring")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(a, `--filename=/d/x:/d/a\:b`) || !slices.Contains(a, "--file_service_type=random") || slices.Contains(a, "--name=ffkit1") {
		t.Errorf("spread job args %v", a)
	}
	if _, err := (FioJob{RW: "read"}).Args("psync"); !errors.Is(err, ErrBadOptions) {
		t.Errorf("job without block size: %v", err)
	}
}

func TestParseFio(t *testing.T) {
	out := []byte(`fio: some warning
{"fio version":"fio-3.33","jobs":[{"jobname":"x","error":0,
 "read":{"io_bytes":1048576,"bw_bytes":2097152,"iops":512.5,"clat_ns":{"min":1000,"max":90000,"mean":5000,"N":256,
   "percentile":{"50.000000":4000,"90.000000":8000,"99.000000":20000}}},
 "write":{"io_bytes":0,"bw_bytes":0,"iops":0,"clat_ns":{"N":0}}}]}`)
	r, err := ParseFio(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.Read.MiBPerSec != 2 || r.Read.IOPS != 512.5 || r.Read.Bytes != 1<<20 || r.Version != "fio-3.33" {
		t.Errorf("%+v", r.Read)
	}
	l := r.Side("randread").Latency
	if l.P50US != 4 || l.P90US != 8 || l.P99US != 20 || l.MaxUS != 90 || l.MinUS != 1 || l.Count != 256 {
		t.Errorf("latency %+v", l)
	}
	for _, bad := range []string{"", "garbage", `{"jobs":[]}`, `{"jobs":[{"jobname":"x","error":5}]}`} {
		if _, err := ParseFio([]byte(bad)); !errors.Is(err, ErrFio) {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}

// TestRunFio runs the real fio on a small file when it is installed.
func TestRunFio(t *testing.T) {
	if !FioAvailable() {
		t.Skip("fio is not installed (scripts/setup.sh installs it)")
	}
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := RunFio(context.Background(), FioJob{Filenames: []string{p}, RW: "randread", BlockSize: 4096, IODepth: 4,
		Runtime: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Read.IOPS <= 0 || r.Read.Bytes <= 0 || r.Read.Latency.P50US <= 0 || r.Engine == "" {
		t.Errorf("fio result %+v", r)
	}
	dir := t.TempDir()
	w, err := RunFio(context.Background(), FioJob{Directory: dir, RW: "write", BlockSize: 1 << 20, Size: 2 << 20, NumJobs: 2, EndFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if w.Write.Bytes != 4<<20 {
		t.Errorf("fio wrote %d bytes, want 4 MiB (2 jobs x 2 MiB)", w.Write.Bytes)
	}
}
