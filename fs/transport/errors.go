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
	// ErrRefused: the peer refused the handshake (bad token).
	ErrRefused = errkind.New(errkind.Unavailable, "transport: connection refused by peer (bad cluster token?)")
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
