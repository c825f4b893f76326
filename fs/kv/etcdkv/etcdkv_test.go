package etcdkv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/kvtest"
)

func TestConformanceEmbedded(t *testing.T) {
	ctx := context.Background()
	s, srv, err := OpenEmbedded(ctx, t.TempDir(), "", nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Logf("embedded etcd at %s", srv.Endpoint())
	kvtest.Run(t, s, kvtest.Options{})
}

func TestConformanceThreeMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member etcd cluster")
	}
	ctx := context.Background()
	cl, err := StartCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err := Open(ctx, cl.Endpoints(), Options{Prefix: "conf/"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kvtest.Run(t, s, kvtest.Options{})

	// Lose one member: the majority keeps committing through the same client.
	cl.StopMember(0)
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Update(ctx2, func(tx kv.Txn) error { tx.Set([]byte("after"), []byte("1")); return nil }); err != nil {
		t.Fatalf("write with one of three members down: %v", err)
	}
	// Lose a second: no quorum, the write fails (within the deadline) and is not applied.
	cl.StopMember(1)
	ctx3, cancel3 := context.WithTimeout(ctx, 3*time.Second)
	defer cancel3()
	err = s.Update(ctx3, func(tx kv.Txn) error { tx.Set([]byte("noquorum"), []byte("1")); return nil })
	if err == nil {
		t.Fatal("write without quorum succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, kv.ErrUnavailable) {
		t.Logf("write without quorum: %v", err)
	}
}

func TestUnreachable(t *testing.T) {
	addr, _ := FreeAddr()
	_, err := Open(context.Background(), []string{addr}, Options{DialTimeout: 500 * time.Millisecond})
	if !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("Open of a dead endpoint: %v, want kv.ErrUnavailable", err)
	}
}
