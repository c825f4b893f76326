package scan

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ffkit/ffkit/fs"
)

// A Plan is a multi-stage scan: a small DAG of stages, each one Job, whose
// inputs may be the outputs of other stages ("@NAME"). RunPlan runs the
// stages in dependency order, each with the job machinery (staging, atomic
// publish, fingerprints), so a rerun of a changed plan recomputes exactly
// the stages whose inputs, query or options changed, and the stages that
// read them; every other stage is skipped as already published.
//
// A plan file is the JSON form of Plan:
//
//	{"dir": "out/", "stages": [
//	  {"name": "by_user", "inputs": ["logs/"], "partition_by": "hash:user", "partitions": 8},
//	  {"name": "counts", "inputs": ["@by_user"], "partition_by": "files", "partitions": 8,
//	   "sql": "SELECT user, count(*) AS n FROM input GROUP BY user"}]}
type Plan struct {
	// Dir is where a stage without an Output writes: Dir/NAME (a directory
	// of part files). Local path or ffkit:// URL.
	Dir string `json:"dir,omitempty"`
	// Workers and Retries apply to every stage that does not set its own.
	Workers int `json:"workers,omitempty"`
	Retries int `json:"retries,omitempty"`
	// Stages, in any order: RunPlan orders them by their references.
	Stages []Stage `json:"stages"`
}

// A Stage is one named job of a plan. In Inputs and JoinInputs, "@NAME"
// stands for the output of stage NAME. Job.Salt is set by RunPlan.
type Stage struct {
	Name string `json:"name"`
	Job
}

// StageSummary is what one stage of a plan did.
type StageSummary struct {
	Name string `json:"name"`
	*Summary
}

// PlanSummary reports what RunPlan did, one entry per stage in the order
// they ran.
type PlanSummary struct {
	Stages []StageSummary `json:"stages"`
	// Ran and Skipped count the stages that did work and the stages whose
	// every task was already published.
	Ran     int     `json:"ran"`
	Skipped int     `json:"skipped"`
	Seconds float64 `json:"seconds"`
}

var stageName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// ParsePlan decodes a plan file's JSON; src names it in errors. Unknown
// fields are errors (a misspelt option must not be ignored).
func ParsePlan(src string, data []byte) (*Plan, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Plan
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: plan %s: %w", ErrUsage, src, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: plan %s: data after the plan object", ErrUsage, src)
	}
	return &p, nil
}

// ParseJob decodes one job's JSON (a plan stage's keys, without name;
// "salt" as a plan sets it); src names it in errors. Unknown fields are
// errors.
func ParseJob(src string, data []byte) (Job, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var j Job
	if err := dec.Decode(&j); err != nil {
		return Job{}, fmt.Errorf("%w: job %s: %w", ErrUsage, src, err)
	}
	if dec.More() {
		return Job{}, fmt.Errorf("%w: job %s: data after the job object", ErrUsage, src)
	}
	return j, nil
}

// LoadPlan reads and parses a plan file (local path or ffkit:// URL).
func LoadPlan(ctx context.Context, file string) (*Plan, error) {
	b, err := readAll(ctx, file)
	if err != nil {
		return nil, fmt.Errorf("%w: plan %s: %w", ErrUsage, file, err)
	}
	return ParsePlan(file, b)
}

// order checks the plan and returns its stages in a dependency order
// (inputs first), with each stage's upstream stage names.
func (p *Plan) order() ([]int, [][]string, error) {
	if len(p.Stages) == 0 {
		return nil, nil, fmt.Errorf("%w: plan has no stages", ErrUsage)
	}
	index := map[string]int{}
	outputs := map[string]string{}
	for i, s := range p.Stages {
		if !stageName.MatchString(s.Name) {
			return nil, nil, fmt.Errorf("%w: plan stage %d: name %q: want letters, digits, _ . - (not starting with . or -)", ErrUsage, i, s.Name)
		}
		if _, dup := index[s.Name]; dup {
			return nil, nil, fmt.Errorf("%w: plan: two stages named %q", ErrUsage, s.Name)
		}
		index[s.Name] = i
		out := p.output(s)
		if out == "" {
			return nil, nil, fmt.Errorf("%w: plan stage %q: no output (set the stage's output or the plan's dir)", ErrUsage, s.Name)
		}
		if other, dup := outputs[out]; dup {
			return nil, nil, fmt.Errorf("%w: plan stages %q and %q both write %s", ErrUsage, other, s.Name, out)
		}
		outputs[out] = s.Name
	}
	deps := make([][]string, len(p.Stages))
	for i, s := range p.Stages {
		if len(s.Inputs) == 0 {
			return nil, nil, fmt.Errorf("%w: plan stage %q: no inputs", ErrUsage, s.Name)
		}
		for _, in := range append(append([]string(nil), s.Inputs...), s.JoinInputs...) {
			ref, ok := strings.CutPrefix(in, "@")
			if !ok {
				continue
			}
			if _, ok := index[ref]; !ok {
				return nil, nil, fmt.Errorf("%w: plan stage %q: input %q names no stage", ErrUsage, s.Name, in)
			}
			deps[i] = append(deps[i], ref)
		}
	}
	// depth-first topological order; a stage met again while on the
	// path is a cycle
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int, len(p.Stages))
	var order []int
	var visit func(i int, path []string) error
	visit = func(i int, path []string) error {
		switch state[i] {
		case done:
			return nil
		case onPath:
			return fmt.Errorf("%w: plan stages form a cycle: %s", ErrUsage, strings.Join(append(path, p.Stages[i].Name), " -> "))
		}
		state[i] = onPath
		for _, d := range deps[i] {
			if err := visit(index[d], append(path, p.Stages[i].Name)); err != nil {
				return err
			}
		}
		state[i] = done
		order = append(order, i)
		return nil
	}
	for i := range p.Stages {
		if err := visit(i, nil); err != nil {
			return nil, nil, err
		}
	}
	return order, deps, nil
}

// output is where stage s writes.
func (p *Plan) output(s Stage) string {
	if s.Output != "" {
		return s.Output
	}
	if p.Dir == "" {
		return ""
	}
	return fs.Join(p.Dir, s.Name)
}

// job is stage s as a runnable job: references resolved to the outputs
// of the stages they name, plan-wide defaults filled in.
func (p *Plan) job(s Stage) Job {
	j := s.Job
	j.Output = p.output(s)
	resolve := func(ins []string) []string {
		var out []string
		for _, in := range ins {
			if ref, ok := strings.CutPrefix(in, "@"); ok {
				for _, t := range p.Stages {
					if t.Name == ref {
						in = p.output(t)
					}
				}
			}
			out = append(out, in)
		}
		return out
	}
	j.Inputs, j.JoinInputs = resolve(s.Inputs), resolve(s.JoinInputs)
	if j.Workers == 0 {
		j.Workers = p.Workers
	}
	if j.Retries == 0 {
		j.Retries = p.Retries
	}
	return j
}

// Validate checks the plan's shape (names, references, cycles, outputs)
// and every stage's job options, naming the stage at fault.
func (p *Plan) Validate() error {
	if _, _, err := p.order(); err != nil {
		return err
	}
	for _, s := range p.Stages {
		j := p.job(s)
		j.fill()
		if err := j.Validate(); err != nil {
			return fmt.Errorf("plan stage %q: %w", s.Name, err)
		}
	}
	return nil
}

// RunPlan runs a plan's stages one after another in dependency order;
// each stage runs its tasks in parallel (bounded by its Workers). A stage
// that reads other stages carries their fingerprints in its own (Job.Salt),
// so it runs again whenever one of them produced new output.
func RunPlan(ctx context.Context, p Plan) (*PlanSummary, error) {
	start := time.Now()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	order, deps, _ := p.order()
	fingerprints := map[string]string{}
	sum := &PlanSummary{}
	for _, i := range order {
		s := p.Stages[i]
		j := p.job(s)
		var salt []string
		for _, d := range deps[i] {
			salt = append(salt, d+"="+fingerprints[d])
		}
		j.Salt = strings.Join(salt, ",")
		st, err := Run(ctx, j)
		if err != nil {
			return nil, fmt.Errorf("plan stage %q: %w", s.Name, err)
		}
		fingerprints[s.Name] = st.Fingerprint
		sum.Stages = append(sum.Stages, StageSummary{Name: s.Name, Summary: st})
		if st.UpToDate || st.TasksSkipped == st.Tasks {
			sum.Skipped++
		} else {
			sum.Ran++
		}
	}
	sum.Seconds = time.Since(start).Seconds()
	return sum, nil
}
