package mgmtd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/proto"
)

// chainOf parses "1:serving 2:offline ..." (target id:state, node = id).
func chainOf(t *testing.T, s string) proto.Chain {
	t.Helper()
	c := proto.Chain{ID: 1, Version: 10}
	for _, w := range strings.Fields(s) {
		var id int
		var st string
		if _, err := fmt.Sscanf(strings.Replace(w, ":", " ", 1), "%d %s", &id, &st); err != nil {
			t.Fatalf("bad chain spec %q", w)
		}
		c.Targets = append(c.Targets, proto.ChainTarget{ID: proto.TargetID(id), Node: proto.NodeID(id), State: proto.PublicState(st)})
	}
	return c
}

func localOf(s string) map[proto.TargetID]proto.LocalState {
	m := map[proto.TargetID]proto.LocalState{}
	for _, w := range strings.Fields(s) {
		var id int
		var st string
		fmt.Sscanf(strings.Replace(w, ":", " ", 1), "%d %s", &id, &st)
		m[proto.TargetID(id)] = proto.LocalState(st)
	}
	return m
}

func render(c proto.Chain) string {
	var parts []string
	for _, t := range c.Targets {
		parts = append(parts, fmt.Sprintf("%d:%s", t.ID, t.State))
	}
	return strings.Join(parts, " ")
}

func TestNextChainTable(t *testing.T) {
	for _, tc := range []struct{ name, chain, local, want string }{
		{"all healthy", "1:serving 2:serving 3:serving", "1:uptodate 2:uptodate 3:uptodate", "1:serving 2:serving 3:serving"},
		{"head dies, moves to end", "1:serving 2:serving 3:serving", "2:uptodate 3:uptodate", "2:serving 3:serving 1:offline"},
		{"middle dies", "1:serving 2:serving 3:serving", "1:uptodate 3:uptodate 2:offline", "1:serving 3:serving 2:offline"},
		{"tail dies", "1:serving 2:serving 3:serving", "1:uptodate 2:uptodate", "1:serving 2:serving 3:offline"},
		{"all die: first becomes lastsrv", "1:serving 2:serving 3:serving", "", "1:lastsrv 2:offline 3:offline"},
		{"last one dies", "2:serving 1:offline 3:offline", "", "2:lastsrv 1:offline 3:offline"},
		{"stale one returns first: waits", "2:lastsrv 1:offline 3:offline", "1:online", "2:lastsrv 1:waiting 3:offline"},
		{"lastsrv returns: serves", "2:lastsrv 1:waiting 3:offline", "1:online 2:online", "2:serving 1:syncing 3:offline"},
		{"returning target syncs", "1:serving 2:serving 3:offline", "1:uptodate 2:uptodate 3:online", "1:serving 2:serving 3:syncing"},
		{"only one syncs at a time", "1:serving 2:offline 3:offline", "1:uptodate 2:online 3:online", "1:serving 2:syncing 3:waiting"},
		{"sync done: serving", "1:serving 2:syncing 3:waiting", "1:uptodate 2:uptodate 3:online", "1:serving 2:serving 3:syncing"},
		{"syncing dies", "1:serving 2:syncing 3:waiting", "1:uptodate 3:online", "1:serving 3:syncing 2:offline"},
		{"serving dies while other syncs", "1:serving 2:syncing", "2:online", "1:lastsrv 2:waiting"},
		{"serving reporting online stays (just promoted)", "1:serving 2:serving", "1:online 2:uptodate", "1:serving 2:serving"},
		{"restart: all report offline", "1:serving 2:serving 3:serving", "1:offline 2:offline 3:offline", "1:lastsrv 2:offline 3:offline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := chainOf(t, tc.chain)
			n, changed := NextChain(c, localOf(tc.local))
			if got := render(n); got != tc.want {
				t.Fatalf("got %q want %q", got, tc.want)
			}
			if changed != (tc.chain != tc.want) {
				t.Fatalf("changed=%v", changed)
			}
			if changed && n.Version != c.Version+1 {
				t.Fatalf("version %d, want %d", n.Version, c.Version+1)
			}
			if err := CheckChain(n); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNextChainInvariantsRandom drives chains with random local states and
// checks 3FS's invariants after every step, and that membership never
// changes and a chain with live targets converges to all serving.
func TestNextChainInvariantsRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	locals := []proto.LocalState{proto.UpToDate, proto.Online, proto.LocalOff}
	for iter := 0; iter < 2000; iter++ {
		c := chainOf(t, "1:serving 2:serving 3:serving")
		for step := 0; step < 20; step++ {
			local := map[proto.TargetID]proto.LocalState{}
			for _, tg := range c.Targets {
				s := locals[rng.IntN(3)]
				// A storage node reports uptodate only for a target that
				// serves or was syncing (sync done).
				if s == proto.UpToDate && tg.State != proto.Serving && tg.State != proto.Syncing {
					s = proto.Online
				}
				local[tg.ID] = s
			}
			n, _ := NextChain(c, local)
			if err := CheckChain(n); err != nil {
				t.Fatalf("iter %d step %d: %v (from %s, local %v)", iter, step, err, c.String(), local)
			}
			if len(n.Targets) != 3 {
				t.Fatal("membership changed")
			}
			c = n
		}
		// Everyone alive again and syncing finishes: converge to serving.
		for step := 0; step < 10; step++ {
			local := map[proto.TargetID]proto.LocalState{}
			for _, tg := range c.Targets {
				if tg.State == proto.Serving || tg.State == proto.Syncing {
					local[tg.ID] = proto.UpToDate
				} else {
					local[tg.ID] = proto.Online
				}
			}
			c, _ = NextChain(c, local)
		}
		for _, tg := range c.Targets {
			if tg.State != proto.Serving {
				t.Fatalf("iter %d: did not converge: %s", iter, c.String())
			}
		}
	}
}

func TestLocalStatesFailTimeout(t *testing.T) {
	now := time.Unix(1000, 0)
	nodes := map[proto.NodeID]NodeView{
		1: {LastHB: now.Add(-time.Second), Targets: map[proto.TargetID]proto.LocalState{11: proto.UpToDate}},
		2: {LastHB: now.Add(-5 * time.Second), Targets: map[proto.TargetID]proto.LocalState{21: proto.UpToDate}},
	}
	got := LocalStates(nodes, now, 4*time.Second)
	if got[11] != proto.UpToDate || got[21] != proto.LocalOff {
		t.Fatalf("got %v", got)
	}
}

func TestPlacement(t *testing.T) {
	targets := map[proto.TargetID]proto.NodeID{}
	for n := 1; n <= 3; n++ {
		for i := 1; i <= 2; i++ {
			targets[proto.TargetID(n*100+i)] = proto.NodeID(n)
		}
	}
	chains, err := Placement(targets, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(chains) != 2 {
		t.Fatalf("%d chains", len(chains))
	}
	used := map[proto.TargetID]bool{}
	heads := map[proto.NodeID]int{}
	for _, c := range chains {
		nodes := map[proto.NodeID]bool{}
		for _, tg := range c.Targets {
			if nodes[tg.Node] || used[tg.ID] {
				t.Fatalf("bad placement %s", c.String())
			}
			nodes[tg.Node] = true
			used[tg.ID] = true
		}
		heads[c.Targets[0].Node]++
	}
	if len(heads) != 2 {
		t.Fatalf("heads not spread: %v", heads)
	}
	if _, err := Placement(targets, 4); err == nil {
		t.Fatal("4 replicas on 3 nodes accepted")
	}
}

// TestServerRestartResumes checks that a restarted mgmtd resumes the
// persisted routing with a higher version.
func TestServerRestartResumes(t *testing.T) {
	ctx := context.Background()
	store := memkv.New(memkv.Options{})
	opts := Options{Token: "t", Store: store, Replicas: 2, ExpectTargets: 4, UpdateInterval: 10 * time.Millisecond, Logf: t.Logf}
	s, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 2; n++ {
		_, _, err := s.heartbeat(ctx, &proto.HeartbeatReq{Node: proto.NodeID(n), Addr: fmt.Sprintf("h:%d", n), Version: 1,
			Targets: []proto.TargetReport{{ID: proto.TargetID(n*10 + 1), State: proto.Online}, {ID: proto.TargetID(n*10 + 2), State: proto.Online}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(s.Routing().Chains) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	r1 := s.Routing()
	if len(r1.Chains) != 2 {
		t.Fatalf("chains not built: %+v", r1)
	}
	// Stale heartbeat versions are refused.
	if _, _, err := s.heartbeat(ctx, &proto.HeartbeatReq{Node: 1, Addr: "h:1", Version: 1}); err == nil {
		t.Fatal("stale heartbeat accepted")
	}
	s.Close()
	s2, err := Start(ctx, Options{Token: "t", Store: store, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	r2 := s2.Routing()
	if r2.Version <= r1.Version || len(r2.Chains) != 2 || r2.NodeAddr(2) != "h:2" {
		t.Fatalf("restart lost state: before %+v after %+v", r1, r2)
	}
}

// WaitReady on a cluster without storage services ends with the context and
// says so (the positive path runs in every storage and client test).
func TestWaitReadyTimesOut(t *testing.T) {
	s, err := Start(context.Background(), Options{Token: "t", Store: memkv.New(memkv.Options{}), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.WaitReady(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("WaitReady without storage: %v", err)
	}
}

// A syncing target's "uptodate" report from under an older chain version
// (its resync ended before it was dropped and made syncing again) must
// not promote it: writes were acknowledged without it in between.
func TestStaleResyncReportIgnored(t *testing.T) {
	ctx := context.Background()
	s, err := Start(ctx, Options{Token: "t", Store: memkv.New(memkv.Options{}), Replicas: 3, ExpectTargets: 3,
		UpdateInterval: time.Hour, Freeze: time.Nanosecond, FailTimeout: time.Hour, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hbv := map[proto.NodeID]uint64{}
	report := func(id proto.TargetID, st proto.LocalState, cv uint64) {
		t.Helper()
		n := proto.NodeID(id)
		hbv[n]++
		if _, _, err := s.heartbeat(ctx, &proto.HeartbeatReq{Node: n, Addr: fmt.Sprintf("h:%d", n), Version: hbv[n],
			Targets: []proto.TargetReport{{ID: id, State: st, ChainVer: cv}}}); err != nil {
			t.Fatal(err)
		}
	}
	tick := func() proto.Chain {
		t.Helper()
		if err := s.tick(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		return s.Routing().Chains[0]
	}
	for id := proto.TargetID(1); id <= 3; id++ {
		report(id, proto.UpToDate, 1)
	}
	ch := tick()
	if len(s.Routing().Chains) != 1 {
		t.Fatalf("chain not built: %+v", s.Routing())
	}
	for id := proto.TargetID(1); id <= 3; id++ {
		report(id, proto.UpToDate, ch.Version)
	}
	ch = tick()
	old := ch.Version
	report(3, proto.LocalOff, 0) // target 3 dies
	ch = tick()
	if tg, _ := ch.Target(3); tg.State != proto.Offline {
		t.Fatalf("target 3 not offline: %s", ch.String())
	}
	report(3, proto.Online, 0) // back: made syncing
	ch = tick()
	if tg, _ := ch.Target(3); tg.State != proto.Syncing {
		t.Fatalf("target 3 not syncing: %s", ch.String())
	}
	report(3, proto.UpToDate, old) // a report from before it died
	if ch = tick(); func() bool { tg, _ := ch.Target(3); return tg.State != proto.Syncing }() {
		t.Fatalf("a stale uptodate report (chain v%d) changed target 3: %s", old, ch.String())
	}
	if n := s.StaleResyncs(); n != 1 {
		t.Fatalf("StaleResyncs = %d, want 1", n)
	}
	report(3, proto.UpToDate, ch.Version) // its resync under this version ended
	if ch = tick(); func() bool { tg, _ := ch.Target(3); return tg.State != proto.Serving }() {
		t.Fatalf("target 3 not promoted on a current report: %s", ch.String())
	}
}

// TestStallCredit: a decision loop that ran late by more than half the
// fail timeout (mgmtd frozen or starved) pauses every node's failure
// clock by the time it did not run; shorter late ticks do not.
func TestStallCredit(t *testing.T) {
	iv, ft := 200*time.Millisecond, 4*time.Second
	for _, tc := range []struct {
		gap, interval, ft, want time.Duration
	}{
		{0, iv, ft, 0},
		{iv, iv, ft, 0},
		{2 * iv, iv, ft, 0},
		{time.Second, iv, ft, 0}, // a loaded host's late tick
		{ft / 2, iv, ft, 0},
		{ft/2 + time.Millisecond, iv, ft, ft/2 + time.Millisecond - iv},
		{20 * time.Second, iv, ft, 20*time.Second - iv}, // SIGSTOP for 20 s
		// A fail timeout shorter than two intervals: two intervals rule.
		{300 * time.Millisecond, iv, 200 * time.Millisecond, 0},
		{500 * time.Millisecond, iv, 200 * time.Millisecond, 300 * time.Millisecond},
	} {
		if got := StallCredit(tc.gap, tc.interval, tc.ft); got != tc.want {
			t.Errorf("StallCredit(%v, %v, %v) = %v, want %v", tc.gap, tc.interval, tc.ft, got, tc.want)
		}
	}
}
