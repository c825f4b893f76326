package scan

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/localfs"
)

// remoteFS is the local file system under a URL scheme, so that jobs take
// the paths a cluster (ffkit://) takes: URL inputs and outputs, coalesced
// prefetching through ReadBatch, inputs copied locally for DuckDB, and
// creates that need the directory to exist.
type remoteFS struct {
	*localfs.FS
	batches atomic.Int64
}

func (r *remoteFS) String() string { return "remotetest://h" }

// Create refuses a file whose directory does not exist, as the cluster's
// metadata service does (the local file system makes the parents).
func (r *remoteFS) Create(ctx context.Context, name string) (fs.Writer, error) {
	if st, err := r.FS.Stat(ctx, path.Dir(name)); err != nil || !st.IsDir {
		return nil, fmt.Errorf("remotetest: create %s: parent directory: %w", name, fs.ErrNotExist)
	}
	return r.FS.Create(ctx, name)
}

func (r *remoteFS) ReadBatch(ctx context.Context, reqs []fs.ReadRequest) error {
	r.batches.Add(1)
	return r.FS.ReadBatch(ctx, reqs)
}

var remote = &remoteFS{FS: localfs.New()}

func init() {
	fs.RegisterScheme("remotetest", func(ctx context.Context, authority string) (fs.FS, error) { return remote, nil })
}

func TestJobsOnURLPaths(t *testing.T) {
	db := openDuck(t)
	in := inputs(t, 8000, 1000)["duckdb"]
	url := func(p string) string { return "remotetest://h" + p }
	dir := t.TempDir()
	before := remote.batches.Load()

	out := filepath.Join(dir, "filtered")
	s, err := Run(bg, Job{Inputs: []string{url(in)}, Where: "k < 30", Columns: "id, name, x", PartitionBy: "rows", Partitions: 2, Output: url(out)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range s.OutputFiles {
		if !strings.HasPrefix(f, "remotetest://h/") {
			t.Fatalf("output file %s is not a URL", f)
		}
	}
	sameAsDuck(t, db, filepath.Join(out, "*.parquet"), fmt.Sprintf("SELECT id, name, x FROM read_parquet(%s) WHERE k < 30", sqlString(in)))
	if remote.batches.Load() == before {
		t.Fatal("remote reads did not go through coalesced ReadBatch")
	}

	out = filepath.Join(dir, "sql")
	if _, err := Run(bg, Job{Inputs: []string{url(in)}, SQL: "SELECT k, count(*) AS n FROM input GROUP BY k", PartitionBy: "hash:k", Partitions: 3, Output: url(out)}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, filepath.Join(out, "*.parquet"), fmt.Sprintf("SELECT k, count(*) AS n FROM read_parquet(%s) GROUP BY k", sqlString(in)))

	one := filepath.Join(dir, "agg.parquet")
	if _, err := Run(bg, Job{Inputs: []string{url(filepath.Dir(in)) + "/*.parquet"}, GroupBy: []string{"flag"}, Aggs: "count(*), max(id)", Output: url(one)}); err != nil {
		t.Fatal(err)
	}
	sameAsDuck(t, db, one, fmt.Sprintf("SELECT flag, count(*), max(id) FROM read_parquet(%s) GROUP BY flag", sqlString(filepath.Join(filepath.Dir(in), "*.parquet"))))
}
