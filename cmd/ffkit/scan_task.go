package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/scan"
)

// taskFlags are `scan --job FILE [--pending | --task NAME]`: one job run
// whole, or task by task by an outside executor (the Python package's Ray
// executor runs each task on a Ray worker).
type taskFlags struct {
	job     string
	pending bool
	task    string
}

// jobTaskReply is what `scan --job F --pending` and `--task` print as JSON.
type jobTaskReply struct {
	// Tasks: the tasks runnable now, in any order, at once. Empty: the
	// job is finished and Summary says what it did.
	Tasks   []string      `json:"tasks"`
	Summary *scan.Summary `json:"summary,omitempty"`
}

func runJobTask(cmd *cobra.Command, args []string, tf taskFlags) error {
	if len(args) > 0 {
		return usagef("scan: --job takes no SRC (the job file names the inputs and the output)")
	}
	if tf.pending && tf.task != "" {
		return usagef("scan: --pending and --task exclude each other")
	}
	var data []byte
	var err error
	if tf.job == "-" {
		data, err = io.ReadAll(cmd.InOrStdin())
	} else {
		data, err = os.ReadFile(tf.job)
	}
	if err != nil {
		return usagef("scan: --job %s: %v", tf.job, err)
	}
	job, err := scan.ParseJob(tf.job, data)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	switch {
	case tf.pending:
		tasks, sum, err := scan.PendingTasks(ctx, job)
		if err != nil {
			return err
		}
		if tasks == nil {
			tasks = []string{}
		}
		return printJSON(jobTaskReply{Tasks: tasks, Summary: sum})
	case tf.task != "":
		if err := scan.RunTask(ctx, job, tf.task); err != nil {
			return err
		}
		if jsonOut {
			return printJSON(map[string]string{"task": tf.task})
		}
		fmt.Fprintf(human(), "scan: task %s published\n", tf.task)
		return nil
	}
	sum, err := scan.Run(ctx, job)
	if err != nil {
		return err
	}
	if jsonOut {
		return printJSON(sum)
	}
	fmt.Fprintf(human(), "scan: %d rows in, %d rows out, %d tasks (%d already done), %.2fs -> %s\n",
		sum.RowsIn, sum.RowsOut, sum.Tasks, sum.TasksSkipped, sum.Seconds, sum.Output)
	return nil
}
