package mgmtd

import (
	"fmt"
	"slices"

	"github.com/ffkit/ffkit/fs/proto"
)

// Placement builds the chain table from the registered targets: chains of
// replicas targets, no two on one node, heads rotated over the nodes so
// that write load spreads, every node used as evenly as its target count
// allows. Deterministic: the same targets give the same table. Targets
// left over (fewer nodes with free targets than replicas) stay unused.
func Placement(targets map[proto.TargetID]proto.NodeID, replicas int) ([]proto.Chain, error) {
	if replicas < 1 {
		return nil, fmt.Errorf("mgmtd: replicas must be >= 1, got %d", replicas)
	}
	byNode := map[proto.NodeID][]proto.TargetID{}
	for t, n := range targets {
		byNode[n] = append(byNode[n], t)
	}
	var nodes []proto.NodeID
	for n := range byNode {
		nodes = append(nodes, n)
		slices.Sort(byNode[n])
	}
	slices.Sort(nodes)
	if len(nodes) < replicas {
		return nil, fmt.Errorf("mgmtd: %d replicas need at least %d storage nodes, have %d", replicas, replicas, len(nodes))
	}
	var chains []proto.Chain
	for c := 0; ; c++ {
		var cand []int
		for i, n := range nodes {
			if len(byNode[n]) > 0 {
				cand = append(cand, i)
			}
		}
		if len(cand) < replicas {
			break
		}
		rot := func(i int) int { return ((i-c)%len(nodes) + len(nodes)) % len(nodes) }
		slices.SortFunc(cand, func(a, b int) int {
			if d := len(byNode[nodes[b]]) - len(byNode[nodes[a]]); d != 0 {
				return d
			}
			return rot(a) - rot(b)
		})
		pick := cand[:replicas]
		slices.SortFunc(pick, func(a, b int) int { return rot(a) - rot(b) })
		ch := proto.Chain{ID: proto.ChainID(c + 1), Version: 1}
		for _, i := range pick {
			n := nodes[i]
			ch.Targets = append(ch.Targets, proto.ChainTarget{ID: byNode[n][0], Node: n, State: proto.Serving})
			byNode[n] = byNode[n][1:]
		}
		chains = append(chains, ch)
	}
	return chains, nil
}
