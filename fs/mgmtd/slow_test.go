package mgmtd

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ffkit/ffkit/fs/kv/memkv"
	"github.com/ffkit/ffkit/fs/proto"
)

func lat(spec ...any) []proto.NodeLatency {
	var out []proto.NodeLatency
	for i := 0; i < len(spec); i += 2 {
		l := proto.NodeLatency{Node: proto.NodeID(spec[i].(int))}
		switch v := spec[i+1].(type) {
		case time.Duration:
			l.Latency = int64(v)
		case string: // "hedged"
			l.Hedged = 1
		}
		out = append(out, l)
	}
	return out
}

func TestVotesTable(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		rep  []proto.NodeLatency
		want string // node:slow|fast ...
	}{
		{"all alike", lat(1, 10*ms, 2, 12*ms, 3, 11*ms), "1:fast 2:fast 3:fast"},
		{"one 50x slower", lat(1, 10*ms, 2, 500*ms, 3, 11*ms), "1:fast 2:slow 3:fast"},
		{"slower but under the floor", lat(1, 1*ms, 2, 200*ms), "1:fast 2:fast"},
		{"above the floor, under the factor", lat(1, 300*ms, 2, 1000*ms), "1:fast 2:fast"},
		{"above both", lat(1, 300*ms, 2, 1300*ms), "1:fast 2:slow"},
		{"alone: no vote", lat(2, 5000*ms), ""},
		{"hedged: slow without a latency", lat(1, 10*ms, 2, "hedged"), "2:slow"},
		{"hedged alone still votes", lat(2, "hedged"), "2:slow"},
		{"unknown latency: no vote, and no base for the other", lat(1, 10*ms, 2, time.Duration(0)), ""},
	} {
		var got []string
		for _, v := range Votes(tc.rep, 7, time.Unix(100, 0), SlowParams{}) {
			got = append(got, fmt.Sprintf("%d:%s", v.Node, map[bool]string{true: "slow", false: "fast"}[v.Slow]))
		}
		if g := fmt.Sprint(got); g != fmt.Sprint(splitOrNil(tc.want)) {
			t.Errorf("%s: votes %s, want %s", tc.name, g, tc.want)
		}
	}
}

func splitOrNil(s string) []string { return strings.Fields(s) }

func TestSlowNodesTable(t *testing.T) {
	now := time.Unix(1000, 0)
	at := func(secAgo float64) time.Time { return now.Add(-time.Duration(secAgo * float64(time.Second))) }
	v := func(node int, slow bool, secAgo float64) LatencyVote {
		return LatencyVote{Node: proto.NodeID(node), Slow: slow, At: at(secAgo)}
	}
	for _, tc := range []struct {
		name  string
		votes []LatencyVote
		want  []proto.NodeID
	}{
		{"none", nil, nil},
		{"persistently slow", []LatencyVote{v(2, true, 3), v(2, true, 2), v(2, true, 0.5), v(1, false, 1)}, []proto.NodeID{2}},
		{"too few votes", []LatencyVote{v(2, true, 3), v(2, true, 0.5)}, nil},
		{"not for long enough", []LatencyVote{v(2, true, 1.5), v(2, true, 1), v(2, true, 0.5)}, nil},
		{"votes out of the window", []LatencyVote{v(2, true, 13), v(2, true, 11), v(2, true, 0.5)}, nil},
		{"latest vote fast: recovered", []LatencyVote{v(2, true, 4), v(2, true, 3), v(2, true, 2), v(2, false, 0.5)}, nil},
		{"as many fast as slow", []LatencyVote{v(2, true, 4), v(2, false, 3.5), v(2, true, 3), v(2, false, 2.5), v(2, true, 0.5), v(2, false, 1)}, nil},
		{"two slow", []LatencyVote{v(3, true, 3), v(3, true, 2), v(3, true, 0.5), v(1, true, 3), v(1, true, 2), v(1, true, 1)}, []proto.NodeID{1, 3}},
		{"votes from the future ignored", []LatencyVote{v(2, true, 3), v(2, true, 2), v(2, true, -5)}, nil},
	} {
		if got := SlowNodes(tc.votes, now, SlowParams{}); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// routing3 is two chains over nodes 1..3 (targets 101, 201, ... on node 1,
// 102, 202 on node 2, ...), all serving.
func routing3() *proto.Routing {
	r := &proto.Routing{Version: 5}
	for c := 1; c <= 2; c++ {
		ch := proto.Chain{ID: proto.ChainID(c), Version: 3}
		for n := 1; n <= 3; n++ {
			ch.Targets = append(ch.Targets, proto.ChainTarget{ID: proto.TargetID(100*c + n), Node: proto.NodeID(n), State: proto.Serving})
		}
		r.Chains = append(r.Chains, ch)
	}
	return r
}

func upToDate(r *proto.Routing) map[proto.TargetID]proto.LocalState {
	m := map[proto.TargetID]proto.LocalState{}
	for _, c := range r.Chains {
		for _, t := range c.Targets {
			m[t.ID] = proto.UpToDate
		}
	}
	return m
}

func TestNextExclusionsTable(t *testing.T) {
	now := time.Unix(1000, 0)
	s := time.Second
	r := routing3()
	for _, tc := range []struct {
		name  string
		cur   map[proto.NodeID]Exclusion
		slow  []proto.NodeID
		local func(map[proto.TargetID]proto.LocalState)
		want  map[proto.NodeID]Exclusion
		taken []proto.NodeID
	}{
		{name: "nothing slow", want: map[proto.NodeID]Exclusion{}},
		{name: "one slow: out for Hold", slow: []proto.NodeID{2},
			want: map[proto.NodeID]Exclusion{2: {Until: now.Add(10 * s), Count: 1}}, taken: []proto.NodeID{2}},
		{name: "one at a time", slow: []proto.NodeID{1, 3},
			want: map[proto.NodeID]Exclusion{1: {Until: now.Add(10 * s), Count: 1}}, taken: []proto.NodeID{1}},
		{name: "already out: unchanged", cur: map[proto.NodeID]Exclusion{2: {Until: now.Add(3 * s), Count: 1}}, slow: []proto.NodeID{2, 3},
			want: map[proto.NodeID]Exclusion{2: {Until: now.Add(3 * s), Count: 1}}},
		{name: "slow again soon after: twice as long", cur: map[proto.NodeID]Exclusion{2: {Until: now.Add(-20 * s), Count: 1}}, slow: []proto.NodeID{2},
			want: map[proto.NodeID]Exclusion{2: {Until: now.Add(20 * s), Count: 2}}, taken: []proto.NodeID{2}},
		{name: "hold capped", cur: map[proto.NodeID]Exclusion{2: {Until: now.Add(-s), Count: 9}}, slow: []proto.NodeID{2},
			want: map[proto.NodeID]Exclusion{2: {Until: now.Add(20 * s), Count: 10}}, taken: []proto.NodeID{2}},
		{name: "hold ended: back, remembered", cur: map[proto.NodeID]Exclusion{2: {Until: now.Add(-s), Count: 1}},
			want: map[proto.NodeID]Exclusion{2: {Until: now.Add(-s), Count: 1}}},
		{name: "long ago: forgotten", cur: map[proto.NodeID]Exclusion{2: {Until: now.Add(-2 * time.Minute), Count: 3}}, slow: []proto.NodeID{2},
			want: map[proto.NodeID]Exclusion{2: {Until: now.Add(10 * s), Count: 1}}, taken: []proto.NodeID{2}},
		{name: "the others are dead: kept (last replica)", slow: []proto.NodeID{2},
			local: func(m map[proto.TargetID]proto.LocalState) {
				delete(m, 101)
				delete(m, 103)
				delete(m, 201)
				delete(m, 203)
			},
			want: map[proto.NodeID]Exclusion{}},
		{name: "one chain would lose its last replica: kept", slow: []proto.NodeID{2},
			local: func(m map[proto.TargetID]proto.LocalState) { m[201] = proto.LocalOff; m[203] = proto.LocalOff },
			want:  map[proto.NodeID]Exclusion{}},
		{name: "a node in no chain: not taken", slow: []proto.NodeID{9}, want: map[proto.NodeID]Exclusion{}},
	} {
		local := upToDate(r)
		if tc.local != nil {
			tc.local(local)
		}
		got, taken := NextExclusions(tc.cur, tc.slow, r, local, now, SlowParams{})
		if fmt.Sprint(got) != fmt.Sprint(tc.want) || !slices.Equal(taken, tc.taken) {
			t.Errorf("%s: %v taken %v, want %v taken %v", tc.name, got, taken, tc.want, tc.taken)
		}
	}
}

// A slow node's targets leave their chains through Decide and come back
// through resync (syncing, then serving) when the hold ends.
func TestExclusionThroughDecide(t *testing.T) {
	r := routing3()
	now := time.Unix(1000, 0)
	local := upToDate(r)
	ex, _ := NextExclusions(nil, []proto.NodeID{2}, r, local, now, SlowParams{})
	ApplyExclusions(local, r, Excluded(ex, now))
	r2, changed := Decide(r, local)
	if !changed {
		t.Fatal("no change")
	}
	for _, c := range r2.Chains {
		if got := render(c); got != fmt.Sprintf("%d:serving %d:serving %d:offline", 100*int(c.ID)+1, 100*int(c.ID)+3, 100*int(c.ID)+2) {
			t.Fatalf("chain %d: %s", c.ID, got)
		}
		if err := CheckChain(c); err != nil {
			t.Fatal(err)
		}
	}
	// Still held: the node reports its targets online (it stopped
	// serving and waits to rejoin); they stay offline.
	later := now.Add(5 * time.Second)
	local = upToDate(r2)
	local[102], local[202] = proto.Online, proto.Online
	ApplyExclusions(local, r2, Excluded(ex, later))
	if _, changed := Decide(r2, local); changed {
		t.Fatal("an excluded node's targets moved while it is held")
	}
	// Hold over: they resync.
	over := now.Add(11 * time.Second)
	ex, _ = NextExclusions(ex, nil, r2, local, over, SlowParams{})
	local = upToDate(r2)
	local[102], local[202] = proto.Online, proto.Online
	ApplyExclusions(local, r2, Excluded(ex, over))
	r3, _ := Decide(r2, local)
	for _, c := range r3.Chains {
		if got := render(c); got != fmt.Sprintf("%d:serving %d:serving %d:syncing", 100*int(c.ID)+1, 100*int(c.ID)+3, 100*int(c.ID)+2) {
			t.Fatalf("after the hold, chain %d: %s", c.ID, got)
		}
	}
}

// TestListenWaitsForBusyPort: a restarted mgmtd binds the address its
// cluster URL names; when another socket holds that port for a while (the
// kernel gave it out as an ephemeral port: TestMgmtdRestart failed now
// and then with "address already in use"), Start waits until it is free
// instead of failing.
func TestListenWaitsForBusyPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	var tries atomic.Int32
	testHookListenBusy = func() {
		if tries.Add(1) == 3 {
			ln.Close()
		}
	}
	defer func() { testHookListenBusy = nil }()
	s, err := Start(context.Background(), Options{Token: "t", Store: memkv.New(memkv.Options{}), Listen: addr, Logf: t.Logf})
	if err != nil {
		t.Fatalf("start on a port busy for a while: %v", err)
	}
	defer s.Close()
	if s.Addr() != addr || tries.Load() < 3 {
		t.Fatalf("serving on %s after %d busy attempts", s.Addr(), tries.Load())
	}
}

// hop is a write-path hop report for the tables: from (0: a client) to
// node to, its network time and the node's own time, ms.
func hop(reporter uint64, from, to int, linkMs, ownMs int, secAgo float64, now time.Time) Hop {
	return Hop{HopLatency: proto.HopLatency{From: proto.NodeID(from), To: proto.NodeID(to),
		Link: int64(time.Duration(linkMs) * time.Millisecond), Own: int64(time.Duration(ownMs) * time.Millisecond)},
		Reporter: reporter, At: now.Add(-time.Duration(secAgo * float64(time.Second)))}
}

func TestHopVotesTable(t *testing.T) {
	now := time.Unix(1000, 0)
	const client = 77
	// The namespace cluster's two chains, 1->2->3 and 2->3->1, clients
	// writing to the heads 1 and 2.
	healthy := []Hop{
		hop(client, 0, 1, 20, 5, 0, now), hop(client, 0, 2, 25, 5, 0, now),
		hop(1, 1, 2, 15, 5, 0, now), hop(2, 2, 3, 18, 6, 0, now), hop(3, 3, 1, 16, 4, 0, now),
	}
	for _, tc := range []struct {
		name  string
		older []Hop // kept from earlier reports
		fresh []Hop
		want  string // node:slow|fast ...
	}{
		{"healthy", nil, healthy, "1:fast 2:fast 3:fast"},
		{"node 3 slow to send (a throttled link): its forward and its acks crawl",
			nil, []Hop{hop(client, 0, 1, 20, 5, 0, now), hop(client, 0, 2, 25, 5, 0, now),
				hop(1, 1, 2, 15, 5, 0, now), hop(2, 2, 3, 600, 6, 0, now), hop(3, 3, 1, 1500, 4, 0, now)},
			"1:fast 2:fast 3:slow"},
		{"node 3 slow on disk: its own time, as its predecessor saw it",
			nil, []Hop{hop(client, 0, 1, 20, 5, 0, now), hop(client, 0, 2, 25, 5, 0, now),
				hop(1, 1, 2, 15, 5, 0, now), hop(2, 2, 3, 18, 900, 0, now), hop(3, 3, 1, 16, 4, 0, now)},
			"1:fast 2:fast 3:slow"},
		{"only node 3's forward is slow: node 1 has a fast hop, so 3 is blamed",
			nil, []Hop{hop(client, 0, 1, 20, 5, 0, now), hop(1, 1, 2, 15, 5, 0, now), hop(3, 3, 1, 1500, 4, 0, now)},
			"1:fast 2:fast 3:slow"},
		{"a slow head seen by the client only: blamed",
			nil, []Hop{hop(client, 0, 2, 1200, 5, 0, now), hop(client, 0, 1, 20, 5, 0, now)},
			"1:fast 2:slow"},
		{"every hop slow alike (a loaded host): nobody",
			nil, []Hop{hop(1, 1, 2, 900, 5, 0, now), hop(2, 2, 3, 800, 6, 0, now), hop(3, 3, 1, 950, 4, 0, now)},
			"1:fast 2:fast 3:fast"},
		{"under the floor: not slow", nil, []Hop{hop(1, 1, 2, 2, 1, 0, now), hop(2, 2, 3, 200, 1, 0, now), hop(3, 3, 1, 150, 1, 0, now)},
			"1:fast 2:fast 3:fast"},
		{"votes only on the fresh report's nodes, judged against the kept ones",
			append([]Hop{hop(3, 3, 1, 1400, 4, 1, now), hop(2, 2, 3, 600, 4, 1, now)}, healthy[:3]...),
			[]Hop{hop(3, 3, 1, 1500, 4, 0, now), hop(2, 2, 3, 700, 4, 0, now)},
			"1:fast 2:fast 3:slow"},
		{"a report superseded by the same reporter's two later ones does not count",
			[]Hop{hop(2, 2, 3, 10, 4, 3, now), hop(2, 2, 3, 1400, 4, 1, now), hop(1, 1, 2, 15, 5, 3, now)},
			[]Hop{hop(2, 2, 3, 1500, 4, 0, now)},
			"2:fast 3:slow"},
		{"one stalled report after fast ones (a pause's requests ending at once): nobody",
			[]Hop{hop(2, 2, 3, 18, 4, 1, now), hop(1, 1, 2, 15, 5, 1, now), hop(client, 0, 1, 20, 5, 1, now)},
			[]Hop{hop(2, 2, 3, 6000, 4, 0, now)},
			"2:fast 3:fast"},
		{"slow in two reports in a row: blamed",
			[]Hop{hop(2, 2, 3, 18, 4, 2, now), hop(2, 2, 3, 5000, 4, 1, now), hop(1, 1, 2, 15, 5, 1, now)},
			[]Hop{hop(2, 2, 3, 6000, 4, 0, now)},
			"2:fast 3:slow"},
		{"reports out of the window do not count: nothing fast to compare with",
			[]Hop{hop(client, 0, 1, 20, 5, 11, now)},
			[]Hop{hop(3, 3, 1, 1500, 4, 0, now)},
			"1:fast 3:fast"},
		{"alone: nothing to compare with, not slow", nil, []Hop{hop(client, 0, 2, 5000, 5, 0, now)}, "2:fast"},
		{"a slow hop whose ends cannot be told apart blames nobody",
			nil, []Hop{hop(client, 0, 1, 20, 5, 0, now), hop(client, 0, 2, 22, 5, 0, now), hop(1, 1, 2, 1500, 5, 0, now)},
			"1:fast 2:fast"},
		{"a client's slow link is its own: nobody",
			nil, []Hop{hop(client, 0, 1, 1500, 5, 0, now), hop(client+1, 0, 1, 20, 5, 0, now), hop(1, 1, 2, 15, 5, 0, now)},
			"1:fast 2:fast"},
		{"the namespace cluster's numbers: 2->3 waits 100 ms behind 3's traffic, 3->1 takes 3 s",
			nil, []Hop{hop(client, 0, 1, 5, 1, 0, now), hop(client, 0, 2, 10, 1, 0, now),
				hop(1, 1, 2, 2, 1, 0, now), hop(2, 2, 3, 100, 1, 0, now), hop(3, 3, 1, 3000, 2, 0, now)},
			"1:fast 2:fast 3:slow"},
	} {
		all := append(append([]Hop{}, tc.older...), tc.fresh...)
		var got []string
		for _, v := range HopVotes(all, tc.fresh, now, SlowParams{}) {
			got = append(got, fmt.Sprintf("%d:%s", v.Node, map[bool]string{true: "slow", false: "fast"}[v.Slow]))
		}
		if g := fmt.Sprint(got); g != fmt.Sprint(splitOrNil(tc.want)) {
			t.Errorf("%s: votes %s, want %s", tc.name, g, tc.want)
		}
	}
}

// Hop votes feed the same persistence rule and exclusion as read votes:
// a node found slow at forwarding in heartbeats over a few seconds is
// taken out, and one slow report is not enough.
func TestHopVotesToExclusion(t *testing.T) {
	start := time.Unix(1000, 0)
	var hops []Hop
	var votes []LatencyVote
	report := func(at time.Time, slow bool) {
		l := 16
		if slow {
			l = 1500
		}
		fresh := []Hop{hop(3, 3, 1, l, 4, 0, at), hop(1, 1, 2, 15, 5, 0, at), hop(2, 2, 3, l/2, 5, 0, at)}
		hops = append(hops, fresh...)
		votes = append(votes, HopVotes(hops, fresh, at, SlowParams{})...)
	}
	report(start, true)
	for i := 1; i <= 4; i++ {
		report(start.Add(time.Duration(i)*200*time.Millisecond), false)
	}
	if got := SlowNodes(votes, start.Add(time.Second), SlowParams{}); got != nil {
		t.Fatalf("one slow report: %v found slow", got)
	}
	for i := 0; i <= 12; i++ {
		report(start.Add(2*time.Second+time.Duration(i)*200*time.Millisecond), true)
	}
	now := start.Add(2*time.Second + 12*200*time.Millisecond)
	slow := SlowNodes(votes, now, SlowParams{})
	if !slices.Equal(slow, []proto.NodeID{3}) {
		t.Fatalf("slow %v, want [3]", slow)
	}
	if _, taken := NextExclusions(nil, slow, routing3(), upToDate(routing3()), now, SlowParams{}); !slices.Equal(taken, []proto.NodeID{3}) {
		t.Fatalf("taken %v, want [3]", taken)
	}
}
