package chain

import (
	"testing"

	"github.com/ffkit/ffkit/fs/proto"
)

func TestCheckWrite(t *testing.T) {
	for _, c := range []struct {
		committedHas, pending, pendingHas bool
		want                              WriteStep
	}{
		{false, false, false, WriteApply},
		{true, false, false, WriteDone},
		{true, true, true, WriteDone}, // committed already: never waits for a newer pending version
		{false, true, true, WriteJoin},
		{false, true, false, WriteAfterPending},
	} {
		if got := CheckWrite(c.committedHas, c.pending, c.pendingHas); got != c.want {
			t.Errorf("CheckWrite(%t, %t, %t) = %s, want %s", c.committedHas, c.pending, c.pendingHas, got, c.want)
		}
	}
}

func TestCheckUpdate(t *testing.T) {
	for _, c := range []struct {
		committed, ver uint64
		whole          bool
		want           DeltaCheck
	}{
		{3, 4, false, DeltaApply},
		{3, 3, false, DeltaDone},
		{3, 6, false, DeltaMissing},
		{3, 6, true, DeltaApply}, // the predecessor's whole content wins
		{5, 2, true, DeltaApply},
	} {
		if got := CheckUpdate(c.committed, c.ver, c.whole); got != c.want {
			t.Errorf("CheckUpdate(%d, %d, %t) = %s, want %s", c.committed, c.ver, c.whole, got, c.want)
		}
	}
}

func testChain(ver uint64, states ...proto.PublicState) *proto.Chain {
	ch := &proto.Chain{ID: 1, Version: ver}
	for i, s := range states {
		ch.Targets = append(ch.Targets, proto.ChainTarget{ID: proto.TargetID(i + 1), State: s})
	}
	return ch
}

// TestForward walks one hop's forwarding through the answers a
// successor gives: a delta goes as a delta until the successor misses a
// version, disagrees or the chain changes; then whole until the commit.
func TestForward(t *testing.T) {
	ch := testChain(7, proto.Serving, proto.Serving, proto.Serving)
	if h := (&Forward{}).Next(3, ch); !h.Commit {
		t.Fatalf("the tail: %+v, want commit", h)
	}
	f := NewForward(5, 0xabc, true)
	if h := f.Next(1, ch); h.Commit || h.To.ID != 2 || h.Whole {
		t.Fatalf("first send: %+v, want a delta to 2", h)
	}
	if s := f.OnAnswer(Answer{Kind: AnswerFailed}); s != StepRetry {
		t.Fatalf("no answer: %s", s)
	}
	if h := f.Next(1, ch); h.Whole {
		t.Fatalf("retry under the same chain: %+v, want a delta", h)
	}
	if s := f.OnAnswer(Answer{Kind: AnswerOK, Ver: 5, Sum: 0xabc}); s != StepCommit {
		t.Fatalf("the same version and checksum: %s, want commit", s)
	}

	for _, a := range []Answer{{Kind: AnswerMissing}, {Kind: AnswerCorrupt}, {Kind: AnswerOK, Ver: 5, Sum: 0xdef}, {Kind: AnswerOK, Ver: 4, Sum: 0xabc}} {
		f := NewForward(5, 0xabc, true)
		f.Next(1, ch)
		if s := f.OnAnswer(a); s != StepResend {
			t.Fatalf("%+v: %s, want resend", a, s)
		}
		if h := f.Next(1, ch); !h.Whole {
			t.Fatalf("after %+v: %+v, want whole", a, h)
		}
	}

	f = NewForward(5, 0xabc, true)
	f.Next(1, ch)
	if h := f.Next(1, testChain(8, proto.Serving, proto.Serving)); !h.Whole {
		t.Fatalf("after a chain change: %+v, want whole", h)
	}
	f = NewForward(5, 0xabc, true)
	if h := f.Next(1, testChain(8, proto.Serving, proto.Syncing)); !h.Whole {
		t.Fatalf("to a syncing successor: %+v, want whole", h)
	}
	if h := f.Next(1, testChain(8, proto.Serving, proto.Serving)); h.Whole {
		t.Fatalf("once it serves: %+v, want a delta again", h)
	}
	f = NewForward(5, 0xabc, false)
	if h := f.Next(1, ch); !h.Whole {
		t.Fatalf("no delta known: %+v, want whole", h)
	}
	f = NewForward(5, 0xabc, true)
	f.Resend()
	if h := f.Next(1, ch); !h.Whole {
		t.Fatalf("after Resend: %+v, want whole", h)
	}
	if s := f.OnAnswer(Answer{Kind: AnswerRefused}); s != StepFail {
		t.Fatalf("refused: %s, want fail", s)
	}
}
