package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrNoFio: fio is not installed (apt-get install fio).
var ErrNoFio = errkind.New(errkind.Unavailable, "bench: fio is not installed")

// ErrFio: fio ran but failed or printed something we cannot read.
var ErrFio = errkind.New(errkind.Other, "bench: fio failed")

// FioAvailable reports whether fio is on PATH.
func FioAvailable() bool {
	_, err := exec.LookPath("fio")
	return err == nil
}

// FioJob describes one fio run. Figures are aggregated over all jobs
// (group_reporting).
type FioJob struct {
	// Name of the job (also the file-name stem fio uses in Directory).
	// Default "ffkit".
	Name string
	// Filenames to run on. One file: one job section with NumJobs jobs
	// sharing it. Several files: one job section per file, or with
	// SpreadFiles one section whose I/Os go to the files at random (fio's
	// file_service_type=random). Empty: fio creates its own files in
	// Directory (one per job).
	Filenames []string
	// SpreadFiles runs one job over all Filenames (see there).
	SpreadFiles bool
	// Directory for fio-created files when Filenames is empty.
	Directory string
	// RW is fio's rw: read, write, randread, randwrite. Required.
	RW string
	// BlockSize in bytes. Required.
	BlockSize int64
	// Size per job (or per file). 0: the whole existing file.
	Size int64
	// IODepth, NumJobs: default 1.
	IODepth int
	NumJobs int
	// Direct uses O_DIRECT.
	Direct bool
	// IOEngine: default "" tries io_uring, then libaio, then psync (the
	// first that works here; Result.Engine says which).
	IOEngine string
	// Runtime makes the job time-based when > 0; else it moves Size once.
	Runtime time.Duration
	// RampTime is fio's warm-up, excluded from its figures.
	RampTime time.Duration
	// EndFsync fsyncs each file when its job finishes (counted in the time).
	EndFsync bool
	// Extra fio arguments, e.g. "--fsync_on_close=1".
	Extra []string
}

// FioSide is fio's figures for one direction.
type FioSide struct {
	Bytes       int64   `json:"bytes"`
	BytesPerSec float64 `json:"bytes_s"`
	MiBPerSec   float64 `json:"mib_s"`
	IOPS        float64 `json:"iops"`
	// Latency is fio's completion latency (clat) percentiles.
	Latency Latency `json:"latency"`
}

// FioResult is what fio measured.
type FioResult struct {
	Version string   `json:"version"`
	Engine  string   `json:"engine"`
	Args    []string `json:"args"`
	Read    FioSide  `json:"read"`
	Write   FioSide  `json:"write"`
}

// Side returns the figures of the direction the job's rw names.
func (r *FioResult) Side(rw string) FioSide {
	if strings.Contains(rw, "write") {
		return r.Write
	}
	return r.Read
}

// Args returns the fio command line (without "fio") for the job with the
// given engine.
func (j FioJob) Args(engine string) ([]string, error) {
	if j.RW == "" || j.BlockSize <= 0 {
		return nil, fmt.Errorf("%w: fio job needs rw and a block size", ErrBadOptions)
	}
	if len(j.Filenames) == 0 && j.Directory == "" {
		return nil, fmt.Errorf("%w: fio job needs files or a directory", ErrBadOptions)
	}
	name := j.Name
	if name == "" {
		name = "ffkit"
	}
	a := []string{"--output-format=json", "--group_reporting", "--ioengine=" + engine,
		"--rw=" + j.RW, "--bs=" + strconv.FormatInt(j.BlockSize, 10),
		"--iodepth=" + strconv.Itoa(max(1, j.IODepth)), "--numjobs=" + strconv.Itoa(max(1, j.NumJobs)),
		"--invalidate=1", "--randrepeat=0", "--norandommap"}
	if j.Direct {
		a = append(a, "--direct=1")
	}
	if j.Size > 0 {
		a = append(a, "--size="+strconv.FormatInt(j.Size, 10))
	}
	if j.Runtime > 0 {
		a = append(a, "--time_based", "--runtime="+msArg(j.Runtime))
	}
	if j.RampTime > 0 {
		a = append(a, "--ramp_time="+msArg(j.RampTime))
	}
	if j.EndFsync {
		a = append(a, "--end_fsync=1")
	}
	if j.Directory != "" {
		a = append(a, "--directory="+j.Directory)
	}
	a = append(a, j.Extra...)
	switch {
	case len(j.Filenames) == 0:
		a = append(a, "--name="+name)
	case len(j.Filenames) > 1 && j.SpreadFiles:
		esc := make([]string, len(j.Filenames))
		for i, f := range j.Filenames {
			esc[i] = fioEscape(f)
		}
		a = append(a, "--name="+name, "--file_service_type=random", "--filename="+strings.Join(esc, ":"))
	case len(j.Filenames) == 1:
		a = append(a, "--name="+name, "--filename="+fioEscape(j.Filenames[0]))
	default:
		for i, f := range j.Filenames {
			a = append(a, fmt.Sprintf("--name=%s%d", name, i), "--filename="+fioEscape(f))
		}
	}
	return a, nil
}

func msArg(d time.Duration) string { return strconv.FormatInt(max(1, d.Milliseconds()), 10) + "ms" }

// fio splits filenames on ':'.
func fioEscape(p string) string { return strings.ReplaceAll(p, ":", `\:`) }

var (
	engineMu   sync.Mutex
	goodEngine string // guarded by engineMu; the first default engine that worked
)

// RunFio runs the job and parses fio's JSON output.
func RunFio(ctx context.Context, job FioJob) (*FioResult, error) {
	path, err := exec.LookPath("fio")
	if err != nil {
		return nil, ErrNoFio
	}
	engines := []string{job.IOEngine}
	if job.IOEngine == "" {
		engineMu.Lock()
		if goodEngine != "" {
			engines = []string{goodEngine}
		} else {
			engines = []string{"io_uring", "libaio", "psync"}
		}
		engineMu.Unlock()
	}
	var errs []error
	for _, eng := range engines {
		args, err := job.Args(eng)
		if err != nil {
			return nil, err
		}
		cmd := exec.CommandContext(ctx, path, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		runErr := cmd.Run()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		res, perr := ParseFio(stdout.Bytes())
		if runErr == nil && perr == nil {
			res.Engine, res.Args = eng, args
			if job.IOEngine == "" {
				engineMu.Lock()
				goodEngine = eng
				engineMu.Unlock()
			}
			return res, nil
		}
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 400 {
			msg = msg[:400] + "..."
		}
		if runErr != nil {
			errs = append(errs, fmt.Errorf("%w: engine %s: %v: %s", ErrFio, eng, runErr, msg))
		} else {
			errs = append(errs, fmt.Errorf("engine %s: %w: %s", eng, perr, msg))
		}
	}
	return nil, errors.Join(errs...)
}

// ParseFio parses fio's --output-format=json output (text before the
// first '{', such as warnings, is skipped). Figures are summed over the
// jobs listed (one with group_reporting); latency is the first job's.
func ParseFio(out []byte) (*FioResult, error) {
	i := bytes.IndexByte(out, '{')
	if i < 0 {
		return nil, fmt.Errorf("%w: no JSON in fio's output", ErrFio)
	}
	var doc struct {
		Version string `json:"fio version"`
		Jobs    []struct {
			Name  string  `json:"jobname"`
			Error int     `json:"error"`
			Read  fioSide `json:"read"`
			Write fioSide `json:"write"`
		} `json:"jobs"`
	}
	dec := json.NewDecoder(bytes.NewReader(out[i:]))
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: parse fio JSON: %w", ErrFio, err)
	}
	if len(doc.Jobs) == 0 {
		return nil, fmt.Errorf("%w: fio reported no jobs", ErrFio)
	}
	r := &FioResult{Version: doc.Version}
	for k, j := range doc.Jobs {
		if j.Error != 0 {
			return nil, fmt.Errorf("%w: job %s: error %d", ErrFio, j.Name, j.Error)
		}
		j.Read.addTo(&r.Read, k == 0)
		j.Write.addTo(&r.Write, k == 0)
	}
	return r, nil
}

type fioSide struct {
	IOBytes  int64   `json:"io_bytes"`
	BWBytes  float64 `json:"bw_bytes"`
	IOPS     float64 `json:"iops"`
	ClatNS   fioLat  `json:"clat_ns"`
	LatNS    fioLat  `json:"lat_ns"`
	TotalIOs int64   `json:"total_ios"`
}

type fioLat struct {
	Min        float64            `json:"min"`
	Max        float64            `json:"max"`
	Mean       float64            `json:"mean"`
	N          int                `json:"N"`
	Percentile map[string]float64 `json:"percentile"`
}

func (s fioSide) addTo(d *FioSide, first bool) {
	d.Bytes += s.IOBytes
	d.BytesPerSec += s.BWBytes
	d.MiBPerSec = d.BytesPerSec / MiB
	d.IOPS += s.IOPS
	if !first {
		return
	}
	l := s.ClatNS
	if l.N == 0 && len(l.Percentile) == 0 {
		l = s.LatNS
	}
	pct := func(p float64) float64 {
		for k, v := range l.Percentile {
			if f, err := strconv.ParseFloat(k, 64); err == nil && f == p {
				return v / 1e3
			}
		}
		return 0
	}
	d.Latency = Latency{Count: l.N, MinUS: l.Min / 1e3, MeanUS: l.Mean / 1e3,
		P50US: pct(50), P90US: pct(90), P99US: pct(99), MaxUS: l.Max / 1e3}
}
