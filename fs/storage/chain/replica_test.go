package chain

import (
	"testing"

	"github.com/ffkit/ffkit/fs/proto"
)

// chainOf3 bootstraps three replicas of one chain (1 -> 2 -> 3).
func chainOf3() (map[Addr]*Replica, *proto.Routing) {
	ch := proto.Chain{ID: 1, Version: 1}
	for i := 1; i <= 3; i++ {
		ch.Targets = append(ch.Targets, proto.ChainTarget{ID: proto.TargetID(i), Node: proto.NodeID(i), State: proto.Serving})
	}
	r := &proto.Routing{Version: 1, Chains: []proto.Chain{ch}}
	reps := map[Addr]*Replica{}
	for i := 1; i <= 3; i++ {
		reps[Addr(i)] = Bootstrap(Config{ID: proto.TargetID(i), FailTimeout: 40, HeartbeatInterval: 5, RetryInterval: 12}, r, 0)
	}
	return reps, r
}

// deliver runs messages in FIFO order until none is left for a replica,
// logging the order of commits; it returns the messages to others.
func deliver(t *testing.T, reps map[Addr]*Replica, in []Msg, commits *[]Addr) []Msg {
	t.Helper()
	var out []Msg
	for len(in) > 0 {
		m := in[0]
		in = in[1:]
		r := reps[m.To]
		if r == nil {
			out = append(out, m)
			continue
		}
		r.Step(m)
		rd := r.Ready()
		for _, p := range rd.Persist {
			if p.Kind == PersistCommit {
				*commits = append(*commits, m.To)
			}
		}
		in = append(in, rd.Msgs...)
	}
	return out
}

// One write flows down the chain as an update, the tail commits first,
// the acknowledgements flow back and the head answers the client last; a
// retry of the same request is answered without a new version.
func TestWriteFlowsDownAndCommitsFromTail(t *testing.T) {
	reps, _ := chainOf3()
	var commits []Addr
	out := deliver(t, reps, []Msg{{Type: MsgWrite, From: 100, To: 1, Chunk: 7, Req: 1, Delta: 42, Now: 1}}, &commits)
	if len(out) != 1 || out[0].Type != MsgWriteResp || out[0].Err != "" || out[0].Ver != 1 {
		t.Fatalf("client got %v", out)
	}
	if want := []Addr{3, 2, 1}; len(commits) != 3 || commits[0] != want[0] || commits[1] != want[1] || commits[2] != want[2] {
		t.Fatalf("commit order %v, want tail first %v", commits, want)
	}
	want := Mix(0, 42)
	for a, r := range reps {
		v, p := r.Chunk(7)
		if v.Ver != 1 || v.Val != want || p != nil {
			t.Fatalf("target %d: %+v pending %v", a, v, p)
		}
	}
	commits = nil
	out = deliver(t, reps, []Msg{{Type: MsgWrite, From: 100, To: 1, Chunk: 7, Req: 1, Delta: 42, Now: 2}}, &commits)
	if len(out) != 1 || out[0].Err != "" || len(commits) != 0 {
		t.Fatalf("retry: client got %v, commits %v", out, commits)
	}
	if v, _ := reps[3].Chunk(7); v.Ver != 1 {
		t.Fatalf("retry applied again: tail at v%d", v.Ver)
	}
}

// A replica with a pending version refuses reads (it may be behind the
// tail); one that has not heard from mgmtd for half the fail timeout
// refuses everything.
func TestReadsRefusedWhenPendingOrFenced(t *testing.T) {
	reps, _ := chainOf3()
	reps[1].Step(Msg{Type: MsgWrite, From: 100, To: 1, Chunk: 7, Req: 1, Delta: 42, Now: 1})
	reps[1].Ready() // the update to 2 is never delivered
	reps[1].Step(Msg{Type: MsgRead, From: 101, To: 1, Chunk: 7, Req: 2, Now: 2})
	if m := reps[1].Ready().Msgs; len(m) != 1 || m[0].Err != "not committed" {
		t.Fatalf("read of a pending chunk: %v", m)
	}
	reps[3].Step(Msg{Type: MsgRead, From: 101, To: 3, Chunk: 7, Req: 3, Now: 21})
	if m := reps[3].Ready().Msgs; len(m) != 1 || m[0].Err != "offline" {
		t.Fatalf("read past the fence: %v", m)
	}
}
