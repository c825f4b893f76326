package loader

import (
	"fmt"
	"math"
	"testing"
)

func TestPermBijection(t *testing.T) {
	for _, n := range []int64{0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 100, 1000, 4096, 65537} {
		for key := uint64(0); key < 4; key++ {
			p := NewPerm(n, key*7919)
			if key >= 2 {
				p = newFeistelPerm(n, key) // the large-n path on small n too
			}
			seen := make([]bool, n)
			for x := int64(0); x < n; x++ {
				y := p.At(x)
				if y < 0 || y >= n {
					t.Fatalf("n=%d key=%d: At(%d)=%d out of range", n, key, x, y)
				}
				if seen[y] {
					t.Fatalf("n=%d key=%d: At maps two inputs to %d", n, key, y)
				}
				seen[y] = true
				if back := p.Inverse(y); back != x {
					t.Fatalf("n=%d key=%d: Inverse(At(%d)) = %d", n, key, x, back)
				}
			}
		}
	}
}

// chiSquareLimit is a generous upper bound for a chi-square statistic with
// df degrees of freedom (mean df, variance 2df): mean + 6 standard
// deviations, so a correct generator fails with probability ~1e-9 and a
// biased one (a fixed point, only even permutations, a correlation) fails
// by a wide margin.
func chiSquareLimit(df int) float64 { return float64(df) + 6*math.Sqrt(2*float64(df)) }

func TestPermUniformPositions(t *testing.T) {
	// Where does each input land? Over many keys every (input, output)
	// cell should be hit equally often.
	const n, keys = 12, 24000
	var count [n][n]float64
	for k := 0; k < keys; k++ {
		p := NewPerm(n, deriveKey(tagEpochPerm, 42, uint64(k)))
		for x := int64(0); x < n; x++ {
			count[x][p.At(x)]++
		}
	}
	e := float64(keys) / n
	var chi float64
	for x := range count {
		for y := range count[x] {
			d := count[x][y] - e
			chi += d * d / e
		}
	}
	if lim := chiSquareLimit((n - 1) * (n - 1)); chi > lim {
		t.Fatalf("positions not uniform: chi-square %.1f > %.1f", chi, lim)
	}
}

func TestFeistelUniformBuckets(t *testing.T) {
	// The on-the-fly path (n > smallPerm): inputs and outputs grouped into
	// 16 buckets each; over many keys every (input bucket, output bucket)
	// cell must be equally likely.
	const n, keys, nb = 5003, 400, 16
	var count [nb][nb]float64
	for k := 0; k < keys; k++ {
		p := NewPerm(n, uint64(k))
		if p.fwd != nil {
			t.Fatal("expected the Feistel path")
		}
		for x := int64(0); x < n; x += 7 {
			count[x*nb/n][p.At(x)*nb/n]++
		}
	}
	var total float64
	for i := range count {
		for j := range count[i] {
			total += count[i][j]
		}
	}
	var chi float64
	for i := range count {
		var row float64
		for j := range count[i] {
			row += count[i][j]
		}
		for j := range count[i] {
			e := row / nb
			d := count[i][j] - e
			chi += d * d / e
		}
	}
	if lim := chiSquareLimit(nb * (nb - 1)); chi > lim {
		t.Fatalf("Feistel buckets not uniform: chi-square %.1f > %.1f", chi, lim)
	}
}

func TestPermUniformWholePermutations(t *testing.T) {
	// For n=4 and n=5 every one of the n! permutations must occur, equally
	// often: this catches a network that only reaches even permutations.
	for _, n := range []int64{4, 5} {
		fact := 1
		for i := 2; i <= int(n); i++ {
			fact *= i
		}
		keys := fact * 400
		counts := map[string]int{}
		for k := 0; k < keys; k++ {
			p := NewPerm(n, uint64(k)*0x9e3779b97f4a7c15+1)
			s := ""
			for x := int64(0); x < n; x++ {
				s += fmt.Sprint(p.At(x))
			}
			counts[s]++
		}
		if len(counts) != fact {
			t.Fatalf("n=%d: %d of %d permutations reached", n, len(counts), fact)
		}
		e := float64(keys) / float64(fact)
		var chi float64
		for _, c := range counts {
			d := float64(c) - e
			chi += d * d / e
		}
		if lim := chiSquareLimit(fact - 1); chi > lim {
			t.Fatalf("n=%d: permutations not uniform: chi-square %.1f > %.1f", n, chi, lim)
		}
	}
}

func TestPermLargeLooksRandom(t *testing.T) {
	// A large permutation: neighbours in the output are not neighbours in
	// the input, and about half of all pairs are inversions.
	const n = 200003
	p := NewPerm(n, 7)
	var close, inv, pairs int
	prev := p.At(0)
	for x := int64(1); x < n; x++ {
		y := p.At(x)
		if d := y - prev; d >= -8 && d <= 8 {
			close++
		}
		prev = y
	}
	// Expected close pairs: n * 16/n = 16.
	if close > 60 {
		t.Fatalf("%d of %d consecutive outputs within 8 of each other (expect ~16)", close, n)
	}
	// Disjoint pairs (x, x+n/2) are independent trials.
	for x := int64(0); x < n/2; x++ {
		pairs++
		if p.At(x) > p.At(x+n/2) {
			inv++
		}
	}
	frac := float64(inv) / float64(pairs)
	sd := 0.5 / math.Sqrt(float64(pairs))
	if math.Abs(frac-0.5) > 6*sd {
		t.Fatalf("inversion fraction %.4f, want 0.5 +- %.4f", frac, 6*sd)
	}
	// Different epochs give unrelated permutations.
	a := OrderSpec{N: n, Mode: Global, Seed: 1}.Epoch(0)
	b := OrderSpec{N: n, Mode: Global, Seed: 1}.Epoch(1)
	same := 0
	for x := int64(0); x < n; x++ {
		if a.At(x) == b.At(x) {
			same++
		}
	}
	if same > 20 {
		t.Fatalf("epochs 0 and 1 agree on %d positions (expect ~1)", same)
	}
}

func TestBlockOrderIsPermutationAndLocal(t *testing.T) {
	for _, c := range []struct{ n, k, w int64 }{
		{1, 1, 1}, {10, 3, 2}, {100, 7, 3}, {1000, 64, 4}, {1000, 1000, 1}, {1001, 10, 1000}, {4097, 64, 16}, {12345, 100, 7},
	} {
		for epoch := int64(0); epoch < 3; epoch++ {
			spec := OrderSpec{N: c.n, Mode: Block, Seed: 9, BlockSize: c.k, Window: c.w}
			if err := spec.Validate(); err != nil {
				t.Fatal(err)
			}
			o := spec.Epoch(epoch)
			seen := make([]bool, c.n)
			blocksInWindow := map[int64]bool{}
			windowItems := int64(0)
			for p := int64(0); p < c.n; p++ {
				x := o.At(p)
				if x < 0 || x >= c.n || seen[x] {
					t.Fatalf("%+v epoch %d: position %d gives %d (repeat or out of range)", c, epoch, p, x)
				}
				seen[x] = true
				// Locality: a window of c.w blocks holds at most c.w*c.k
				// items and touches at most c.w blocks.
				blocksInWindow[x/c.k] = true
				windowItems++
				if o.win.start+o.win.size == p+1 {
					if int64(len(blocksInWindow)) > c.w {
						t.Fatalf("%+v: window touches %d blocks", c, len(blocksInWindow))
					}
					blocksInWindow = map[int64]bool{}
					windowItems = 0
				}
			}
			// Random access in any order gives the same answers.
			o2 := spec.Epoch(epoch)
			for p := c.n - 1; p >= 0; p -= 3 {
				if a, b := o2.At(p), spec.Epoch(epoch).At(p); a != b {
					t.Fatalf("%+v: At(%d) depends on access order: %d vs %d", c, p, a, b)
				}
			}
		}
	}
}

// takeAll returns each rank's batches of a segment.
func takeAll(l Layout, world int64) [][][]int64 {
	out := make([][][]int64, world)
	for r := int64(0); r < world; r++ {
		l.Rank, l.World = r, world
		for k := int64(0); k < l.Batches(); k++ {
			b, _ := l.BatchPositions(nil, k)
			out[r] = append(out[r], b)
		}
	}
	return out
}

func TestLayoutRankBalanceAndCoverage(t *testing.T) {
	for _, n := range []int64{1, 2, 5, 10, 97, 100, 1000} {
		for _, w := range []int64{1, 2, 3, 4, 7, 8} {
			for _, bsz := range []int64{1, 3, 8, 32} {
				for _, drop := range []bool{false, true} {
					l := Layout{N: n, Batch: bsz, DropLast: drop}
					all := takeAll(l, w)
					count := make([]int, n)
					for r := range all {
						if len(all[r]) != len(all[0]) {
							t.Fatalf("n=%d w=%d b=%d drop=%v: rank %d has %d batches, rank 0 %d", n, w, bsz, drop, r, len(all[r]), len(all[0]))
						}
						for k, b := range all[r] {
							if len(b) != len(all[0][k]) {
								t.Fatalf("n=%d w=%d b=%d: rank %d batch %d has %d items, rank 0 %d", n, w, bsz, r, k, len(b), len(all[0][k]))
							}
							if drop && len(b) != int(bsz) {
								t.Fatalf("drop-last gave a short batch of %d", len(b))
							}
							for _, p := range b {
								count[p]++
							}
						}
					}
					l.World = w
					extra, missing := 0, 0
					for _, c := range count {
						if c == 0 {
							missing++
						}
						if c > 1 {
							extra += c - 1
						}
					}
					if drop {
						if extra != 0 || int64(missing) != l.Dropped() || l.Dropped() >= w*bsz {
							t.Fatalf("n=%d w=%d b=%d drop: %d repeats, %d missing, Dropped()=%d", n, w, bsz, extra, missing, l.Dropped())
						}
					} else {
						pad := (n+w-1)/w*w - n
						if missing != 0 || int64(extra) != pad || l.Padding() != pad {
							t.Fatalf("n=%d w=%d b=%d: %d missing, %d repeats, want 0 and %d", n, w, bsz, missing, extra, pad)
						}
					}
				}
			}
		}
	}
}

func TestLayoutResumeSameWorldMatches(t *testing.T) {
	for _, drop := range []bool{false, true} {
		const n, w, bsz = 103, 4, 5
		full := takeAll(Layout{N: n, Batch: bsz, DropLast: drop}, w)
		for k := int64(0); k <= int64(len(full[0])); k++ {
			cur := Layout{N: n, Batch: bsz, World: w, DropLast: drop}.CursorAfter(k)
			if cur >= n {
				continue
			}
			rest := takeAll(Layout{N: n, Batch: bsz, DropLast: drop, Start: cur}, w)
			for r := range full {
				got := append(append([][]int64{}, full[r][:k]...), rest[r]...)
				if fmt.Sprint(got) != fmt.Sprint(full[r]) {
					t.Fatalf("drop=%v resume after %d batches, rank %d:\n got %v\nwant %v", drop, k, r, got, full[r])
				}
			}
		}
	}
}

func TestLayoutElasticExactlyOnce(t *testing.T) {
	for _, c := range []struct{ n, w1, w2, b1, b2, k int64 }{
		{1000, 4, 3, 8, 8, 5}, {1000, 3, 8, 10, 4, 7}, {997, 8, 1, 16, 16, 3}, {50, 2, 7, 4, 2, 1}, {64, 4, 4, 4, 8, 2},
	} {
		first := takeAll(Layout{N: c.n, Batch: c.b1}, c.w1)
		cur := Layout{N: c.n, Batch: c.b1, World: c.w1}.CursorAfter(c.k)
		rest := takeAll(Layout{N: c.n, Batch: c.b2, Start: cur}, c.w2)
		count := make([]int, c.n)
		for r := range first {
			for _, b := range first[r][:c.k] {
				for _, p := range b {
					count[p]++
				}
			}
		}
		for r := range rest {
			if len(rest[r]) != len(rest[0]) {
				t.Fatalf("%+v: unequal batches after elastic resume", c)
			}
			for _, b := range rest[r] {
				for _, p := range b {
					count[p]++
				}
			}
		}
		pad := Layout{N: c.n, Batch: c.b2, World: c.w2, Start: cur}.Padding()
		extra := 0
		for p, cnt := range count {
			if cnt == 0 {
				t.Fatalf("%+v: position %d skipped", c, p)
			}
			extra += cnt - 1
		}
		if int64(extra) != pad || pad >= c.w2 {
			t.Fatalf("%+v: %d repeats, padding %d", c, extra, pad)
		}
	}
}

func TestMixtureExactProportions(t *testing.T) {
	sizes := []int64{10, 1000, 37}
	m, err := newMixture(sizes, []float64{0.5, 0.3, 0.2}, 999, 5, true)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for j, q := range m.quota {
		sum += q
		want := 999 * []float64{0.5, 0.3, 0.2}[j]
		if math.Abs(float64(q)-want) >= 1 {
			t.Fatalf("quota %d = %d, want %v rounded", j, q, want)
		}
	}
	if sum != 999 {
		t.Fatalf("quotas add to %d", sum)
	}
	// Every epoch draws exactly the quotas; a source cycles through all of
	// its samples before repeating one.
	seen := make([]map[int64]int, len(sizes))
	for j := range seen {
		seen[j] = map[int64]int{}
	}
	draws := make([]int64, len(sizes))
	for epoch := int64(0); epoch < 4; epoch++ {
		perEpoch := make([]int64, len(sizes))
		for v := int64(0); v < m.len; v++ {
			j, idx := m.at(epoch, v)
			if idx < 0 || idx >= sizes[j] {
				t.Fatalf("source %d index %d out of range", j, idx)
			}
			perEpoch[j]++
			seen[j][idx]++
			draws[j]++
			// After d draws every sample has been drawn floor(d/n) or
			// ceil(d/n) times.
			lo := draws[j] / sizes[j]
			if c := int64(seen[j][idx]); c > lo+1 {
				t.Fatalf("source %d sample %d drawn %d times after %d draws", j, idx, c, draws[j])
			}
		}
		for j := range perEpoch {
			if perEpoch[j] != m.quota[j] {
				t.Fatalf("epoch %d: source %d drawn %d times, quota %d", epoch, j, perEpoch[j], m.quota[j])
			}
		}
	}
	if _, err := newMixture([]int64{5}, []float64{-1}, 0, 0, true); err == nil {
		t.Fatal("negative weight accepted")
	}
	if _, err := newMixture([]int64{0, 5}, []float64{1, 1}, 0, 0, true); err == nil {
		t.Fatal("empty dataset accepted in a mixture")
	}
}
