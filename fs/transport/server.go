package transport

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"sync"
	"time"
)

// Request is one incoming call. Header and Data belong to the handler.
type Request struct {
	Method uint16
	Header []byte
	Data   []byte
	Peer   string // the caller's name

	after []func()          // run once the reply is written
	files map[*byte]fileSrc // reply data parts to send from files
}

// AfterReply registers f to run once the reply has been written (or
// dropped): the place to recycle buffers the reply's data points into.
// Request data itself is recycled after that too: a handler may send it
// back in its reply but must not keep it.
func (r *Request) AfterReply(f func()) { r.after = append(r.after, f) }

// Decode unmarshals the header into v: JSON, or v's own encoding when
// v is a HeaderDecoder.
func (r *Request) Decode(v any) error {
	if err := unmarshalHeader(r.Header, v); err != nil {
		return &RemoteError{Code: "bad_request", Msg: fmt.Sprintf("bad header for method %d: %v", r.Method, err)}
	}
	return nil
}

// Handler serves one request: it returns the reply header (JSON-encoded)
// and raw data parts, or an error sent back by its wire code.
type Handler func(ctx context.Context, req *Request) (resp any, data [][]byte, err error)

// Server accepts connections, checks their token and serves requests.
type Server struct {
	opts    Options
	handler Handler
	ln      net.Listener
	// PerConn bounds the requests served at once on one connection.
	perConn int
	logf    func(format string, args ...any)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // guarded by mu
}

// Listen starts a server on addr ("127.0.0.1:0" for any free port).
func Listen(addr string, opts Options, h Handler) (*Server, error) {
	opts.defaults()
	if opts.Token == "" {
		return nil, errors.New("transport: a server needs a cluster token")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{opts: opts, handler: h, ln: ln, perConn: 256, logf: log.Printf,
		ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// SetLogf replaces the logger (log.Printf by default).
func (s *Server) SetLogf(f func(string, ...any)) { s.logf = f }

// Close stops accepting, closes every connection and waits for handlers.
func (s *Server) Close() error {
	s.cancel()
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.logf("transport: accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		s.conns[nc] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(nc)
			s.mu.Lock()
			delete(s.conns, nc)
			s.mu.Unlock()
			nc.Close()
		}()
	}
}

func (s *Server) serveConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	br := bufio.NewReaderSize(nc, 256<<10)
	nc.SetReadDeadline(time.Now().Add(s.opts.DialTimeout))
	// The handshake frame is small; refuse big ones before allocating.
	f, err := ReadFrame(br, 64<<10)
	if err != nil || f.Type != THello {
		s.logf("transport: refused connection from %s: bad handshake: %v", nc.RemoteAddr(), err)
		return
	}
	var h hello
	if err := json.Unmarshal(f.Header, &h); err != nil || !tokenOK(h.Token, s.opts.Token) {
		s.logf("transport: refused connection from %s (%q): wrong cluster token", nc.RemoteAddr(), h.Name)
		return
	}
	peer := h.Name
	nc.SetReadDeadline(time.Time{})
	me, _ := json.Marshal(hello{Name: s.opts.Name})
	var wmu sync.Mutex
	if err := writeFrame(nc, &wmu, 0, THelloOK, 0, me, nil); err != nil {
		return
	}
	sem := make(chan struct{}, s.perConn)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		f, err := ReadFrame(br, s.opts.MaxFrame)
		if err != nil {
			if errors.Is(err, ErrFrame) {
				s.logf("transport: closing connection from %s (%s): %v", nc.RemoteAddr(), peer, err)
			}
			return
		}
		if f.Type != TRequest {
			s.logf("transport: closing connection from %s (%s): unexpected frame type %d", nc.RemoteAddr(), peer, f.Type)
			return
		}
		if s.opts.Faults != nil && s.opts.Faults.Blocked(peer, s.opts.Name) {
			f.Release()
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		wg.Add(1)
		go func(f Frame) {
			defer wg.Done()
			defer func() { <-sem }()
			req := &Request{Method: f.Method, Header: f.Header, Data: f.Data, Peer: peer}
			defer func() {
				for _, a := range req.after {
					a()
				}
				f.Release()
			}()
			resp, data, err := s.handler(s.ctx, req)
			var hdr []byte
			typ := byte(TReply)
			if err != nil {
				typ = TError
				re := toRemote(err)
				var r *RemoteError
				if errors.As(err, &r) && re.Code == "" {
					re.Code = r.Code
				}
				hdr, _ = json.Marshal(re)
				data = nil
			} else if hdr, err = marshalHeader(resp); err != nil {
				typ = TError
				hdr, _ = json.Marshal(RemoteError{Msg: "encode reply: " + err.Error()})
				data = nil
			}
			if s.opts.Faults != nil && s.opts.Faults.Blocked(s.opts.Name, peer) {
				return
			}
			var files map[*byte]fileSrc
			if typ == TReply {
				files = req.files
			}
			if err := writeFrameFiles(nc, &wmu, f.ID, typ, f.Method, hdr, data, files); err != nil {
				nc.Close()
			}
		}(f)
	}
}
