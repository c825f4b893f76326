package main

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// A supervisor keeps the child processes of `ffkit fs up` that it owns
// running (the metadata servers; issue 16): when one dies while fs up is
// not stopping, it is started again, after restartDelay doubling while it
// keeps dying within restartReset of its start (up to restartMax), and
// every exit and restart is logged on stderr. Storage processes are not
// supervised: a dead storage service is a failure the cluster is built to
// ride out (and its tests cause on purpose), and restarting it is the
// operator's choice.
type supervisor struct {
	logf   func(format string, a ...any)
	stopCh chan struct{} // closed by stop
	wg     sync.WaitGroup
	kids   []*supKid
}

const (
	restartDelay = 500 * time.Millisecond
	restartMax   = 30 * time.Second
	restartReset = time.Minute
)

// supStart starts one instance of a supervised process; done is closed
// once it has exited and been waited for (err then holds cmd.Wait's
// result).
type supStart func() (cmd *exec.Cmd, done <-chan struct{}, err *error, startErr error)

type supKid struct {
	name    string
	start   supStart
	started func(pid, restarts int) // called after every start (log, pid lists)

	mu        sync.Mutex // guards the fields below
	cmd       *exec.Cmd
	done      <-chan struct{}
	err       *error
	startedAt time.Time
	restarts  int
}

func newSupervisor(logf func(format string, a ...any)) *supervisor {
	return &supervisor{logf: logf, stopCh: make(chan struct{})}
}

// add starts a process now; it is restarted only once watch is called
// (a process that dies during start-up fails fs up instead).
func (s *supervisor) add(name string, start supStart, started func(pid, restarts int)) (*supKid, error) {
	cmd, done, err, serr := start()
	if serr != nil {
		return nil, serr
	}
	k := &supKid{name: name, start: start, started: started, cmd: cmd, done: done, err: err, startedAt: time.Now()}
	s.kids = append(s.kids, k)
	return k, nil
}

// exited reports whether the kid's current process has exited, and why.
func (k *supKid) exited() (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.done:
		return true, *k.err
	default:
		return false, nil
	}
}

func (k *supKid) pid() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cmd.Process.Pid
}

// watch starts restarting the processes that die.
func (s *supervisor) watch() {
	for _, k := range s.kids {
		s.wg.Add(1)
		go s.run(k)
	}
}

func (s *supervisor) run(k *supKid) {
	defer s.wg.Done()
	delay := restartDelay
	for {
		k.mu.Lock()
		done, errp, pid, at := k.done, k.err, k.cmd.Process.Pid, k.startedAt
		k.mu.Unlock()
		select {
		case <-done:
		case <-s.stopCh:
			return
		}
		select {
		case <-s.stopCh:
			return
		default:
		}
		if time.Since(at) > restartReset {
			delay = restartDelay
		}
		s.logf("%s (pid %d) exited (%v); restarting it in %v", k.name, pid, *errp, delay)
		for {
			select {
			case <-time.After(delay):
			case <-s.stopCh:
				return
			}
			delay = min(2*delay, restartMax)
			cmd, done, err, serr := k.start()
			if serr != nil {
				s.logf("%s: restart failed: %v; trying again in %v", k.name, serr, delay)
				continue
			}
			k.mu.Lock()
			k.cmd, k.done, k.err, k.startedAt = cmd, done, err, time.Now()
			k.restarts++
			n := k.restarts
			k.mu.Unlock()
			if k.started != nil {
				k.started(cmd.Process.Pid, n)
			}
			break
		}
	}
}

// stop ends the restarts, then stops every process (SIGTERM, SIGKILL
// after 10 s) and waits for them.
func (s *supervisor) stop() {
	close(s.stopCh)
	s.wg.Wait()
	for _, k := range s.kids {
		k.mu.Lock()
		cmd, done := k.cmd, k.done
		k.mu.Unlock()
		select {
		case <-done:
		default:
			cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, k := range s.kids {
		k.mu.Lock()
		cmd, done := k.cmd, k.done
		k.mu.Unlock()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
}

// upLogf is how fs up's supervisor logs (stderr, like fs up's own lines).
func upLogf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "ffkit fs up: "+format+"\n", a...)
}
