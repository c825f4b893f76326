package proto

import (
	"testing"
	"time"
)

func TestHopMeter(t *testing.T) {
	var m HopMeter
	if m.Report() != nil {
		t.Fatal("empty meter reported")
	}
	ms := int64(time.Millisecond)
	// Round trip 100 ms, of which the node handled 70, 60 of them waiting
	// on its successor: 30 ms network, 10 ms own work.
	m.Sample(1, 2, 100*time.Millisecond, &WriteResp{Took: 70 * ms, Down: 60 * ms})
	// A stalled sample does not raise the least.
	m.Sample(1, 2, 5*time.Second, &WriteResp{Took: 4 * int64(time.Second), Down: 0})
	m.Sample(0, 3, 40*time.Millisecond, &WriteResp{Took: 30 * ms, Down: 10 * ms})
	m.Sample(0, 3, 40*time.Millisecond, &WriteResp{}) // an old server: no timings
	got := m.Report()
	want := []HopLatency{{From: 0, To: 3, Link: 10 * ms, Own: 20 * ms}, {From: 1, To: 2, Link: 30 * ms, Own: 10 * ms}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("report %+v, want %+v", got, want)
	}
	if r := m.Report(); r != nil {
		t.Fatalf("second report %+v, want none", r)
	}
}
