package loader

import "math/bits"

// feistelRounds is the number of Feistel rounds. Even, so that the half
// sizes of an unbalanced network are back in place after the last round;
// eight rounds with a 64-bit mixing round function are far more than
// Luby-Rackoff's four needed for a pseudorandom permutation.
const feistelRounds = 8

// smallPerm is the largest n for which a Perm is a table made by a keyed
// Fisher-Yates shuffle instead of a Feistel network. Feistel networks on
// tiny domains (halves of a few bits) need dozens of rounds before every
// permutation is equally likely; a table of at most 4096 entries (32 KiB
// with its inverse) is exactly uniform and costs nothing worth avoiding.
const smallPerm = 4096

// Perm is a keyed bijection of [0, n). For n above smallPerm it is computed
// on the fly: an unbalanced
// Feistel network over the smallest power-of-two domain [0, 2^b) with
// 2^b > n, restricted to [0, n) by cycle walking (re-encrypt until the
// value falls inside the range). The domain is at most 2n, so a lookup
// walks fewer than two steps on average. Nothing proportional to n is kept
// in memory.
//
// The domain is chosen strictly larger than n: a Feistel network on a
// domain of 4 or more elements only produces even permutations, and the
// walk over a larger domain is what makes odd permutations of [0, n)
// reachable too.
//
// The zero Perm (n == 0) is empty; a Perm is immutable and safe for
// concurrent use.
type Perm struct {
	n     int64
	lbits uint // bits of the left half (the right half has b-lbits)
	rbits uint
	keys  [feistelRounds]uint64
	// fwd and inv are the table of a small permutation (n <= smallPerm).
	fwd, inv []uint32
}

// NewPerm returns the permutation of [0, n) keyed by key.
func NewPerm(n int64, key uint64) Perm {
	if n > 1 && n <= smallPerm {
		return newTablePerm(n, key)
	}
	return newFeistelPerm(n, key)
}

// newTablePerm shuffles [0, n) with Fisher-Yates driven by a splitmix64
// stream seeded by key, drawing bounded integers without modulo bias.
func newTablePerm(n int64, key uint64) Perm {
	p := Perm{n: n, fwd: make([]uint32, n), inv: make([]uint32, n)}
	for i := range p.fwd {
		p.fwd[i] = uint32(i)
	}
	state := mix64(key ^ 0x2545f4914f6cdd1d)
	next := func() uint64 { state += 0x9e3779b97f4a7c15; return mix64(state) }
	for i := n - 1; i > 0; i-- {
		// Uniform j in [0, i] (Lemire's multiply-shift with rejection).
		bound := uint64(i + 1)
		hi, lo := bits.Mul64(next(), bound)
		if lo < bound {
			thresh := -bound % bound
			for lo < thresh {
				hi, lo = bits.Mul64(next(), bound)
			}
		}
		p.fwd[i], p.fwd[hi] = p.fwd[hi], p.fwd[i]
	}
	for i, v := range p.fwd {
		p.inv[v] = uint32(i)
	}
	return p
}

func newFeistelPerm(n int64, key uint64) Perm {
	p := Perm{n: n}
	if n <= 1 {
		return p
	}
	b := uint(bits.Len64(uint64(n))) // 2^b > n
	if b < 2 {
		b = 2
	}
	p.lbits = b / 2
	p.rbits = b - p.lbits
	k := mix64(key ^ 0x5bd1e9955bd1e995)
	for i := range p.keys {
		k = mix64(k + 0x9e3779b97f4a7c15)
		p.keys[i] = k
	}
	return p
}

// N is the size of the permuted range.
func (p Perm) N() int64 { return p.n }

// At returns the image of x, which must be in [0, n).
func (p Perm) At(x int64) int64 {
	if p.n <= 1 {
		return x
	}
	if p.fwd != nil {
		return int64(p.fwd[x])
	}
	y := uint64(x)
	for {
		y = p.encrypt(y)
		if y < uint64(p.n) {
			return int64(y)
		}
	}
}

// Inverse returns the x with At(x) == y.
func (p Perm) Inverse(y int64) int64 {
	if p.n <= 1 {
		return y
	}
	if p.inv != nil {
		return int64(p.inv[y])
	}
	x := uint64(y)
	for {
		x = p.decrypt(x)
		if x < uint64(p.n) {
			return int64(x)
		}
	}
}

// encrypt applies the Feistel network to x in [0, 2^b). The state is a
// left half L of sl bits and a right half R of sr bits; a round maps
// (L, R) to (R, L xor F(R)), which swaps the half sizes, so an even number
// of rounds restores them.
func (p Perm) encrypt(x uint64) uint64 {
	sl, sr := p.lbits, p.rbits
	l, r := x>>sr, x&(1<<sr-1)
	for i := 0; i < feistelRounds; i++ {
		nl := r
		nr := (l ^ mix64(r^p.keys[i])) & (1<<sl - 1)
		l, r = nl, nr
		sl, sr = sr, sl
	}
	return l<<sr | r
}

func (p Perm) decrypt(y uint64) uint64 {
	// After an even number of rounds the sizes are (lbits, rbits) again.
	sl, sr := p.lbits, p.rbits
	l, r := y>>sr, y&(1<<sr-1)
	for i := feistelRounds - 1; i >= 0; i-- {
		// (l, r) was produced from (pl, pr) by l = pr, r = pl ^ F(pr); the
		// sizes before the round were (sr, sl).
		pr := l
		pl := (r ^ mix64(pr^p.keys[i])) & (1<<sr - 1)
		l, r = pl, pr
		sl, sr = sr, sl
	}
	return l<<sr | r
}

// mix64 is the splitmix64 finaliser: a bijective 64-bit mixer with full
// avalanche, used as the Feistel round function and for key derivation.
func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// deriveKey hashes a tuple of integers into one 64-bit key. Each element is
// folded through the mixer so that (a, b) and (b, a) differ.
func deriveKey(parts ...uint64) uint64 {
	h := uint64(0x243f6a8885a308d3)
	for _, v := range parts {
		h = mix64(h ^ mix64(v+0x632be59bd9b4e019))
	}
	return h
}

// Domain tags keep keys derived for different purposes apart.
const (
	tagEpochPerm  = 1
	tagBlockPerm  = 2
	tagWindowPerm = 3
	tagSourcePerm = 4
	tagMixPerm    = 5
	tagSampleSeed = 6
)

// SampleSeed is the random seed handed to augmentations for one sample:
// a pure function of the loader's seed, the epoch and the sample's index
// (and, in a mixture, its source dataset), so augmented batches do not
// depend on worker count, prefetch depth, world size or resume points.
func SampleSeed(seed uint64, epoch int64, source int, index int64) uint64 {
	return deriveKey(tagSampleSeed, seed, uint64(epoch), uint64(source), uint64(index))
}
