package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrBadIOConfig: an I/O configuration file that cannot be used.
var ErrBadIOConfig = errkind.New(errkind.Data, "bench: bad io config")

// IOConfigVersion is the format version IOConfig files carry.
const IOConfigVersion = 1

// IOConfig is the best I/O configuration found by `ffkit bench sweep`,
// written as a small JSON file that `ffkit load --io-config FILE` reads:
//
//	{
//	  "version": 1,
//	  "mode": "read",
//	  "block_size": 1048576,
//	  "queue_depth": 16,
//	  "threads": 4,
//	  "direct": true,
//	  "mib_s": 2150.3,
//	  "iops": 2150.3,
//	  "path": "/data/bench",
//	  "measured_at": "2026-11-30T01:00:00Z",
//	  "source": "ffkit bench sweep"
//	}
//
// Meaning for a reader: issue reads of BlockSize bytes (a read larger than
// that is split; neighbouring small reads may be merged up to it), keep
// QueueDepth reads in flight per thread (one fs.ReadBatch of QueueDepth
// requests), on Threads threads, opening files with O_DIRECT when Direct.
// Unknown fields are ignored so later versions can add some; a file with a
// larger version is refused.
type IOConfig struct {
	Version    int       `json:"version"`
	Mode       string    `json:"mode"` // "read" or "write": what was measured
	BlockSize  int64     `json:"block_size"`
	QueueDepth int       `json:"queue_depth"`
	Threads    int       `json:"threads"`
	Direct     bool      `json:"direct"`
	MiBPerSec  float64   `json:"mib_s"` // the measured throughput of this configuration
	IOPS       float64   `json:"iops"`
	Path       string    `json:"path,omitempty"` // the storage measured
	MeasuredAt time.Time `json:"measured_at"`
	Source     string    `json:"source,omitempty"`
}

// Validate checks that the configuration is usable.
func (c IOConfig) Validate() error {
	switch {
	case c.Version < 1 || c.Version > IOConfigVersion:
		return fmt.Errorf("%w: version %d (this ffkit reads version %d)", ErrBadIOConfig, c.Version, IOConfigVersion)
	case c.Mode != "read" && c.Mode != "write":
		return fmt.Errorf("%w: mode %q (want read or write)", ErrBadIOConfig, c.Mode)
	case c.BlockSize <= 0 || c.BlockSize > 1<<30:
		return fmt.Errorf("%w: block_size %d (want 1..1 GiB)", ErrBadIOConfig, c.BlockSize)
	case c.QueueDepth <= 0 || c.QueueDepth > 1<<16:
		return fmt.Errorf("%w: queue_depth %d (want 1..65536)", ErrBadIOConfig, c.QueueDepth)
	case c.Threads <= 0 || c.Threads > 1<<12:
		return fmt.Errorf("%w: threads %d (want 1..4096)", ErrBadIOConfig, c.Threads)
	}
	return nil
}

// ReadIOConfig reads and validates an IOConfig file (a local path).
func ReadIOConfig(path string) (IOConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return IOConfig{}, fmt.Errorf("read io config: %w", err)
	}
	var c IOConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return IOConfig{}, fmt.Errorf("%w: %s: %w", ErrBadIOConfig, path, err)
	}
	if err := c.Validate(); err != nil {
		return IOConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// WriteIOConfig validates c and writes it to path atomically (a local path).
func WriteIOConfig(path string, c IOConfig) error {
	if c.Version == 0 {
		c.Version = IOConfigVersion
	}
	if err := c.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write io config: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write io config %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write io config %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write io config %s: %w", path, err)
	}
	return nil
}
