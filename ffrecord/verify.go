package ffrecord

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
)

// VerifyOptions tune Verify.
type VerifyOptions struct {
	// Workers is the number of reads in flight. Default 4.
	Workers int
	// Direct reads with O_DIRECT. Default false.
	Direct bool
	// Progress, if set, is called with the number of sample bytes checked
	// since its last call. It may be called from several goroutines.
	Progress func(bytes int64)
}

// Fault kinds.
const (
	FaultHeader    = "header"    // header checksum mismatch
	FaultCorrupt   = "corrupt"   // impossible structure
	FaultTruncated = "truncated" // the file ends early
	FaultChecksum  = "checksum"  // a sample's bytes do not match its CRC
	FaultIO        = "io"        // the file could not be read
)

// Fault is one problem Verify found.
type Fault struct {
	Path    string `json:"path"`
	Index   int64  `json:"index"` // global sample index; -1 for a file-level fault or when unknown
	Local   int64  `json:"local"` // sample index in the file; -1 for a file-level fault
	Off     int64  `json:"off"`
	Len     int64  `json:"len"`
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// VerifiedFile is one file's result. Its JSON keys are those of `ffkit
// inspect --json`'s per-file entries for the same things.
type VerifiedFile struct {
	Path string `json:"path"`
	Size int64  `json:"bytes"`
	// N is the file's sample count: from a damaged header, the count it
	// claims where that is plausible for the file's size (Claimed); -1
	// when not even that can be read.
	N int64 `json:"samples"`
	// Claimed: N comes from a header whose checksum failed.
	Claimed bool `json:"claimed,omitempty"`
	// First is the global index of the file's first sample (-1 when an
	// earlier file's count is unknown).
	First   int64 `json:"first"`
	Legacy  bool  `json:"legacy"`
	Checked int64 `json:"checked"` // samples whose checksum was verified
	Faults  int   `json:"faults"`
}

// VerifyReport is Verify's result.
type VerifyReport struct {
	OK      bool           `json:"ok"`
	Files   []VerifiedFile `json:"files"`
	Samples int64          `json:"samples"`       // samples the headers describe, damaged ones by their claimed count
	Unknown int            `json:"unknown_files"` // files whose sample count cannot be read at all
	Checked int64          `json:"checked"`       // samples verified good
	Bytes   int64          `json:"bytes_read"`    // sample bytes read
	Faults  []Fault        `json:"faults"`        // never null: [] when all is good
}

// verifyChunk is how many bytes of consecutive samples one read covers.
const verifyChunk = 4 << 20

// Verify checks every header and every sample of a dataset and lists every
// fault: it keeps going past bad files and bad samples. The error is for
// paths that cannot be resolved or listed and for cancellation, not for bad
// data (see VerifyReport.OK).
func Verify(ctx context.Context, paths []string, opts VerifyOptions) (*VerifyReport, error) {
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	srcs, err := expand(ctx, paths)
	if err != nil {
		return nil, err
	}
	rep := &VerifyReport{Files: make([]VerifiedFile, len(srcs)), Faults: []Fault{}}
	var mu sync.Mutex // guards rep.Faults and rep.Files[i].Faults
	addFault := func(fi int, f Fault) {
		mu.Lock()
		rep.Faults = append(rep.Faults, f)
		rep.Files[fi].Faults++
		mu.Unlock()
	}
	var checked, bytes atomic.Int64
	fileChecked := make([]atomic.Int64, len(srcs))

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Workers)
	first := int64(0) // global index of the current file's first sample; -1 once unknown
	for fi, s := range srcs {
		vf := &rep.Files[fi]
		vf.Path, vf.N, vf.First = s.display, -1, first
		f, err := s.fsys.Open(ctx, s.name, fs.OpenOptions{Direct: opts.Direct})
		if err != nil {
			return nil, fmt.Errorf("ffrecord: open %s: %w", s.display, err)
		}
		defer f.Close()
		vf.Size = f.Size()
		h, herr := readHeader(ctx, f, s.display)
		if herr != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			addFault(fi, faultOf(s.display, first, herr))
		}
		if h == nil {
			// The header's own count, where plausible, keeps the totals
			// and the later files' global indices meaningful.
			if n := claimedSamples(f); n >= 0 {
				vf.N, vf.Claimed = n, true
				rep.Samples += n
				if first >= 0 {
					first += n
				}
			} else {
				rep.Unknown++
				first = -1 // later indices are unknown
			}
			continue
		}
		vf.N, vf.Legacy = h.n, h.legacy
		rep.Samples += h.n
		good := h.n
		if h.damaged >= 0 {
			good = h.damaged
		}
		base := first
		// Consecutive samples in chunks of about verifyChunk bytes.
		for a := int64(0); a < good; {
			b := a + 1
			for b < good && h.end(b)-h.offsets[a] <= verifyChunk {
				b++
			}
			lo, hi := a, b
			g.Go(func() error {
				buf := make([]byte, h.end(hi-1)-h.offsets[lo])
				if err := readFull(f, buf, h.offsets[lo]); err != nil {
					if gctx.Err() != nil {
						return gctx.Err()
					}
					for i := lo; i < hi; i++ {
						addFault(fi, sampleFault(h, base, i, FaultIO, fmt.Sprintf("read: %v", err)))
					}
					return nil
				}
				var good int64
				for i := lo; i < hi; i++ {
					s := buf[h.offsets[i]-h.offsets[lo] : h.end(i)-h.offsets[lo]]
					if got := crc32.Update(0, crcTable, s); got != h.crcs[i] {
						addFault(fi, sampleFault(h, base, i, FaultChecksum,
							fmt.Sprintf("checksum mismatch: stored %08x, computed %08x%s", h.crcs[i], got, lastHint(h, i))))
						continue
					}
					good++
				}
				checked.Add(good)
				fileChecked[fi].Add(good)
				bytes.Add(int64(len(buf)))
				if opts.Progress != nil {
					opts.Progress(int64(len(buf)))
				}
				return nil
			})
			a = b
		}
		if first >= 0 {
			first += h.n
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i := range rep.Files {
		rep.Files[i].Checked = fileChecked[i].Load()
	}
	rep.Checked, rep.Bytes = checked.Load(), bytes.Load()
	order := map[string]int{}
	for i, f := range rep.Files {
		order[f.Path] = i
	}
	sort.SliceStable(rep.Faults, func(a, b int) bool {
		fa, fb := rep.Faults[a], rep.Faults[b]
		if order[fa.Path] != order[fb.Path] {
			return order[fa.Path] < order[fb.Path]
		}
		return fa.Local < fb.Local
	})
	rep.OK = len(rep.Faults) == 0
	return rep, nil
}

func sampleFault(h *header, first, i int64, kind, msg string) Fault {
	idx := int64(-1)
	if first >= 0 {
		idx = first + i
	}
	return Fault{Path: h.path, Index: idx, Local: i, Off: h.offsets[i], Len: h.end(i) - h.offsets[i], Kind: kind, Message: msg}
}

// claimedSamples reads the sample count a file's prefix claims, or -1 when
// it cannot be read or cannot fit the file.
func claimedSamples(f fs.File) int64 {
	var b [prefixLen]byte
	if readFull(f, b[:], 0) != nil {
		return -1
	}
	n := int64(binary.LittleEndian.Uint64(b[4:12]))
	if n < 0 || n > (f.Size()-prefixLen)/perSample {
		return -1
	}
	return n
}

// faultOf turns a header error into a Fault. Its message does not repeat
// the path, which the Fault names.
func faultOf(path string, first int64, err error) Fault {
	f := Fault{Path: path, Index: -1, Local: -1, Message: strings.TrimPrefix(err.Error(), path+": ")}
	switch {
	case errors.Is(err, ErrTruncated):
		f.Kind = FaultTruncated
	case errors.Is(err, ErrChecksum):
		f.Kind = FaultHeader
	case errors.Is(err, ErrCorrupt):
		f.Kind = FaultCorrupt
	default:
		f.Kind = FaultIO
	}
	var se *SampleError
	if errors.As(err, &se) {
		f.Local, f.Off, f.Len = se.Local, se.Off, se.Len
		if first >= 0 {
			f.Index = first + se.Local
		}
		f.Message = se.Err.Error()
	} else if f.Kind == FaultTruncated {
		f.Local = 0 // cut inside the header: sample 0 is the first missing
		if first >= 0 {
			f.Index = first
		}
	}
	return f
}
