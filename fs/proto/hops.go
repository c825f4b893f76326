package proto

import (
	"slices"
	"sync"
	"time"
)

// HopLatency is one reporter's view, since its last report, of the
// updates it sent one storage node along the write path (a client's
// writes to a chain head, a storage node's forwards to its successor):
// Link is the fastest round trip's network part (the round trip minus the
// node's handling time, WriteResp.Took), Own the least time the node
// spent on its own work (Took minus WriteResp.Down). Both in ns, 0 when
// unknown. From is the reporting storage node, 0 for a client. mgmtd
// judges every node by its hops (fs/mgmtd/slow.go): a node slow to
// forward or to acknowledge shows on every hop it is an end of.
type HopLatency struct {
	From NodeID `json:"from,omitempty"`
	To   NodeID `json:"to"`
	Link int64  `json:"link,omitempty"`
	Own  int64  `json:"own,omitempty"`
}

// HopMeter collects HopLatency samples between reports: the least link
// and own time per hop (a persistently slow node is slow in every
// sample; a single stall, such as a request that waited out a pause, is
// not the least). Safe for concurrent use; the zero value is ready.
type HopMeter struct {
	mu   sync.Mutex // guards hops
	hops map[[2]NodeID]HopLatency
}

// Sample records one answered update from from to to that took rtt at the
// sender and was answered with resp.
func (m *HopMeter) Sample(from, to NodeID, rtt time.Duration, resp *WriteResp) {
	if resp == nil || resp.Took <= 0 || rtt <= 0 {
		return // an old server, or an answer without timings
	}
	link := max(int64(rtt)-resp.Took, 1)
	own := max(resp.Took-resp.Down, 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hops == nil {
		m.hops = map[[2]NodeID]HopLatency{}
	}
	k := [2]NodeID{from, to}
	h, ok := m.hops[k]
	if !ok {
		m.hops[k] = HopLatency{From: from, To: to, Link: link, Own: own}
		return
	}
	h.Link, h.Own = min(h.Link, link), min(h.Own, own)
	m.hops[k] = h
}

// Report returns the hops sampled since the last Report (sorted by from,
// to) and starts afresh; nil when there were none.
func (m *HopMeter) Report() []HopLatency {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.hops) == 0 {
		return nil
	}
	out := make([]HopLatency, 0, len(m.hops))
	for _, h := range m.hops {
		out = append(out, h)
	}
	clear(m.hops)
	slices.SortFunc(out, func(a, b HopLatency) int {
		if a.From != b.From {
			return int(a.From) - int(b.From)
		}
		return int(a.To) - int(b.To)
	})
	return out
}
