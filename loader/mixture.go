package loader

import (
	"fmt"
	"math"
	"sort"
	"sync"
)

// mixture maps an item of a mixture epoch's stream to a sample of one of
// several datasets. An epoch of the mixture has Len items; source j gets
// exactly Quota[j] of them, the quotas being Len*w_j/sum(w) rounded by the
// largest remainder, so that they add up to Len.
//
// The items are numbered source by source (items [Q_0, Q_0+q_0) belong to
// source 0, and so on); the epoch's order, a permutation of the items like
// a single dataset's, interleaves the sources. The k-th item of source j in
// epoch e is that source's draw number t = e*q_j + k: draws walk through
// the source in passes of n_j samples, each pass a fresh permutation of
// the source (or index order without shuffling). A source smaller than its
// quota is repeated; a larger one continues where the previous epoch
// stopped, so every sample is seen before any is seen twice.
//
// Everything is a pure function of (seed, epoch, item), so a mixture is
// deterministic, rank-split and resumable exactly like one dataset.
type mixture struct {
	sizes   []int64
	weights []float64
	quota   []int64
	ends    []int64 // running sum of quota
	len     int64
	seed    uint64
	shuffle bool // permute each pass of a source

	mu    sync.Mutex
	cache []passPerm // per source, the permutation of its latest pass; guarded by mu
}

type passPerm struct {
	ok   bool
	pass int64
	perm Perm
}

func newMixture(sizes []int64, weights []float64, length int64, seed uint64, shuffle bool) (*mixture, error) {
	if len(sizes) != len(weights) {
		return nil, fmt.Errorf("%w: %d datasets but %d weights", ErrOptions, len(sizes), len(weights))
	}
	if len(sizes) == 0 {
		return nil, fmt.Errorf("%w: a mixture needs at least one dataset", ErrOptions)
	}
	var total float64
	for j, w := range weights {
		if !(w > 0) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("%w: mixture weight %d is %v; weights must be positive and finite", ErrOptions, j, w)
		}
		if sizes[j] <= 0 {
			return nil, fmt.Errorf("%w: mixture dataset %d is empty", ErrOptions, j)
		}
		total += w
	}
	if length <= 0 {
		for _, n := range sizes {
			length += n
		}
	}
	m := &mixture{sizes: sizes, weights: weights, len: length, seed: seed, shuffle: shuffle}
	m.quota = make([]int64, len(sizes))
	type rem struct {
		j int
		r float64
	}
	rems := make([]rem, len(sizes))
	var given int64
	for j, w := range weights {
		exact := float64(length) * w / total
		q := int64(math.Floor(exact))
		m.quota[j] = q
		given += q
		rems[j] = rem{j, exact - float64(q)}
	}
	sort.SliceStable(rems, func(a, b int) bool { return rems[a].r > rems[b].r })
	for i := 0; given < length; i++ {
		m.quota[rems[i%len(rems)].j]++
		given++
	}
	m.cache = make([]passPerm, len(sizes))
	m.ends = make([]int64, len(sizes))
	var run int64
	for j, q := range m.quota {
		run += q
		m.ends[j] = run
	}
	return m, nil
}

// at returns the source and its sample index for item v of epoch e.
func (m *mixture) at(epoch, v int64) (int, int64) {
	j := sort.Search(len(m.ends), func(i int) bool { return m.ends[i] > v })
	k := v
	if j > 0 {
		k -= m.ends[j-1]
	}
	t := epoch*m.quota[j] + k
	n := m.sizes[j]
	pass, o := t/n, t%n
	if !m.shuffle {
		return j, o
	}
	m.mu.Lock()
	c := &m.cache[j]
	if !c.ok || c.pass != pass {
		*c = passPerm{ok: true, pass: pass, perm: NewPerm(n, deriveKey(tagSourcePerm, m.seed, uint64(j), uint64(pass)))}
	}
	p := c.perm
	m.mu.Unlock()
	return j, p.At(o)
}
