package loader

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Errors of the loader. Each matches with errors.Is and keeps its kind
// (errkind.Of) through wrapping.
var (
	// ErrOptions: options that make no sense (a zero batch size, a rank
	// outside the world, ...).
	ErrOptions = errkind.New(errkind.Usage, "loader: bad options")
	// ErrState: a resume state that is malformed or belongs to another
	// dataset or another order.
	ErrState = errkind.New(errkind.Usage, "loader: resume state does not match")
	// ErrClosed: the loader was closed.
	ErrClosed = errkind.New(errkind.Other, "loader: closed")
	// ErrStalled: no batch arrived within Options.Watchdog and
	// Options.FailOnStall is set.
	ErrStalled = errkind.New(errkind.Unavailable, "loader: stalled")
	// ErrBudget: one batch needs more memory than the budget allows, or a
	// caller-provided arena slot.
	ErrBudget = errkind.New(errkind.Usage, "loader: batch larger than the memory budget")
)

// StateVersion is the version of the State format.
const StateVersion = 1

// State is where a loader stands, as a few integers plus the fingerprint
// of the data it reads. Because every rank advances in lockstep, the state
// of any one rank describes all of them: Cursor counts the items of the
// epoch's global stream consumed by all ranks together.
//
// A State is plain JSON; it is what a training checkpoint stores. Restore
// accepts it with any world size, rank, batch size, worker count or
// prefetch depth, and refuses it for other data or another shuffle.
type State struct {
	Version int    `json:"version"`
	Seed    uint64 `json:"seed"`
	Epoch   int64  `json:"epoch"`
	// Cursor is the number of items of the epoch's global stream consumed:
	// the stream positions [0, Cursor) are done. 0 <= Cursor < Items.
	Cursor int64 `json:"cursor"`
	// Step is the number of batches each rank took in this epoch
	// (informational: it resets meaning when the world size changes).
	Step int64 `json:"step"`
	// Items is the length of an epoch's stream: the sample count, or a
	// mixture's epoch length.
	Items int64 `json:"items"`
	// The order's parameters; a state is refused by a loader whose order
	// differs.
	Shuffle   string `json:"shuffle"`
	BlockSize int64  `json:"block_size,omitempty"`
	Window    int64  `json:"window,omitempty"`
	// Where the state was saved (informational).
	World     int64 `json:"world_size"`
	Rank      int64 `json:"rank"`
	BatchSize int64 `json:"batch_size"`
	// Dataset is the fingerprint of the data: for each source its sample
	// count, file sizes and header checksums, and a mixture's weights and
	// epoch length.
	Dataset json.RawMessage `json:"dataset"`
}

// ReadStateFile reads a State written by WriteStateFile (a local path).
func ReadStateFile(path string) (State, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return State{}, fmt.Errorf("loader: read state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("%w: %s is not a loader state: %w", ErrState, path, err)
	}
	return s, nil
}

// WriteStateFile writes s as JSON to path, atomically (write a temporary
// file, then rename).
func WriteStateFile(path string, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("loader: write state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("loader: write state: %w", err)
	}
	return nil
}

// compareFingerprints explains how two dataset fingerprints differ, or
// returns "" when they are equal. It works on the JSON so that it names
// the differing fields whatever the fingerprint's shape.
func compareFingerprints(saved, current json.RawMessage) string {
	var a, b any
	if json.Unmarshal(saved, &a) != nil {
		return "the saved dataset fingerprint is not valid JSON"
	}
	if err := json.Unmarshal(current, &b); err != nil {
		return "the current dataset fingerprint is not valid JSON"
	}
	var diffs []string
	diffJSON("", a, b, &diffs)
	if len(diffs) == 0 {
		return ""
	}
	if len(diffs) > 6 {
		diffs = append(diffs[:6], fmt.Sprintf("and %d more", len(diffs)-6))
	}
	return strings.Join(diffs, "; ")
}

func diffJSON(path string, a, b any, out *[]string) {
	name := path
	if name == "" {
		name = "fingerprint"
	}
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s differs", name))
			return
		}
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			p := k
			if path != "" {
				p = path + "." + k
			}
			diffJSON(p, av[k], bv[k], out)
		}
	case []any:
		bv, ok := b.([]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s differs", name))
			return
		}
		if len(av) != len(bv) {
			*out = append(*out, fmt.Sprintf("%s has %d entries, saved %d", name, len(bv), len(av)))
			return
		}
		for i := range av {
			diffJSON(fmt.Sprintf("%s[%d]", name, i), av[i], bv[i], out)
		}
	default:
		ab, _ := json.Marshal(a)
		bb, _ := json.Marshal(b)
		if !bytes.Equal(ab, bb) {
			*out = append(*out, fmt.Sprintf("%s is %s, saved %s", name, trunc(bb), trunc(ab)))
		}
	}
}

func trunc(b []byte) string {
	if len(b) > 40 {
		return string(b[:37]) + "..."
	}
	return string(b)
}
