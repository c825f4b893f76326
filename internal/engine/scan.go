package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/scan"
)

// scanOp runs a scan job whose output is one uncompressed Arrow IPC file in
// shared memory (tmpfs), and passes its descriptor to Python, which maps it
// and gets a pyarrow Table without copying or decoding. The file is unlinked
// before the reply, so its memory lives exactly as long as Python maps it.
func scanOp(ctx context.Context, s *Server, q *scanRequest, in input) (reply, error) {
	closeFDs(in.fds)
	base := "/dev/shm"
	if st, err := os.Stat(base); err != nil || !st.IsDir() || unix.Access(base, unix.W_OK) != nil {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "ffkit-scan-")
	if err != nil {
		return reply{}, fmt.Errorf("engine: scan: %w", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "out.arrow")
	sum, err := scan.Run(ctx, scan.Job{Inputs: q.Inputs, Columns: q.Columns, Where: q.Where, SQL: q.SQL,
		GroupBy: q.GroupBy, Aggs: q.Aggs, Workers: q.Workers, Output: out, Format: "arrow"})
	if err != nil {
		return reply{}, err
	}
	f, err := os.Open(out)
	if err != nil {
		return reply{}, fmt.Errorf("engine: scan output: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return reply{}, fmt.Errorf("engine: scan output: %w", err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return reply{}, fmt.Errorf("engine: scan output: %w", err)
	}
	return reply{header: scanReply{okField: ok(), Size: st.Size(), Summary: sum}, fds: []int{fd}}, nil
}
