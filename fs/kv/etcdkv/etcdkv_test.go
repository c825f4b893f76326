package etcdkv

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	if !s.Serializable() {
		t.Error("a store on a one-member etcd does not serve first reads serializably")
	}
	kvtest.Run(t, s, kvtest.Options{})

	// A second client sees the first one's acknowledged writes at once,
	// through serializable first reads.
	s2, err := Open(ctx, []string{srv.Endpoint()}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for i := range 50 {
		v := []byte{byte(i)}
		if err := s.Update(ctx, func(tx kv.Txn) error { tx.Set([]byte("fresh"), v); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := s2.View(ctx, func(tx kv.ReadTxn) error {
			got, ok, err := tx.Get(ctx, []byte("fresh"))
			if err == nil && (!ok || got[0] != v[0]) {
				err = fmt.Errorf("read %v (%v) after a write of %v was acknowledged", got, ok, v)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
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
	if s.Serializable() {
		t.Error("a store on a three-member etcd serves first reads serializably")
	}
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

// TestEmbeddedPortTaken: the ports an embedded member picks are free when
// picked but may be taken before etcd binds them (another connection's
// ephemeral port: a restarted mgmtd's etcd failed so with "address
// already in use" in TestMgmtdRestart). The first picks here are ports
// held by a listener: the member starts on new ones.
func TestEmbeddedPortTaken(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	picks := 0
	freeAddr = func() (string, error) {
		picks++
		if picks <= 2 {
			return busy.Addr().String(), nil
		}
		return FreeAddr()
	}
	defer func() { freeAddr = FreeAddr }()
	s, srv, err := OpenEmbedded(context.Background(), t.TempDir(), "", nil, Options{})
	if err != nil {
		t.Fatalf("start with its first ports taken: %v", err)
	}
	defer s.Close()
	if srv.Endpoint() == busy.Addr().String() || picks < 4 {
		t.Fatalf("serving at %s after %d picks", srv.Endpoint(), picks)
	}
}
