package chain

import (
	"testing"

	"github.com/ffkit/ffkit/fs/proto"
)

func TestNextPhase(t *testing.T) {
	for _, tc := range []struct {
		p       Phase
		st      proto.PublicState
		inChain bool
		want    Phase
	}{
		{Restarting, proto.Serving, true, Restarting}, // mgmtd still shows it serving: wait
		{Restarting, proto.Offline, true, Online},     // the frozen-node case: no newer routing needed
		{Restarting, proto.LastSrv, true, Online},
		{Restarting, proto.Waiting, true, Online},
		{Restarting, proto.Syncing, true, Restarting},
		{Restarting, "", false, Online},
		{Online, proto.Offline, true, Online},
		{Online, proto.Syncing, true, Online}, // resync ends it, not routing
		{Online, proto.Serving, true, UpToDate},
		{UpToDate, proto.Serving, true, UpToDate},
		{UpToDate, proto.Syncing, true, UpToDate},
		{UpToDate, proto.Offline, true, Restarting},
		{UpToDate, proto.LastSrv, true, Restarting},
		{UpToDate, proto.Waiting, true, Restarting},
		{UpToDate, "", false, UpToDate},
	} {
		if got := NextPhase(tc.p, tc.st, tc.inChain); got != tc.want {
			t.Errorf("NextPhase(%s, %q, %t) = %s, want %s", tc.p, tc.st, tc.inChain, got, tc.want)
		}
	}
}

func TestResyncHolds(t *testing.T) {
	for _, tc := range []struct {
		st           proto.PublicState
		cv, reported uint64
		want         bool
	}{
		{proto.Syncing, 7, 7, true},  // the resync ended under the chain routed now
		{proto.Syncing, 9, 7, false}, // dropped and made syncing again since: stale
		{proto.Syncing, 7, 0, false}, // no version: never promotes
		{proto.Serving, 9, 7, true},  // not promoted by its report: nothing to hold
		{proto.Offline, 9, 7, true},
	} {
		if got := ResyncHolds(tc.st, tc.cv, tc.reported); got != tc.want {
			t.Errorf("ResyncHolds(%s, v%d, reported v%d) = %t, want %t", tc.st, tc.cv, tc.reported, got, tc.want)
		}
	}
}

func TestCheckDelta(t *testing.T) {
	for _, c := range []struct {
		committed, ver uint64
		want           DeltaCheck
	}{{0, 1, DeltaApply}, {4, 5, DeltaApply}, {4, 4, DeltaDone}, {4, 2, DeltaDone}, {4, 6, DeltaMissing}, {0, 2, DeltaMissing}} {
		if got := CheckDelta(c.committed, c.ver); got != c.want {
			t.Errorf("CheckDelta(%d, %d) = %s, want %s", c.committed, c.ver, got, c.want)
		}
	}
}

func TestCheckAck(t *testing.T) {
	for _, c := range []struct {
		ver, sum, ackVer, ackSum uint64
		want                     AckCheck
	}{
		{3, 0xaa, 3, 0xaa, AckCommit},
		{3, 0xaa, 3, 0xab, AckReplace}, // same number, other content
		{3, 0xaa, 2, 0xaa, AckReplace}, // an older version
		{3, 0xaa, 4, 0xaa, AckReplace}, // a newer one only it holds
	} {
		if got := CheckAck(c.ver, c.sum, c.ackVer, c.ackSum); got != c.want {
			t.Errorf("CheckAck(%d, %x, %d, %x) = %s, want %s", c.ver, c.sum, c.ackVer, c.ackSum, got, c.want)
		}
	}
}
