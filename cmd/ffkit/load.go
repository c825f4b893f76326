package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/units"
	"github.com/ffkit/ffkit/loader"
)

func init() { register(newLoadCmd) }

// loadSummary is what `ffkit load` reports (--json prints it as is).
type loadSummary struct {
	Paths         []string      `json:"paths"`
	Samples       int64         `json:"samples"` // samples of one epoch's stream
	Rank          int           `json:"rank"`
	WorldSize     int           `json:"world_size"`
	BatchSize     int           `json:"batch_size"`
	Shuffle       string        `json:"shuffle"`
	Seed          uint64        `json:"seed"`
	Workers       int           `json:"workers"`
	MaxInFlight   int           `json:"max_in_flight,omitempty"`
	Prefetch      int           `json:"prefetch"`
	Direct        bool          `json:"direct"`
	DirectChoice  string        `json:"direct_choice"`
	Verify        bool          `json:"verify"`
	Batches       int64         `json:"batches"`
	Delivered     int64         `json:"delivered_samples"`
	Bytes         int64         `json:"bytes"`
	ElapsedS      float64       `json:"elapsed_s"`
	SamplesPerS   float64       `json:"samples_per_s"`
	MiBPerS       float64       `json:"mib_per_s"`
	FirstBatchMs  float64       `json:"time_to_first_batch_ms"`
	ConsumerWaitS float64       `json:"consumer_wait_s"`
	ReadS         float64       `json:"read_s"`
	Skipped       int64         `json:"skipped_samples"`
	MemoryPeak    int64         `json:"memory_peak"`
	MemoryBudget  int64         `json:"memory_budget"`
	ReadsPerBatch float64       `json:"reads_per_batch"`
	NearFrac      float64       `json:"neighbour_frac"`
	Stopped       bool          `json:"stopped_early"`
	State         *loader.State `json:"state,omitempty"`
	StateFile     string        `json:"state_file,omitempty"`

	// On a file system that counts its storage requests (ffkit:// paths).
	StorageRequestsPerBatch float64 `json:"storage_requests_per_batch,omitempty"`
	BytesPerRequest         float64 `json:"bytes_per_request,omitempty"`
	// LocalShare: the part of the bytes read by short-circuit reads of
	// chunk files on this host.
	LocalShare float64 `json:"local_share,omitempty"`
}

func newLoadCmd() *cobra.Command {
	var (
		o                 loader.Options
		printIdx          bool
		saveState, resume string
		stopAfter         int64
		ioConfig, bad     string
		weights           string
		watchdog          time.Duration
		noShuffle         bool
		direct            string
		budget            = units.Size(loader.DefaultMemoryBudget)
	)
	c := &cobra.Command{
		Use:   "load PATH...",
		Short: "Run the training data loader over a dataset and report its speed (or print its order)",
		Long: `Runs ffkit's training data loader over an FFRecord dataset (files or
directories of *.ffr, local paths or ffkit:// URLs) as one rank of a job
would, and reports samples/s, MiB/s and how long the consumer waited.

The order is a pure function of (seed, epoch, dataset size, rank, world
size, batch size, drop-last): an exact pseudorandom permutation per epoch
(the default, as ffkit.Loader in Python; --no-shuffle reads in index
order), split among ranks like PyTorch's DistributedSampler (padding by
wrapping so every rank gets the same number of batches).

--print-indices prints one line per batch, the sample indices in delivery
order separated by spaces, and nothing else on stdout.

--save-state FILE --stop-after-batches K stops after K batches and writes
the loader state (a few integers and the dataset's fingerprint); --resume
FILE continues from it, with the same or another --world-size/--rank:
across the new ranks every remaining sample of the epoch is delivered
exactly once. The state's seed and shuffle apply unless given; a state of
other data is refused.

Several PATHs are one dataset; with --weights they are a weighted mixture
(one weight per PATH) with exact proportions per epoch.`,
		Example: `  ffkit load /data/train --batch-size 256 --seed 1 --epochs 2
  ffkit load /data/train --rank 0 --world-size 8 --print-indices
  ffkit load /data/train --no-shuffle --print-indices
  ffkit load /data/train --save-state s.json --stop-after-batches 100
  ffkit load /data/train --resume s.json --rank 1 --world-size 4`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if err := checkLoadFlags(f, o, watchdog); err != nil {
				return err
			}
			if noShuffle {
				if f.Changed("shuffle") && o.Shuffle {
					return usagef("--shuffle and --no-shuffle contradict each other")
				}
				o.Shuffle = false
			}
			if ioConfig != "" {
				cfg, err := bench.ReadIOConfig(ioConfig)
				if err != nil {
					return err
				}
				if !f.Changed("workers") {
					o.Workers = cfg.Threads * cfg.QueueDepth
				}
				if !f.Changed("direct") {
					o.Direct = cfg.Direct
				}
			}
			if f.Changed("direct") {
				mode, err := ffrecord.ParseDirectMode(direct)
				if err != nil {
					return usagef("--direct %q: want on, off or auto", direct)
				}
				o.Direct, o.DirectAuto = mode == ffrecord.DirectOn, mode == ffrecord.DirectAuto
			}
			if budget < 1 {
				return usagef("--memory-budget %s: want a positive size such as 256MiB", budget.String())
			}
			o.MemoryBudget = int64(budget)
			switch bad {
			case "fail":
				o.BadSamples = loader.Fail
			case "skip":
				o.BadSamples = loader.Skip
			default:
				return usagef("--bad-samples %q: want fail or skip", bad)
			}
			if o.Epochs < 1 {
				return usagef("--epochs %d: want at least 1", o.Epochs)
			}
			if stopAfter < 0 {
				return usagef("--stop-after-batches %d is negative", stopAfter)
			}
			if f.Changed("window") && o.BlockSize == 0 {
				return usagef("--window needs --block-size")
			}
			if o.BlockSize > 0 && !o.Shuffle {
				return usagef("--block-size needs --shuffle")
			}
			// A resume state brings its order: seed and shuffle follow it
			// unless given (and then Restore checks that they match).
			var resumeState *loader.State
			if resume != "" {
				st, err := loader.ReadStateFile(resume)
				if err != nil {
					return err
				}
				resumeState = &st
				if !f.Changed("seed") {
					o.Seed = st.Seed
				}
				if !f.Changed("shuffle") && !f.Changed("no-shuffle") && !f.Changed("block-size") {
					o.Shuffle = st.Shuffle != loader.Sequential.String()
					if st.Shuffle == loader.Block.String() {
						o.BlockSize, o.Window = st.BlockSize, st.Window
					}
				}
			}
			o.Watchdog = watchdog
			if watchdog == 0 {
				o.Watchdog = -1
			}
			o.Log = func(s string) { fmt.Fprintln(os.Stderr, "ffkit:", s) }

			var l *loader.Loader
			var err error
			if weights != "" {
				ws, werr := parseLoadWeights(weights)
				if werr != nil {
					return usagef("--weights: %v", werr)
				}
				if len(ws) != len(args) {
					return usagef("--weights has %d weights for %d paths", len(ws), len(args))
				}
				o.Weights = ws
				sets := make([][]string, len(args))
				for i, a := range args {
					sets[i] = []string{a}
				}
				l, err = loader.OpenMixture(cmd.Context(), sets, o)
			} else {
				l, err = loader.Open(cmd.Context(), args, o)
			}
			if err != nil {
				return err
			}
			defer l.Close()
			// A budget below one batch cannot be kept: the loader would
			// exceed it with every batch. (Checked when given: it looks at
			// every sample's size.)
			if f.Changed("memory-budget") {
				if need := l.MaxBatchBytes(); int64(budget) < need {
					return usagef("--memory-budget %s is below the largest batch of this dataset (%d samples, %d bytes): give at least that",
						budget.String(), o.BatchSize, need)
				}
			}
			if resumeState != nil {
				if err := l.Restore(*resumeState); err != nil {
					return fmt.Errorf("--resume %s: %w", resume, err)
				}
			}

			// The storage requests of the epoch, where the paths' file
			// systems count them (fs.Resolve caches one FS per authority:
			// these are the loader's).
			var fsyses []fs.FS
			for _, a := range args {
				if f, _, err := fs.Resolve(cmd.Context(), a); err == nil {
					fsyses = append(fsyses, f)
				}
			}
			reqBefore, counted := fs.SumReadStats(fsyses)

			out := bufio.NewWriterSize(os.Stdout, 1<<16)
			defer out.Flush()
			quality := loader.NewOrderQuality(l)
			var line []byte
			var batches int64
			stopped := false
			for {
				if stopAfter > 0 && batches >= stopAfter {
					stopped = true
					break
				}
				b, err := l.Next(cmd.Context())
				if err == io.EOF {
					break
				}
				if err != nil {
					out.Flush()
					return err
				}
				batches++
				quality.Observe(b)
				if printIdx {
					line = line[:0]
					for i, idx := range b.Indices {
						if i > 0 {
							line = append(line, ' ')
						}
						if b.Sources != nil {
							line = strconv.AppendInt(line, int64(b.Sources[i]), 10)
							line = append(line, ':')
						}
						line = strconv.AppendInt(line, idx, 10)
					}
					line = append(line, '\n')
					if _, err := out.Write(line); err != nil {
						return err
					}
				}
				b.Release()
			}
			if err := out.Flush(); err != nil {
				return err
			}
			st := l.State()
			if saveState != "" {
				if err := loader.WriteStateFile(saveState, st); err != nil {
					return err
				}
			}
			s := l.Stats()
			sum := loadSummary{
				Paths: args, Samples: l.Len(), Rank: o.Rank, WorldSize: max(o.WorldSize, 1), BatchSize: o.BatchSize,
				Shuffle: st.Shuffle, Seed: o.Seed, Workers: o.Workers, MaxInFlight: o.MaxInFlight, Prefetch: o.Prefetch, Direct: strings.HasPrefix(s.DirectChoice, "direct"), DirectChoice: s.DirectChoice, Verify: !o.NoVerify,
				Batches: s.Batches, Delivered: s.Samples, Bytes: s.Bytes, ElapsedS: s.Elapsed.Seconds(),
				SamplesPerS: s.SamplesPerS, MiBPerS: s.BytesPerS / (1 << 20),
				FirstBatchMs:  float64(s.FirstBatch) / 1e6,
				ConsumerWaitS: s.ConsumerWait.Seconds(), ReadS: s.ReadTime.Seconds(), Skipped: s.Skipped,
				MemoryPeak: s.MemoryPeak, MemoryBudget: s.MemoryBudget,
				ReadsPerBatch: quality.ReadsPerBatch(), NearFrac: quality.NearFrac(),
				Stopped: stopped, State: &st, StateFile: saveState,
			}
			if reqAfter, _ := fs.SumReadStats(fsyses); counted && s.Batches > 0 {
				d := reqAfter.Sub(reqBefore)
				sum.StorageRequestsPerBatch = float64(d.Requests) / float64(s.Batches)
				sum.BytesPerRequest = d.BytesPerRequest()
				sum.LocalShare = d.LocalShare()
			}
			if printIdx {
				// stdout holds the indices only; the summary goes to stderr.
				if !jsonOut {
					return nil
				}
				fmt.Fprintln(os.Stderr, "ffkit: --print-indices owns stdout; summary:")
				printLoadSummary(os.Stderr, sum)
				return nil
			}
			if jsonOut {
				return printJSON(sum)
			}
			printLoadSummary(os.Stdout, sum)
			return nil
		},
	}
	f := c.Flags()
	f.IntVar(&o.BatchSize, "batch-size", loader.DefaultBatchSize, "samples per batch on each rank")
	o.Shuffle = true
	f.BoolVar(&o.Shuffle, "shuffle", true, "deliver each epoch as an exact pseudorandom permutation (the default; see --no-shuffle)")
	f.BoolVar(&noShuffle, "no-shuffle", false, "deliver each epoch in index order")
	f.Uint64Var(&o.Seed, "seed", 0, "seed of the shuffle and of the per-sample augmentation seeds")
	f.Int64Var(&o.Epochs, "epochs", 1, "number of epochs")
	f.Int64Var(&o.StartEpoch, "start-epoch", 0, "first epoch")
	f.IntVar(&o.Rank, "rank", 0, "this process's rank")
	f.IntVar(&o.WorldSize, "world-size", 1, "number of ranks")
	f.BoolVar(&o.DropLast, "drop-last", false, "deliver only whole batches on every rank (default: pad by wrapping to a multiple of the world size; the last batch may be short)")
	f.IntVar(&o.Workers, "workers", loader.DefaultWorkers, "bounds the storage reads in flight for one batch (at least 1; see --max-in-flight for all batches together)")
	f.IntVar(&o.MaxInFlight, "max-in-flight", 0, "reads in flight of all prefetched batches together, shared so one batch's tail does not empty the queue (0: --workers per batch, no shared bound)")
	f.IntVar(&o.Prefetch, "prefetch", loader.DefaultPrefetch, "batches read at once (up to twice as many are planned ahead of the consumer)")
	f.StringVar(&direct, "direct", "off", "O_DIRECT reads (bypass the page cache): on, off, or auto (per dataset: direct only when it is much larger than the memory the page cache can use; see docs/loader.md#direct-reads); --direct alone is on")
	f.Lookup("direct").NoOptDefVal = "on"
	f.BoolVar(&o.NoVerify, "no-verify", false, "skip the per-sample CRC-32 checks")
	f.Var(&budget, "memory-budget", "bound on the bytes of batches in memory (prefetched or held), e.g. 256MiB; at least one batch")
	f.Int64Var(&o.BlockSize, "block-size", 0, "block shuffle: permute blocks of this many consecutive samples, then samples within windows of --window blocks")
	f.Int64Var(&o.Window, "window", loader.DefaultWindow, "block shuffle: blocks per shuffle window")
	f.StringVar(&bad, "bad-samples", "fail", "bad-sample policy: fail, or skip (log file and index, repeat another sample of the batch)")
	f.DurationVar(&watchdog, "watchdog", loader.DefaultWatchdog, "report the stuck stage and file when no batch arrives for this long (0: off)")
	f.StringVar(&weights, "weights", "", "mix the PATHs as separate datasets with these weights, e.g. 0.7,0.3")
	f.Int64Var(&o.MixtureEpoch, "mixture-epoch", 0, "samples per mixture epoch (default: the sum of the datasets' sizes)")
	f.BoolVar(&printIdx, "print-indices", false, "print each batch's sample indices (one line per batch) and nothing else on stdout")
	f.StringVar(&saveState, "save-state", "", "write the loader state to FILE when stopping")
	f.Int64Var(&stopAfter, "stop-after-batches", 0, "stop after K batches (with --save-state: checkpoint there)")
	f.StringVar(&resume, "resume", "", "continue from a state FILE written by --save-state")
	f.StringVar(&ioConfig, "io-config", "", "JSON file from 'ffkit bench sweep': sets --workers (threads x queue depth) and --direct unless given")
	return c
}

func printLoadSummary(w io.Writer, s loadSummary) {
	fmt.Fprintf(w, "loaded %d batches, %d samples, %.1f MiB in %.2fs (rank %d of %d, batch %d, shuffle %s)\n",
		s.Batches, s.Delivered, float64(s.Bytes)/(1<<20), s.ElapsedS, s.Rank, s.WorldSize, s.BatchSize, s.Shuffle)
	fmt.Fprintf(w, "  %.0f samples/s, %.1f MiB/s; reads %s\n", s.SamplesPerS, s.MiBPerS, s.DirectChoice)
	fmt.Fprintf(w, "  time to first batch %.1f ms; consumer waited %.2fs; reads took %.2fs (summed over batches in flight)\n",
		s.FirstBatchMs, s.ConsumerWaitS, s.ReadS)
	fmt.Fprintf(w, "  memory peak %.1f MiB of a %.1f MiB budget; %.1f read requests per batch; %.4f of consecutive samples are neighbours\n",
		float64(s.MemoryPeak)/(1<<20), float64(s.MemoryBudget)/(1<<20), s.ReadsPerBatch, s.NearFrac)
	if s.StorageRequestsPerBatch > 0 {
		fmt.Fprintf(w, "  %.1f storage requests per batch, %.0f bytes per request, %.0f%% of the bytes read locally (short-circuit)\n", s.StorageRequestsPerBatch, s.BytesPerRequest, 100*s.LocalShare)
	}
	if s.Skipped > 0 {
		fmt.Fprintf(w, "  skipped %d bad samples\n", s.Skipped)
	}
	if s.StateFile != "" {
		fmt.Fprintf(w, "  state (epoch %d, cursor %d) written to %s\n", s.State.Epoch, s.State.Cursor, s.StateFile)
	}
}

func parseLoadWeights(s string) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", p)
		}
		out = append(out, v)
	}
	return out, nil
}

// checkLoadFlags refuses counts that make no sense, naming the flag (the
// loader would silently take its default for some of them).
func checkLoadFlags(f *pflag.FlagSet, o loader.Options, watchdog time.Duration) error {
	for _, c := range []struct {
		flag string
		v    int64
		min  int64
	}{
		{"batch-size", int64(o.BatchSize), 1},
		{"workers", int64(o.Workers), 1},
		{"prefetch", int64(o.Prefetch), 1},
		{"world-size", int64(o.WorldSize), 1},
		{"rank", int64(o.Rank), 0},
		{"max-in-flight", int64(o.MaxInFlight), 0},
		{"start-epoch", o.StartEpoch, 0},
		{"block-size", o.BlockSize, 0},
		{"window", o.Window, 1},
		{"mixture-epoch", o.MixtureEpoch, 0},
	} {
		if c.v < c.min {
			return usagef("--%s %d: want at least %d", c.flag, c.v, c.min)
		}
	}
	if watchdog < 0 {
		return usagef("--watchdog %s is negative (0 turns it off)", watchdog)
	}
	return nil
}
