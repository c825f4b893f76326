package transport

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// The handshake. After TLS (when used), both sides prove that they hold
// the cluster token without sending it, server first:
//
//	client -> server  THello  {name, nonce_c}
//	server -> client  THello  {name, nonce_s, proof_s}
//	client -> server  TProof  {proof_c}
//	server -> client  THelloOK {}  or  TError {code: "bad_token"}
//
//	proof_x = HMAC-SHA256(token, "ffkit/1 " + role_x + nonce_c + nonce_s + exporter)
//
// role is "server" or "client" (so one side's proof is never valid as
// the other's), and exporter is 32 bytes of TLS keying material (RFC
// 5705, "EXPORTER-ffkit-handshake") or nothing on a plaintext loopback
// connection. Binding the proofs to the TLS session means a relay in the
// middle cannot splice two sessions. A client checks proof_s before it
// sends anything derived from the token, so a server that does not hold
// the token (an impostor on a recycled port, a fake metadata server)
// learns nothing but a random nonce.
const (
	nonceLen      = 32
	exporterLabel = "EXPORTER-ffkit-handshake"
	// handshakeMax bounds every handshake frame: the server reads them into
	// a fixed buffer of this size, so an unauthenticated connection costs
	// no more (see Server).
	handshakeMax  = 512
	tlsRecordByte = 0x16 // the first byte of a TLS ClientHello
)

type helloMsg struct {
	Name  string `json:"name"`
	Nonce []byte `json:"nonce"`
	Proof []byte `json:"proof,omitempty"`
}

type proofMsg struct {
	Proof []byte `json:"proof"`
}

func proof(token, role string, nc, ns, exp []byte) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("ffkit/1 " + role))
	m.Write(nc)
	m.Write(ns)
	m.Write(exp)
	return m.Sum(nil)
}

func newNonce() []byte {
	b := make([]byte, nonceLen)
	rand.Read(b)
	return b
}

// exporter returns the TLS session's keying material for the proofs, or
// nil on a plaintext connection.
func exporter(nc net.Conn) ([]byte, error) {
	var tc *tls.Conn
	switch c := nc.(type) {
	case *tls.Conn:
		tc = c
	case *tlsConn:
		tc = c.Conn
	default:
		return nil, nil
	}
	st := tc.ConnectionState()
	return st.ExportKeyingMaterial(exporterLabel, nil, 32)
}

// writeSmall writes one handshake frame.
func writeSmall(w io.Writer, typ byte, v any) error {
	h, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b := EncodeFrame(Frame{Type: typ, Header: h})
	if len(b) > handshakeMax {
		return fmt.Errorf("%w: handshake frame of %d bytes", ErrFrame, len(b))
	}
	_, err = w.Write(b)
	return err
}

// readSmall reads one handshake frame of at most handshakeMax bytes into
// buf, which it returns a frame pointing into.
func readSmall(r io.Reader, buf *[handshakeMax]byte) (Frame, error) {
	if _, err := io.ReadFull(r, buf[:prefixLen]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(buf[:])
	if n < fixedLen || n > handshakeMax-prefixLen {
		return Frame{}, fmt.Errorf("%w: handshake frame length %d outside [%d, %d]", ErrFrame, n, fixedLen, handshakeMax-prefixLen)
	}
	if _, err := io.ReadFull(r, buf[prefixLen:prefixLen+n]); err != nil {
		return Frame{}, err
	}
	return decodeBody(buf[prefixLen : prefixLen+n])
}

// isLoopback reports whether host:port names a loopback address.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// TLSAlways reports whether FFKIT_TLS=always asks for TLS on loopback too.
func TLSAlways() bool { return strings.EqualFold(os.Getenv("FFKIT_TLS"), "always") }

// clientHandshake runs the client side on nc (TLS already set up when
// used). It returns the server's name.
func clientHandshake(nc net.Conn, addr string, opts Options) (string, error) {
	var buf [handshakeMax]byte
	exp, err := exporter(nc)
	if err != nil {
		return "", fmt.Errorf("transport: handshake with %s: %w", addr, err)
	}
	nonceC := newNonce()
	if err := writeSmall(nc, THello, helloMsg{Name: opts.Name, Nonce: nonceC}); err != nil {
		return "", dialError(addr, "handshake", err)
	}
	f, err := readSmall(nc, &buf)
	if err != nil {
		return "", dialError(addr, "handshake", err)
	}
	if f.Type == TError {
		var re RemoteError
		if json.Unmarshal(f.Header, &re) == nil && re.Code == codeTLSRequired {
			return "", fmt.Errorf("%w: %s", errTLSRequired, addr)
		}
	}
	var sh helloMsg
	if f.Type != THello || json.Unmarshal(f.Header, &sh) != nil || len(sh.Nonce) != nonceLen {
		return "", fmt.Errorf("%w: %s answered the handshake with a frame of type %d", ErrNotMember, addr, f.Type)
	}
	if !hmac.Equal(sh.Proof, proof(opts.Token, "server", nonceC, sh.Nonce, exp)) {
		if exp != nil {
			// TLS showed the server is a member: the token is what is wrong.
			return "", fmt.Errorf("%w: %s (%q), a verified member, holds another token", ErrBadToken, addr, sh.Name)
		}
		return "", fmt.Errorf("%w: %s (%q) did not prove it holds our cluster token: it is not a member of this cluster, or our token is wrong", ErrNotMember, addr, sh.Name)
	}
	if err := writeSmall(nc, TProof, proofMsg{Proof: proof(opts.Token, "client", nonceC, sh.Nonce, exp)}); err != nil {
		return "", dialError(addr, "handshake", err)
	}
	f, err = readSmall(nc, &buf)
	if err != nil {
		return "", dialError(addr, "handshake", err)
	}
	switch f.Type {
	case THelloOK:
		return sh.Name, nil
	case TError:
		var re RemoteError
		json.Unmarshal(f.Header, &re)
		if re.Code == "bad_token" {
			return "", fmt.Errorf("%w: %s: %s", ErrBadToken, addr, re.Msg)
		}
		return "", fmt.Errorf("%w: %s: %s", ErrRefused, addr, re.Msg)
	}
	return "", fmt.Errorf("%w: %s: unexpected frame type %d", ErrRefused, addr, f.Type)
}

// serverHandshake runs the server side on nc; buf is the connection's
// only buffer until it succeeds. It returns the client's name.
func serverHandshake(nc net.Conn, token, name string, buf *[handshakeMax]byte) (string, error) {
	exp, err := exporter(nc)
	if err != nil {
		return "", err
	}
	f, err := readSmall(nc, buf)
	if err != nil {
		return "", fmt.Errorf("bad handshake: %w", err)
	}
	var ch helloMsg
	if f.Type != THello || json.Unmarshal(f.Header, &ch) != nil || len(ch.Nonce) != nonceLen {
		return "", fmt.Errorf("bad handshake: frame type %d", f.Type)
	}
	peer := ch.Name
	nonceS := newNonce()
	if err := writeSmall(nc, THello, helloMsg{Name: name, Nonce: nonceS, Proof: proof(token, "server", ch.Nonce, nonceS, exp)}); err != nil {
		return "", err
	}
	f, err = readSmall(nc, buf)
	if err != nil {
		return "", fmt.Errorf("bad handshake from %q: %w", peer, err)
	}
	var cp proofMsg
	if f.Type != TProof || json.Unmarshal(f.Header, &cp) != nil || !hmac.Equal(cp.Proof, proof(token, "client", ch.Nonce, nonceS, exp)) {
		writeSmall(nc, TError, RemoteError{Code: "bad_token", Msg: "wrong cluster token"})
		return "", fmt.Errorf("%q: %w", peer, errWrongToken)
	}
	if err := writeSmall(nc, THelloOK, struct{}{}); err != nil {
		return "", err
	}
	return peer, nil
}

var errWrongToken = errors.New("wrong cluster token")

// codeTLSRequired: a TLS-only listener's answer to a plaintext hello.
const codeTLSRequired = "tls_required"

var errTLSRequired = errors.New("transport: the server serves TLS only")

// dialError names what went wrong while connecting: a timeout, a reset,
// a refused connection or a closed one.
func dialError(addr, stage string, err error) error {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s: no answer during %s: %v", ErrTimeout, addr, stage, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%w: %s: %v", ErrConnRefused, addr, err)
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.EPIPE):
		return fmt.Errorf("%w: %s: connection reset during %s (the server may be overloaded or not an ffkit service): %v", ErrReset, addr, stage, err)
	}
	var ce *tls.CertificateVerificationError
	if errors.As(err, &ce) {
		return fmt.Errorf("%w: %s: %v", ErrNotMember, addr, err)
	}
	var ae tls.AlertError
	if errors.As(err, &ae) || strings.Contains(err.Error(), "tls:") {
		return fmt.Errorf("%w: %s: TLS %s failed: %v", ErrNotMember, addr, stage, err)
	}
	return fmt.Errorf("%w: %s: %s: %v", ErrClosed, addr, stage, err)
}

// dialTLS says whether a connection to addr uses TLS.
func (o *Options) dialTLS(addr string) (bool, error) {
	if o.Trust != nil && (!isLoopback(addr) || o.TLSLoopback || TLSAlways()) {
		return true, nil
	}
	if !isLoopback(addr) {
		return false, fmt.Errorf("%w: %s is not a loopback address and this process has no cluster CA to verify it with (the cluster directory's tls/ca.pem)", ErrNotMember, addr)
	}
	return false, nil
}

// handshakeDeadline is when a dial's handshake must be done.
func handshakeDeadline(ctx context.Context, d time.Duration) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(d)
}
