package loader

import (
	"fmt"
)

// ShuffleMode chooses how an epoch's order is made.
type ShuffleMode int

const (
	// Sequential delivers samples in index order.
	Sequential ShuffleMode = iota
	// Global delivers an exact, uniformly scrambled permutation of all
	// samples (a keyed bijection, see Perm).
	Global
	// Block reads contiguous blocks of samples and shuffles within a window
	// of blocks: the order of the blocks is a global permutation, then the
	// samples of each window of consecutive (permuted) blocks are permuted
	// among themselves. Reads of one batch touch few blocks and merge into
	// few large reads, which suits slow media; the price is that samples of
	// one block tend to arrive within the same window (see doc.go).
	Block
)

func (m ShuffleMode) String() string {
	switch m {
	case Sequential:
		return "sequential"
	case Global:
		return "global"
	case Block:
		return "block"
	}
	return fmt.Sprintf("ShuffleMode(%d)", int(m))
}

// OrderSpec is everything the order of one epoch depends on besides the
// epoch number: the number of items and the shuffle parameters.
type OrderSpec struct {
	N    int64
	Mode ShuffleMode
	Seed uint64
	// BlockSize and Window apply to Block mode: samples per block and
	// blocks per shuffle window.
	BlockSize int64
	Window    int64
}

// EpochOrder maps a position in an epoch's global stream to the item
// delivered there. It computes each position on the fly; the only state is
// a cache of the current block-shuffle window, so an EpochOrder belongs to
// one goroutine (make one per goroutine with Epoch).
type EpochOrder struct {
	spec  OrderSpec
	epoch int64
	perm  Perm // Global: over items; Block: over blocks

	// Block mode.
	nblocks   int64
	tailBlock int64 // position (in permuted block order) of the short last block, or -1
	tailShort int64 // how many samples the last block lacks
	win       blockWindow
}

type blockWindow struct {
	valid  bool
	w      int64
	start  int64   // first stream position of the window
	size   int64   // samples in the window
	blocks []int64 // block ids in window order
	ends   []int64 // running sample count after each block
	perm   Perm
}

// Epoch returns the order of one epoch.
func (s OrderSpec) Epoch(epoch int64) *EpochOrder {
	o := &EpochOrder{spec: s, epoch: epoch, tailBlock: -1}
	switch s.Mode {
	case Global:
		o.perm = NewPerm(s.N, deriveKey(tagEpochPerm, s.Seed, uint64(epoch)))
	case Block:
		k := s.BlockSize
		o.nblocks = (s.N + k - 1) / k
		o.perm = NewPerm(o.nblocks, deriveKey(tagBlockPerm, s.Seed, uint64(epoch)))
		if short := o.nblocks*k - s.N; short > 0 {
			o.tailShort = short
			o.tailBlock = o.perm.Inverse(o.nblocks - 1)
		}
	}
	return o
}

// Validate checks the spec.
func (s OrderSpec) Validate() error {
	if s.N < 0 {
		return fmt.Errorf("%w: negative sample count %d", ErrOptions, s.N)
	}
	switch s.Mode {
	case Sequential, Global:
	case Block:
		if s.BlockSize < 1 {
			return fmt.Errorf("%w: block shuffle needs a block size of at least 1 sample, got %d", ErrOptions, s.BlockSize)
		}
		if s.Window < 1 {
			return fmt.Errorf("%w: block shuffle needs a window of at least 1 block, got %d", ErrOptions, s.Window)
		}
	default:
		return fmt.Errorf("%w: unknown shuffle mode %d", ErrOptions, int(s.Mode))
	}
	return nil
}

// At returns the item at stream position p in [0, N).
func (o *EpochOrder) At(p int64) int64 {
	switch o.spec.Mode {
	case Global:
		return o.perm.At(p)
	case Block:
		return o.blockAt(p)
	}
	return p
}

// windowStart is the first stream position of window w (block positions
// [w*Window, (w+1)*Window)). Windows after the one holding the short tail
// block start tailShort samples earlier.
func (o *EpochOrder) windowStart(w int64) int64 {
	s := w * o.spec.Window * o.spec.BlockSize
	if o.tailBlock >= 0 && o.tailBlock < w*o.spec.Window {
		s -= o.tailShort
	}
	return s
}

func (o *EpochOrder) blockAt(p int64) int64 {
	ws := o.spec.Window * o.spec.BlockSize
	if !o.win.valid || p < o.win.start || p >= o.win.start+o.win.size {
		// The short tail block shifts later windows back by less than one
		// block, so the window is p/ws or one of its neighbours.
		nw := (o.nblocks + o.spec.Window - 1) / o.spec.Window
		w := min(p/ws, nw-1)
		if w+1 < nw && o.windowStart(w+1) <= p {
			w++
		} else if w > 0 && o.windowStart(w) > p {
			w--
		}
		o.loadWindow(w)
	}
	q := o.win.perm.At(p - o.win.start)
	// Find the block holding window offset q (blocks are few: linear scan
	// would do, binary search keeps large windows cheap).
	lo, hi := 0, len(o.win.ends)-1
	for lo < hi {
		mid := (lo + hi) / 2
		if o.win.ends[mid] > q {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	before := int64(0)
	if lo > 0 {
		before = o.win.ends[lo-1]
	}
	return o.win.blocks[lo]*o.spec.BlockSize + (q - before)
}

func (o *EpochOrder) loadWindow(w int64) {
	k := o.spec.BlockSize
	first := w * o.spec.Window
	last := min(first+o.spec.Window, o.nblocks)
	o.win.blocks = o.win.blocks[:0]
	o.win.ends = o.win.ends[:0]
	var size int64
	for bp := first; bp < last; bp++ {
		b := o.perm.At(bp)
		sz := k
		if b == o.nblocks-1 {
			sz = k - o.tailShort
		}
		size += sz
		o.win.blocks = append(o.win.blocks, b)
		o.win.ends = append(o.win.ends, size)
	}
	o.win.valid = true
	o.win.w = w
	o.win.start = o.windowStart(w)
	o.win.size = size
	o.win.perm = NewPerm(size, deriveKey(tagWindowPerm, o.spec.Seed, uint64(o.epoch), uint64(w)))
}

// Layout is how one epoch's global stream of N items is split among ranks
// and batches: DistributedSampler's strided split (rank r takes stream
// positions r, r+W, r+2W, ...) cut into batches of B.
//
// Without DropLast the stream is padded by wrapping to a multiple of the
// world size (the padding repeats the epoch's first positions, as
// DistributedSampler does), and each rank's last batch may be short. With
// DropLast every rank gets only full batches and nothing is padded: the
// tail that does not fill one batch on every rank is dropped.
//
// A segment starts at a stream position (0, or the cursor a run resumed
// from): the positions before it are consumed. Because the ranks advance
// in lockstep, after k batches on every rank the consumed positions are
// exactly the prefix [0, start + k*B*W), whatever the world size was, so
// a resume state is just that prefix length (the cursor). The split of
// the rest depends only on the cursor and the new world size, so a run
// resumed with another world size still delivers every remaining item
// exactly once (plus padding).
type Layout struct {
	N        int64 // items in the epoch's stream
	World    int64
	Rank     int64
	Batch    int64
	DropLast bool
	Start    int64 // cursor the segment starts at
}

// PerRank is the number of items each rank gets in the segment.
func (l Layout) PerRank() int64 {
	m := l.N - l.Start
	if m <= 0 {
		return 0
	}
	if l.DropLast {
		return m / (l.World * l.Batch) * l.Batch
	}
	return (m + l.World - 1) / l.World
}

// Batches is the number of batches each rank gets in the segment.
func (l Layout) Batches() int64 {
	return (l.PerRank() + l.Batch - 1) / l.Batch
}

// Padding is the number of padded (repeated) items across all ranks.
func (l Layout) Padding() int64 {
	if l.DropLast || l.N <= l.Start {
		return 0
	}
	return l.PerRank()*l.World - (l.N - l.Start)
}

// Dropped is the number of items no rank gets with DropLast.
func (l Layout) Dropped() int64 {
	if !l.DropLast || l.N <= l.Start {
		return 0
	}
	return (l.N - l.Start) - l.PerRank()*l.World
}

// BatchPositions appends the stream positions of this rank's batch k to
// dst and reports how many of them are padding (always at the end).
func (l Layout) BatchPositions(dst []int64, k int64) ([]int64, int) {
	per := l.PerRank()
	m := l.N - l.Start
	padded := 0
	for j := k * l.Batch; j < min((k+1)*l.Batch, per); j++ {
		s := l.Rank + j*l.World
		if s < m {
			dst = append(dst, l.Start+s)
		} else {
			dst = append(dst, (s-m)%l.N)
			padded++
		}
	}
	return dst, padded
}

// CursorAfter is the global cursor once every rank has taken k batches of
// the segment; it reaches N (or beyond, never past the padded end) at the
// end of the segment, which callers treat as the end of the epoch.
func (l Layout) CursorAfter(k int64) int64 {
	per := l.PerRank()
	if k*l.Batch >= per {
		return l.N
	}
	return l.Start + k*l.Batch*l.World
}
