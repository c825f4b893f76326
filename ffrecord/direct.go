package ffrecord

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Buffered or direct reads, chosen per dataset (ReadOptions.DirectAuto).
//
// Measured on this machine (docs/perf/loader.md, "Direct reads"): a
// dataset that fits in memory is read faster buffered, cold and warm,
// because O_DIRECT widens every sample to whole 4 KiB pages and never
// profits from the page cache (neighbouring samples share pages; a second
// epoch is served from memory). O_DIRECT pays off only when the page cache
// cannot hold the dataset: then a random epoch hits the cache for a
// fraction of its reads no larger than (cache / dataset), and buffered
// reads spend CPU filling and reclaiming pages while pushing everything
// else (the training process's files, other jobs) out of memory. So:
//
//   - buffered when at least half the dataset is in the page cache now;
//   - direct when the dataset is more than DirectAutoFactor times the
//     memory the page cache can use (what it holds of the dataset plus
//     the memory available: MemAvailable, or less under a cgroup limit);
//   - buffered otherwise, and on file systems that do not report their
//     page cache (ffkit:// paths: their storage services read for them).

// DirectAutoFactor: with DirectAuto, a dataset more than this many times
// the memory the page cache can use is read with O_DIRECT (at most a
// quarter of a random epoch's reads could hit the cache).
const DirectAutoFactor = 4

// ErrOptions: an option value that means nothing (a direct mode other
// than on, off or auto).
var ErrOptions = errkind.New(errkind.Usage, "ffrecord: bad option")

// DirectMode is how a Reader meets the page cache, as a user asks for it.
type DirectMode string

const (
	DirectOff  DirectMode = "off"  // buffered reads (the default)
	DirectOn   DirectMode = "on"   // O_DIRECT
	DirectAuto DirectMode = "auto" // chosen per dataset at Open (see above)
)

// ParseDirectMode reads off/on/auto (also false/true, 0/1, no/yes; ""
// is off).
func ParseDirectMode(s string) (DirectMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "off", "false", "0", "no":
		return DirectOff, nil
	case "on", "true", "1", "yes":
		return DirectOn, nil
	case "auto":
		return DirectAuto, nil
	}
	return "", fmt.Errorf("%w: direct %q: want on, off or auto", ErrOptions, s)
}

// DirectChoice is how a Reader reads and why (Reader.DirectChoice).
type DirectChoice struct {
	Mode   DirectMode `json:"mode"`   // what was asked
	Direct bool       `json:"direct"` // what Open chose
	Reason string     `json:"reason"`
	// What auto looked at (0 when it did not need to).
	DatasetBytes   int64 `json:"dataset_bytes,omitempty"`
	CachedBytes    int64 `json:"cached_bytes,omitempty"`
	AvailableBytes int64 `json:"available_bytes,omitempty"`
}

// String is one line for logs and summaries.
func (c DirectChoice) String() string {
	how := "buffered"
	if c.Direct {
		how = "direct"
	}
	return fmt.Sprintf("%s (%s: %s)", how, c.Mode, c.Reason)
}

// askedDirect is the choice of a Reader told on or off.
func askedDirect(direct bool) DirectChoice {
	if direct {
		return DirectChoice{Mode: DirectOn, Direct: true, Reason: "asked for"}
	}
	return DirectChoice{Mode: DirectOff, Reason: "asked for"}
}

// cacheReporter is an optional fs.FS capability: how much of a file the
// page cache holds (localfs).
type cacheReporter interface {
	CachedBytes(ctx context.Context, name string) (cached, size int64, err error)
}

// decideDirect is the rule, as a pure function of the dataset's size,
// what the page cache holds of it and the memory it could still use.
func decideDirect(dataset, cached, available int64) (bool, string) {
	switch {
	case dataset == 0:
		return false, "empty dataset"
	case 2*cached >= dataset:
		return false, fmt.Sprintf("%s of the %s dataset is in the page cache", sizeStr(cached), sizeStr(dataset))
	case dataset > DirectAutoFactor*(available+cached):
		return true, fmt.Sprintf("the %s dataset is more than %dx the %s the page cache can use: few reads could hit it",
			sizeStr(dataset), DirectAutoFactor, sizeStr(available+cached))
	}
	return false, fmt.Sprintf("the %s dataset is at most %dx the %s the page cache can use",
		sizeStr(dataset), DirectAutoFactor, sizeStr(available+cached))
}

// chooseDirect applies the rule to the sources of a dataset.
func chooseDirect(ctx context.Context, srcs []source) (DirectChoice, error) {
	c := DirectChoice{Mode: DirectAuto}
	var reporters []cacheReporter
	for _, s := range srcs {
		cr, ok := s.fsys.(cacheReporter)
		if !ok {
			c.Reason = fmt.Sprintf("%s does not report its page cache", s.display)
			return c, nil
		}
		reporters = append(reporters, cr)
		st, err := s.fsys.Stat(ctx, s.name)
		if err != nil {
			return c, fmt.Errorf("ffrecord: direct=auto: %s: %w", s.display, err)
		}
		c.DatasetBytes += st.Size
	}
	avail, err := availableMemory()
	if err != nil {
		c.Reason = fmt.Sprintf("available memory unknown (%v)", err)
		return c, nil
	}
	c.AvailableBytes = avail
	// Only a dataset larger than the factor times the available memory
	// can go direct; below that, what is cached does not matter.
	if c.DatasetBytes > DirectAutoFactor*avail {
		for i, s := range srcs {
			cached, _, err := reporters[i].CachedBytes(ctx, s.name)
			if err != nil {
				return c, fmt.Errorf("ffrecord: direct=auto: %s: %w", s.display, err)
			}
			c.CachedBytes += cached
		}
	}
	c.Direct, c.Reason = decideDirect(c.DatasetBytes, c.CachedBytes, c.AvailableBytes)
	return c, nil
}

// availableMemory is the memory the page cache could use: MemAvailable,
// bounded by a cgroup v2 limit (the limit minus the group's memory that
// is not file cache).
func availableMemory() (int64, error) {
	mi, err := readKV("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	kb, ok := mi["MemAvailable"]
	if !ok {
		return 0, fmt.Errorf("/proc/meminfo has no MemAvailable")
	}
	avail := kb * 1024
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if limit, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			cur, err1 := os.ReadFile("/sys/fs/cgroup/memory.current")
			st, err2 := readKV("/sys/fs/cgroup/memory.stat")
			if err1 == nil && err2 == nil {
				if used, err := strconv.ParseInt(strings.TrimSpace(string(cur)), 10, 64); err == nil {
					avail = min(avail, max(0, limit-(used-st["file"])))
				}
			}
		}
	}
	return avail, nil
}

// readKV reads "key: value [kB]" or "key value" lines.
func readKV(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.Replace(sc.Text(), ":", " ", 1))
		if len(fields) < 2 {
			continue
		}
		if v, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
			out[fields[0]] = v
		}
	}
	return out, sc.Err()
}

func sizeStr(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
