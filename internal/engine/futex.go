package engine

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations on a word that two processes share (a MAP_SHARED
// mapping), so without FUTEX_PRIVATE_FLAG.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *addr == val, for at most timeout. It returns on
// a wake-up, when *addr differs from val already, on a signal or at the
// timeout; the caller looks again in every case.
func futexWait(addr *uint32, val uint32, timeout time.Duration) {
	ts := unix.NsecToTimespec(int64(timeout))
	// A blocking system call: the Go runtime hands this thread's P to
	// other goroutines while it sleeps.
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every thread (of any process) sleeping on addr.
func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, 1<<31-1, 0, 0, 0)
}
