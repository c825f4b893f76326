package fstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"

	"github.com/ffkit/ffkit/fs"
)

// Churn is a metadata workload for fault tests (servers killed while it
// runs): Workers goroutines each make the directory Prefix+N and then, for
// i = 0, 1, ..., create f<i> in it, rename it to g<i>, and remove g<i>
// again when i is even, until the disruption is over. Every operation must
// take effect exactly once whatever retries and failovers happen
// underneath (a retried create must not fail with "exists", a retried
// rename or remove with "not found"), so at the end each directory holds
// exactly the odd-numbered g<i>.
type Churn struct {
	// Prefix names the workers' directories: Prefix+"0", Prefix+"1", ...
	// (an absolute path such as "/w").
	Prefix string
	// Workers is the number of goroutines. Default 3.
	Workers int
	// Create makes the file name. Nil: fs.FS.Create, write the name,
	// Commit; every surviving file is then checked to hold the name it was
	// created under.
	Create func(ctx context.Context, name string) error
}

// Run runs the workload on f while disrupt runs (disrupt kills servers,
// sleeping in between; it runs on the test's goroutine), stops the workers
// once disrupt returns, and fails t unless every operation took effect
// exactly once.
func (c Churn) Run(t testing.TB, f fs.FS, disrupt func()) {
	t.Helper()
	ctx := context.Background()
	workers := c.Workers
	if workers <= 0 {
		workers = 3
	}
	dir := func(w int) string { return fmt.Sprintf("%s%d", c.Prefix, w) }
	create := c.Create
	if create == nil {
		create = func(ctx context.Context, name string) error {
			w, err := f.Create(ctx, name)
			if err != nil {
				return err
			}
			defer w.Close()
			if _, err := w.Write([]byte(name)); err != nil {
				return err
			}
			return w.Commit()
		}
	}

	stop := make(chan struct{})
	done := make([]int, workers) // done[w]: iterations worker w finished
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := dir(w)
			if err := f.MkdirAll(ctx, d); err != nil {
				errs <- fmt.Errorf("mkdir %s: %w", d, err)
				return
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					done[w] = i
					return
				default:
				}
				a, b := fmt.Sprintf("%s/f%d", d, i), fmt.Sprintf("%s/g%d", d, i)
				if err := create(ctx, a); err != nil {
					errs <- fmt.Errorf("create %s: %w", a, err)
					return
				}
				if err := f.Rename(ctx, a, b); err != nil {
					errs <- fmt.Errorf("rename %s: %w", a, err)
					return
				}
				if i%2 == 0 {
					if err := f.Remove(ctx, b); err != nil {
						errs <- fmt.Errorf("remove %s: %w", b, err)
						return
					}
				}
			}
		}()
	}
	// Stop the workers even if disrupt ends the test (t.Fatal).
	stopped := false
	stopWorkers := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopWorkers()
	disrupt()
	stopWorkers()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	for w := range workers {
		d := dir(w)
		infos, err := f.List(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		var got, want []string
		for _, fi := range infos {
			got = append(got, fi.Name)
		}
		for i := 1; i < done[w]; i += 2 {
			want = append(want, fmt.Sprintf("g%d", i))
			if c.Create == nil {
				checkHolds(t, f, fmt.Sprintf("%s/g%d", d, i), fmt.Sprintf("%s/f%d", d, i))
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s holds %v, want %v", d, got, want)
		}
	}
	t.Logf("churn: operations per worker: %v", done)
}

// checkHolds fails t unless the file name holds exactly want.
func checkHolds(t testing.TB, f fs.FS, name, want string) {
	t.Helper()
	r, err := f.Open(context.Background(), name, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, r.Size())
	if _, err := r.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read %s: %v", name, err)
	}
	if string(buf) != want {
		t.Fatalf("%s holds %q, want %q", name, buf, want)
	}
}
