// Package systest holds the fault tests of the ffkit cluster's data plane:
// real `ffkit fs mgmtd` and `ffkit fs storage` processes on loopback,
// killed with SIGKILL, restarted, partitioned through the transport's
// fault file (FFKIT_FAULT_FILE), with bits flipped in chunk files, while a
// client in the test process writes and reads. Every test ends with the
// invariant check: the serving replicas of every chunk are identical,
// nothing is left pending when idle, every acknowledged write is readable.
//
// The tests build the ffkit binary once (go build into a temporary
// directory) and use short timers (heartbeat 100 ms, fail timeout 1 s).
package systest
