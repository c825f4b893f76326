package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/internal/errkind"
)

// MaxConns bounds the request connections of one helper (one per Python
// thread with a request in flight).
const MaxConns = 256

// ErrBadRequest: a request names an unknown operation or handle, or has bad
// arguments.
var ErrBadRequest = errkind.New(errkind.Usage, "engine: bad request")

// Server serves one Python process.
type Server struct {
	mu      sync.Mutex        // guards handles and next
	handles map[uint64]handle // open readers, writers, loaders
	next    uint64

	conns *errgroup.Group // request connections, owned by Serve
}

// handle is anything a request can open and later close.
type handle interface{ Close() error }

// opName is the part of a request header every operation shares.
type opName struct {
	Op     string `json:"op"`
	Handle uint64 `json:"handle"`
}

// reply is what an operation returns: a header (marshalled to JSON), an
// optional body and descriptors to pass. The descriptors are closed by the
// server after sending.
type reply struct {
	header any
	body   []byte
	fds    []int
}

func hello(ctx context.Context, s *Server, q *helloRequest, in input) (reply, error) {
	closeFDs(in.fds)
	return reply{header: helloReply{okField: ok(), Version: Version, PID: os.Getpid()}}, nil
}

func closeOp(ctx context.Context, s *Server, q *closeRequest, in input) (reply, error) {
	closeFDs(in.fds)
	s.mu.Lock()
	h, found := s.handles[q.Handle]
	delete(s.handles, q.Handle)
	s.mu.Unlock()
	if !found {
		return okReply(), nil // closing twice is harmless
	}
	return okReply(), h.Close()
}

func okReply() reply { return reply{header: ok()} }

// NewServer returns a server with no handles.
func NewServer() *Server { return &Server{handles: map[uint64]handle{}} }

// add registers h and returns its id.
func (s *Server) add(h handle) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.handles[s.next] = h
	return s.next
}

// lookup returns the handle id as a T.
func lookup[T handle](s *Server, id uint64) (T, error) {
	s.mu.Lock()
	h, ok := s.handles[id]
	s.mu.Unlock()
	t, isT := h.(T)
	if !ok || !isT {
		var zero T
		return zero, fmt.Errorf("%w: no open handle %d of this kind", ErrBadRequest, id)
	}
	return t, nil
}

// Serve serves the control connection and every request connection added
// through it until the control connection closes or ctx ends, then closes
// all handles.
func (s *Server) Serve(ctx context.Context, control *net.UnixConn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g errgroup.Group
	g.SetLimit(MaxConns)
	s.conns = &g
	context.AfterFunc(ctx, func() { control.Close() })
	err := s.serveConn(ctx, control, true)
	cancel()
	g.Wait()
	s.mu.Lock()
	hs := s.handles
	s.handles = map[uint64]handle{}
	s.mu.Unlock()
	for _, h := range hs {
		h.Close()
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// serveConn reads requests from c and answers them in order. A separate
// goroutine reads ahead so that the peer closing the connection cancels
// the request being served.
func (s *Server) serveConn(ctx context.Context, c *net.UnixConn, control bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	context.AfterFunc(ctx, func() { c.Close() })
	type in struct {
		f   frame
		err error
		// consumed is closed when the operation is done with a streamed
		// body (the next frame follows it on the connection).
		consumed chan struct{}
	}
	frames := make(chan in)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			f, err := readFrame(c)
			var consumed chan struct{}
			if err == nil && f.stream != nil {
				var r opName
				json.Unmarshal(f.header, &r)
				if spec := opsByName[r.Op]; spec != nil && spec.Stream {
					consumed = make(chan struct{})
				} else if err = f.readBody(); err != nil {
					closeFDs(f.fds)
				}
			}
			if err != nil {
				cancel() // the peer left: abandon what it asked for
			} else {
				s.early(f.header)
			}
			select {
			case frames <- in{f, err, consumed}:
			case <-ctx.Done():
				closeFDs(f.fds)
				return
			}
			if err != nil {
				return
			}
			if consumed != nil {
				select {
				case <-consumed:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	defer func() { cancel(); <-done }()
	for {
		var m in
		select {
		case m = <-frames:
		case <-ctx.Done():
			return ctx.Err()
		}
		if m.err != nil {
			return m.err
		}
		var r opName
		if err := json.Unmarshal(m.f.header, &r); err != nil {
			closeFDs(m.f.fds)
			if err := writeFrame(c, errorHeader(fmt.Errorf("%w: header: %v", ErrProtocol, err)), nil, nil); err != nil {
				return err
			}
			continue
		}
		var rep reply
		var err error
		if r.Op == "loader_stream" {
			// Streams replies until the peer closes the connection; the
			// connection serves nothing else afterwards.
			closeFDs(m.f.fds)
			return s.loaderStream(ctx, c, m.f.header)
		}
		spec := opsByName[r.Op]
		switch {
		case r.Op == "connect":
			var q connectRequest
			if err = decodeRequest(r.Op, m.f.header, &q); err != nil {
				closeFDs(m.f.fds)
			} else {
				rep, err = s.connect(ctx, m.f.fds)
			}
		case spec != nil && spec.run != nil:
			rep, err = runOp(ctx, s, spec, m.f)
		default:
			closeFDs(m.f.fds)
			err = fmt.Errorf("%w: unknown operation %q", ErrBadRequest, r.Op)
		}
		if m.consumed != nil {
			// Whatever the operation left of its streamed body is read and
			// dropped, so the next frame starts where it should.
			derr := m.f.stream.drain()
			close(m.consumed)
			if derr != nil {
				return derr
			}
		}
		if err != nil {
			closeFDs(rep.fds)
			rep = reply{header: errorHeader(err)}
		}
		werr := writeFrame(c, rep.header, rep.body, rep.fds)
		closeFDs(rep.fds)
		if werr != nil {
			return werr
		}
	}
}

// runOp runs one operation, turning a panic in it into an error reply: one
// bad request must not take down the helper and every reader it serves.
// (A panic in a goroutine the operation starts still ends the process.)
func runOp(ctx context.Context, s *Server, spec *OpSpec, f frame) (rep reply, err error) {
	defer func() {
		if p := recover(); p != nil {
			rep, err = reply{}, fmt.Errorf("engine: internal error in %s: %v", spec.Name, p)
		}
	}()
	return spec.run(ctx, s, f.header, input{body: f.body, fds: f.fds, stream: f.stream})
}

// connect starts serving a request connection passed as a descriptor.
func (s *Server) connect(ctx context.Context, fds []int) (reply, error) {
	if len(fds) != 1 {
		closeFDs(fds)
		return reply{}, fmt.Errorf("%w: connect needs exactly one descriptor, got %d", ErrBadRequest, len(fds))
	}
	f := os.NewFile(uintptr(fds[0]), "engine-conn")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return reply{}, fmt.Errorf("engine: adopt connection: %w", err)
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return reply{}, fmt.Errorf("%w: connect descriptor is not a Unix socket", ErrBadRequest)
	}
	if !s.conns.TryGo(func() error {
		s.serveConn(ctx, uc, false)
		return nil
	}) {
		uc.Close()
		return reply{}, fmt.Errorf("%w: more than %d connections", ErrBadRequest, MaxConns)
	}
	return okReply(), nil
}

// earlyOps run as soon as a request is read, before the requests queued
// ahead of it on its connection are served. Loader slot releases must: a
// pipelined "next" may be blocked waiting for exactly the slot that a
// later request on the same connection gives back.
var earlyOps = map[string]func(s *Server, hdr []byte){}

func (s *Server) early(hdr []byte) {
	if len(earlyOps) == 0 {
		return
	}
	var r opName
	if json.Unmarshal(hdr, &r) != nil {
		return
	}
	if f, ok := earlyOps[r.Op]; ok {
		f(s, hdr)
	}
}

// codes maps sentinel errors to the short codes Python turns into exception
// classes; operation files add theirs in init.
var codes []struct {
	err  error
	code string
}

func addCode(err error, code string) {
	if !knownCode(code) {
		panic(fmt.Sprintf("engine: error code %q is not in ErrorCodes", code))
	}
	codes = append(codes, struct {
		err  error
		code string
	}{err, code})
}

func knownCode(code string) bool {
	for _, c := range ErrorCodes {
		if c.Code == code {
			return true
		}
	}
	return false
}

func errorHeader(err error) errorReply {
	code := ""
	for _, c := range codes {
		if errors.Is(err, c.err) {
			code = c.code
			break
		}
	}
	switch {
	case code != "":
	case errors.Is(err, context.Canceled):
		code = "canceled"
	case errors.Is(err, os.ErrNotExist):
		code = "not_found"
	case errors.Is(err, os.ErrPermission):
		code = "permission"
	case errors.Is(err, unix.ENOSPC):
		code = "no_space"
	}
	return errorReply{Error: err.Error(), Kind: errkind.Of(err).String(), Code: code}
}

// Listen adopts the control connection from descriptor fd.
func Listen(fd int) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), "engine-control")
	if f == nil {
		return nil, fmt.Errorf("%w: descriptor %d is not open", ErrBadRequest, fd)
	}
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("engine: descriptor %d is not a socket: %w", fd, err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("%w: descriptor %d is not a Unix socket", ErrBadRequest, fd)
	}
	return uc, nil
}
