package scan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/ffkit/ffkit/internal/errkind"
)

// A job runs in phases of independent tasks: a hash repartition's
// producers, then the schema-only files of partitions that got no rows; a
// partition-wise SQL job's shuffle producers, then one task per partition;
// a native or unshuffled SQL job's one task per partition; an aggregate's
// one task. Run runs them all in one process. PendingTasks and RunTask let
// another executor (Ray, in the Python package) spread the tasks of each
// phase over processes and hosts that share the output's file system:
//
//	for {
//		tasks, sum, err := scan.PendingTasks(ctx, job)  // the next phase
//		if len(tasks) == 0 { break }                     // sum: the job is done
//		for each task, anywhere: scan.RunTask(ctx, job, task)
//	}
//
// Every call must be given the same job (inputs, options, Workers, Salt):
// task names and the fingerprint are functions of it. Each task publishes
// as in Run (staging, atomic rename, marker), so a task run twice, or
// retried after its process died, publishes once.

// errPending stops a selective run at the end of a phase that still has
// unpublished tasks; errTaskDone stops it before finishing the job.
var (
	errPending  = errors.New("scan: tasks pending")
	errTaskDone = errors.New("scan: task done")
)

// ErrTaskNotReady: RunTask was asked for a task that is not in the job's
// current phase (an earlier phase has unpublished tasks), or that the job
// does not have.
var ErrTaskNotReady = errkind.New(errkind.Usage, "scan: task not runnable now")

// selector makes a run execute at most the task named only and record,
// instead of running, every other task whose marker is missing.
type selector struct {
	only string

	mu      sync.Mutex // guards the fields below
	pending []string
	ran     bool
}

// take reports whether the task should run now; otherwise it is listed.
func (s *selector) take(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == s.only {
		s.ran = true
		return true
	}
	s.pending = append(s.pending, name)
	return false
}

// published notes that a task was found already published.
func (s *selector) published(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == s.only {
		s.ran = true
	}
}

// barrier ends a phase: a selective run stops when tasks of it are still
// unpublished (the next phase needs them).
func (r *runner) barrier() error {
	if r.sel == nil {
		return nil
	}
	r.sel.mu.Lock()
	defer r.sel.mu.Unlock()
	if len(r.sel.pending) > 0 {
		return errPending
	}
	return nil
}

// PendingTasks returns the names of the unpublished tasks of the job's
// first unfinished phase, each runnable by RunTask (in any order, at
// once). When every task is published it finishes the job as Run does
// (merging a single-file output, removing staging and shuffle files) and
// returns its summary and no tasks.
func PendingTasks(ctx context.Context, job Job) ([]string, *Summary, error) {
	sel := &selector{}
	sum, err := run(ctx, job, sel)
	if errors.Is(err, errPending) {
		slices.Sort(sel.pending)
		return sel.pending, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return nil, sum, nil
}

// RunTask runs one task of the job (a name PendingTasks returned) and
// publishes its output; a task already published is not run again. It
// does not finish the job: PendingTasks does, once no task is left.
func RunTask(ctx context.Context, job Job, task string) error {
	sel := &selector{only: task}
	_, err := run(ctx, job, sel)
	if err != nil && !errors.Is(err, errPending) && !errors.Is(err, errTaskDone) {
		return err
	}
	sel.mu.Lock()
	defer sel.mu.Unlock()
	if sel.ran {
		return nil
	}
	return fmt.Errorf("%w: %q (runnable now: %v)", ErrTaskNotReady, task, sel.pending)
}
