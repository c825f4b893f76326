package proto

import (
	"errors"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/internal/errkind"
)

// Error is an error that crosses the wire by its code: a service returns
// it, the transport sends the code and message, and the caller's error
// matches the same sentinel with errors.Is.
type Error struct {
	code string
	kind errkind.Kind
	msg  string
	base error // matched by errors.Is too (e.g. fs.ErrNoSpace)
}

func newError(code string, kind errkind.Kind, msg string, base error) *Error {
	e := &Error{code: code, kind: kind, msg: msg, base: base}
	registry[code] = e
	transport.RegisterCode(code, e)
	return e
}

var registry = map[string]*Error{}

func (e *Error) Error() string      { return e.msg }
func (e *Error) Kind() errkind.Kind { return e.kind }

// WireCode is the code the transport sends for this error.
func (e *Error) WireCode() string { return e.code }

// Unwrap lets errors.Is find the shared fs sentinel (fs.ErrNoSpace, ...).
func (e *Error) Unwrap() error { return e.base }

// ByCode returns the sentinel for a wire code, or nil.
func ByCode(code string) *Error { return registry[code] }

// The error taxonomy (3FS's, trimmed). Retryable: RoutingVersion, NotHead,
// NotCommitted, TargetOffline, Busy. Permanent: the rest.
var (
	ErrRoutingVersion = newError("routing_version", errkind.Unavailable, "routing version mismatch", fs.ErrUnavailable)
	ErrNotHead        = newError("not_head", errkind.Unavailable, "target is not the chain head", fs.ErrUnavailable)
	ErrNotCommitted   = newError("not_committed", errkind.Unavailable, "chunk has a pending version", fs.ErrUnavailable)
	ErrTargetOffline  = newError("target_offline", errkind.Unavailable, "target is not serving", fs.ErrUnavailable)
	ErrBusy           = newError("busy", errkind.Unavailable, "request in progress", fs.ErrUnavailable)
	ErrMissingUpdate  = newError("missing_update", errkind.Unavailable, "update version gap", fs.ErrUnavailable)
	ErrChecksum       = newError("checksum", errkind.Data, "checksum mismatch", nil)
	ErrNoSpace        = newError("no_space", errkind.Unavailable, "no space left on target", fs.ErrNoSpace)
	ErrBadRequest     = newError("bad_request", errkind.Usage, "bad request", nil)
	ErrNoChain        = newError("no_chain", errkind.Usage, "unknown chain", nil)
	ErrIO             = newError("io", errkind.Unavailable, "storage i/o error", fs.ErrUnavailable)
	ErrUnauthorized   = newError("unauthorized", errkind.Unavailable, "bad cluster token", fs.ErrUnavailable)
)

// Retryable reports whether a request that failed with err may succeed if
// sent again (possibly after a routing refresh, possibly elsewhere).
func Retryable(err error) bool {
	for _, e := range []error{ErrRoutingVersion, ErrNotHead, ErrNotCommitted, ErrTargetOffline, ErrBusy, ErrMissingUpdate, ErrIO} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
