package localfs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/fs"
)

// A file closed while a batch holds its descriptor keeps its number until
// the batch ends: an open meanwhile gets another number, and reads through
// the held one still see the closed file's bytes. Once the batch ends the
// descriptor is closed.
func TestWithFDsHoldsAcrossClose(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(a, bytes.Repeat([]byte{'A'}, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, bytes.Repeat([]byte{'B'}, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	l := New()
	fa, err := l.Open(ctx, a, fs.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := fa.(*File)
	var held int
	var others []*os.File
	defer func() {
		for _, o := range others {
			o.Close()
		}
	}()
	err = withFDs([]*File{f, nil, f}, func(fds []int) error {
		if fds[0] != fds[2] || fds[1] != -1 {
			t.Errorf("fds = %v: want the same descriptor twice and -1 for nil", fds)
		}
		held = fds[0]
		if err := f.Close(); err != nil {
			t.Errorf("close while held: %v", err)
		}
		for range 4 { // the lowest free numbers go to these opens
			o, err := os.Open(b)
			if err != nil {
				t.Fatal(err)
			}
			others = append(others, o)
			if int(o.Fd()) == held {
				t.Errorf("descriptor %d was reused while held", held)
			}
		}
		buf := make([]byte, 100)
		if n, err := unix.Pread(held, buf, 10); err != nil || n != len(buf) || !bytes.Equal(buf, bytes.Repeat([]byte{'A'}, 100)) {
			t.Errorf("pread on the held descriptor: %d, %v, %q", n, err, buf[:n])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(held), unix.F_GETFD, 0); err == nil {
		var st, sb unix.Stat_t
		unix.Fstat(held, &st)
		unix.Stat(b, &sb)
		if st.Ino != sb.Ino { // the number may be free, or reused by another open since
			t.Errorf("descriptor %d still open on the closed file after the batch", held)
		}
	}
	if err := withFDs([]*File{f}, func([]int) error { t.Error("fn called on a closed file"); return nil }); err == nil {
		t.Error("withFDs on a closed file: no error")
	}
}

// Batches through io_uring and the probe racing with Close and with opens
// of another file never read the other file's bytes (the descriptor number
// of a closed file is not reused under a read in flight); each batch
// returns the file's bytes or fails. Run it with -race: reading File.Fd()
// while Close ran was reported as a data race.
func TestReadBatchRacesClose(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	const size = 1 << 20
	if err := os.WriteFile(a, bytes.Repeat([]byte{'A'}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, bytes.Repeat([]byte{'B'}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	rounds := 200
	if testing.Short() {
		rounds = 50
	}
	for _, l := range []*FS{{Parallelism: 8, NoNowait: true}, {Parallelism: 8}} {
		for round := range rounds {
			f, err := l.Open(ctx, a, fs.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			reqs := make([]fs.ReadRequest, 64)
			for i := range reqs {
				reqs[i] = fs.ReadRequest{File: f, Off: int64(i*4096*3) % (size - 4096), Buf: make([]byte, 4096)}
			}
			var wg sync.WaitGroup
			var others []*os.File
			wg.Go(func() {
				f.Close()
				for range 4 {
					if o, err := os.Open(b); err == nil {
						others = append(others, o)
					}
				}
			})
			err = l.ReadBatch(ctx, reqs)
			wg.Wait()
			for _, o := range others {
				o.Close()
			}
			for i, q := range reqs {
				if bytes.IndexByte(q.Buf, 'B') >= 0 {
					t.Fatalf("NoNowait=%v round %d: request %d read the other file's bytes (batch error %v)", l.NoNowait, round, i, err)
				}
				if err == nil && !bytes.Equal(q.Buf, bytes.Repeat([]byte{'A'}, 4096)) {
					t.Fatalf("NoNowait=%v round %d: request %d: batch succeeded with wrong bytes", l.NoNowait, round, i)
				}
			}
		}
	}
}
