package transport

import (
	"errors"
	"sync"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Transport errors.
var (
	// ErrClosed: the connection broke or was closed; the request may or may
	// not have been applied.
	ErrClosed = errkind.New(errkind.Unavailable, "transport: connection closed")
	// ErrRefused: the peer ended the handshake without saying why (it may
	// be at its limit of unauthenticated connections).
	ErrRefused = errkind.New(errkind.Unavailable, "transport: handshake refused by peer")
	// ErrBadToken: the server, having proved its own membership, refused
	// this side's cluster token.
	ErrBadToken = errkind.New(errkind.Usage, "transport: the server refused our cluster token (wrong token for this cluster)")
	// ErrNotMember: the peer failed to prove it belongs to the cluster (its
	// TLS certificate is not from the cluster CA, or it does not hold the
	// token). Nothing secret was sent to it.
	ErrNotMember = errkind.New(errkind.Unavailable, "transport: peer is not a member of this cluster")
	// ErrTimeout: the peer did not answer in time.
	ErrTimeout = errkind.New(errkind.Unavailable, "transport: timed out")
	// ErrReset: the peer closed or reset the connection.
	ErrReset = errkind.New(errkind.Unavailable, "transport: connection reset by peer")
	// ErrConnRefused: nothing listens at the address.
	ErrConnRefused = errkind.New(errkind.Unavailable, "transport: connection refused (nothing listening)")
	// ErrPartitioned: the fault layer blocks traffic to this peer.
	ErrPartitioned = errkind.New(errkind.Unavailable, "transport: peer unreachable (partitioned)")
)

// WireCoded is an error that crosses the wire by code.
type WireCoded interface {
	error
	WireCode() string
}

var (
	codesMu sync.RWMutex
	codes   = map[string]error{} // guarded by codesMu
)

// RegisterCode makes replies with code turn into an error that errors.Is
// err on the caller's side.
func RegisterCode(code string, err error) {
	codesMu.Lock()
	defer codesMu.Unlock()
	codes[code] = err
}

// RemoteError is an error a peer replied with.
type RemoteError struct {
	Code string `json:"code"`
	Msg  string `json:"msg"`
	Peer string `json:"-"`
}

func (e *RemoteError) Error() string {
	if e.Peer != "" {
		return e.Peer + ": " + e.Msg
	}
	return e.Msg
}

// Unwrap returns the registered sentinel for the code.
func (e *RemoteError) Unwrap() error {
	codesMu.RLock()
	defer codesMu.RUnlock()
	return codes[e.Code]
}

// Kind classifies unregistered remote errors as Other.
func (e *RemoteError) Kind() errkind.Kind {
	if u := e.Unwrap(); u != nil {
		return errkind.Of(u)
	}
	return errkind.Other
}

// toRemote turns a handler's error into what goes on the wire.
func toRemote(err error) RemoteError {
	var w WireCoded
	if errors.As(err, &w) {
		return RemoteError{Code: w.WireCode(), Msg: err.Error()}
	}
	return RemoteError{Code: "", Msg: err.Error()}
}
