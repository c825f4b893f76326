package meta

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
)

// commitUnknown is a fault-injecting store: every third committed
// transaction reports a failure although it did commit (FoundationDB's
// commit_unknown_result, a reply lost with the connection).
type commitUnknown struct {
	kv.Store
	n        atomic.Int64
	injected atomic.Int64
}

func (c *commitUnknown) Update(ctx context.Context, fn func(tx kv.Txn) error) error {
	err := c.Store.Update(ctx, fn)
	if err == nil && c.n.Add(1)%3 == 0 {
		c.injected.Add(1)
		return fmt.Errorf("%w: injected: commit result unknown (it did commit)", kv.ErrUnavailable)
	}
	return err
}

// Through the server and client, with commits whose success is reported
// as a failure: the client retries with the same request id and every
// operation takes effect exactly once.
func TestCommitUnknownExactlyOnce(t *testing.T) {
	ctx := context.Background()
	store := &commitUnknown{Store: memkv.New(memkv.Options{})}
	svc, err := NewService(ctx, Options{Store: store, Chunks: &recChunks{}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := StartServer(ctx, svc, ServerOptions{Token: "t", GCInterval: -1, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill()
	cl, err := NewClient(ClientOptions{Token: "t", Servers: []string{srv.Addr()}, RetryTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Mkdir(ctx, "/d/e", true); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 0; i < 30; i++ {
		a, b := fmt.Sprintf("/d/f%d", i), fmt.Sprintf("/d/e/g%d", i)
		if _, err := cl.Create(ctx, a, true); err != nil {
			t.Fatalf("create %s: %v", a, err)
		}
		if err := cl.Rename(ctx, a, b); err != nil {
			t.Fatalf("rename %s: %v", a, err)
		}
		if i%3 == 0 {
			if err := cl.Remove(ctx, b); err != nil {
				t.Fatalf("remove %s: %v", b, err)
			}
		} else {
			want = append(want, fmt.Sprintf("g%d", i))
		}
		n, sid, err := cl.BeginFile(ctx, fmt.Sprintf("/d/h%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.CommitFile(ctx, fmt.Sprintf("/d/h%d", i), n.ID, sid, int64(i)); err != nil {
			t.Fatalf("commit /d/h%d: %v", i, err)
		}
	}
	es, err := cl.Readdir(ctx, "/d/e")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Name)
	}
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("/d/e holds %v, want %v", got, want)
	}
	for i := 0; i < 30; i++ {
		st, err := cl.Stat(ctx, fmt.Sprintf("/d/h%d", i))
		if err != nil || st.Size != int64(i) {
			t.Fatalf("/d/h%d: %+v %v", i, st, err)
		}
	}
	if store.injected.Load() < 20 {
		t.Fatalf("only %d failures injected", store.injected.Load())
	}
	t.Logf("%d commits reported as failed although applied", store.injected.Load())
}
