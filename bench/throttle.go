package bench

import (
	"context"
	"time"

	"github.com/ffkit/ffkit/fs"
)

// ThrottledFS wraps an fs.FS so that every read and write costs time on a
// Clock: PerOp plus bytes / BytesPerSec. With a ManualClock the cost is
// added to the clock (a device of exactly that rate, shared by all
// callers), which is how the measurement core is tested without wall-clock
// assertions; with Wall it sleeps, a crude rate limiter for demos.
//
// It is a fault-injection style wrapper: the data still comes from the
// wrapped FS, unchanged.
type ThrottledFS struct {
	fs.FS
	Clock       Clock
	BytesPerSec float64       // 0: no per-byte cost
	PerOp       time.Duration // fixed cost of each read, batch request or write
}

var _ fs.FS = (*ThrottledFS)(nil)

// NewThrottledFS wraps inner.
func NewThrottledFS(inner fs.FS, clk Clock, bytesPerSec float64, perOp time.Duration) *ThrottledFS {
	return &ThrottledFS{FS: inner, Clock: clk, BytesPerSec: bytesPerSec, PerOp: perOp}
}

func (t *ThrottledFS) cost(n int) time.Duration {
	d := t.PerOp
	if t.BytesPerSec > 0 {
		d += time.Duration(float64(n) / t.BytesPerSec * float64(time.Second))
	}
	return d
}

// Open opens a file whose reads are throttled.
func (t *ThrottledFS) Open(ctx context.Context, name string, opts fs.OpenOptions) (fs.File, error) {
	f, err := t.FS.Open(ctx, name, opts)
	if err != nil {
		return nil, err
	}
	return &throttledFile{File: f, t: t}, nil
}

// Create starts a file whose writes are throttled.
func (t *ThrottledFS) Create(ctx context.Context, name string) (fs.Writer, error) {
	w, err := t.FS.Create(ctx, name)
	if err != nil {
		return nil, err
	}
	return &throttledWriter{Writer: w, t: t}, nil
}

// ReadBatch reads through the wrapped FS and charges every request.
func (t *ThrottledFS) ReadBatch(ctx context.Context, reqs []fs.ReadRequest) error {
	inner := make([]fs.ReadRequest, len(reqs))
	var total time.Duration
	for i, r := range reqs {
		inner[i] = r
		if tf, ok := r.File.(*throttledFile); ok {
			inner[i].File = tf.File
		}
		total += t.cost(len(r.Buf))
	}
	err := t.FS.ReadBatch(ctx, inner)
	t.Clock.Sleep(total)
	return err
}

func (t *ThrottledFS) String() string { return "throttled " + t.FS.String() }

type throttledFile struct {
	fs.File
	t *ThrottledFS
}

func (f *throttledFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.t.Clock.Sleep(f.t.cost(n))
	return n, err
}

type throttledWriter struct {
	fs.Writer
	t *ThrottledFS
}

func (w *throttledWriter) Write(p []byte) (int, error) {
	n, err := w.Writer.Write(p)
	w.t.Clock.Sleep(w.t.cost(n))
	return n, err
}
