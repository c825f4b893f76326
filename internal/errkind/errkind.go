// Package errkind classifies errors into the few kinds that the CLI turns
// into exit codes and that retry loops decide on: bad data, an unreachable
// service or file, and bad usage. Packages create their sentinel errors with
// New so that a wrapped error still tells its kind through errors.As.
package errkind

import (
	"context"
	"errors"
	"io/fs"
	"syscall"
)

// Kind is the class of an error.
type Kind int

const (
	// Other is any error not classified below.
	Other Kind = iota
	// Data means the input data is bad: corrupt, truncated, malformed.
	Data
	// Unavailable means a service or file could not be reached.
	Unavailable
	// Usage means the caller asked for something that makes no sense.
	Usage
)

func (k Kind) String() string {
	switch k {
	case Data:
		return "data"
	case Unavailable:
		return "unavailable"
	case Usage:
		return "usage"
	}
	return "other"
}

// Error is an error that knows its kind.
type Error struct {
	kind Kind
	msg  string
}

// New returns a sentinel error of the given kind. Compare with errors.Is.
func New(kind Kind, msg string) *Error { return &Error{kind: kind, msg: msg} }

func (e *Error) Error() string { return e.msg }

// Kind reports the error's kind.
func (e *Error) Kind() Kind { return e.kind }

type kinded interface{ Kind() Kind }

// Of reports the kind of err: the kind of the outermost classified error in
// its chain, or, for errors of the standard library, the natural kind
// (a missing or unreadable file and a refused connection are Unavailable).
func Of(err error) Kind {
	if err == nil {
		return Other
	}
	var k kinded
	if errors.As(err, &k) {
		return k.Kind()
	}
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, context.DeadlineExceeded):
		return Unavailable
	}
	return Other
}

// Wrap returns err marked with kind, keeping its message and chain.
func Wrap(kind Kind, err error) error {
	if err == nil {
		return nil
	}
	return &wrapped{kind: kind, err: err}
}

type wrapped struct {
	kind Kind
	err  error
}

func (w *wrapped) Error() string { return w.err.Error() }
func (w *wrapped) Unwrap() error { return w.err }
func (w *wrapped) Kind() Kind    { return w.kind }
