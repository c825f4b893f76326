package transport

import (
	"bufio"
	"container/list"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"time"

	"github.com/ffkit/ffkit/fs/trust"
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

	// tlsConf is the TLS configuration (nil without a member
	// certificate); plainOK allows plaintext peers (loopback listener,
	// TLS not asked for).
	tlsConf *tls.Config
	plainOK bool

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{} // guarded by mu
	pending *list.List            // guarded by mu: *pendingConn still in their handshake, oldest first
	perSrc  map[string]int        // guarded by mu: pending per source IP
	refused refusalLog
}

// Limits on connections that have not finished their handshake: beyond
// them the oldest pending connection (of the same source, when that
// source is over its share) is closed to make room. Each pending
// connection costs a goroutine, a handshakeMax buffer and (with TLS) the
// TLS state, and lives at most DialTimeout. Evicting the oldest rather
// than refusing the newest lets an honest client, whose handshake takes
// a round trip or two, get in while idle attackers hold every slot.
const (
	MaxPendingHandshakes       = 256
	MaxPendingHandshakesPerSrc = 64
)

// refusalLog logs refused connections at most once a second, counting
// the ones it held back, so a flood cannot flood the log.
type refusalLog struct {
	mu     sync.Mutex
	last   time.Time // guarded by mu
	held   int       // guarded by mu
	logf   func(string, ...any)
	period time.Duration
}

func (r *refusalLog) log(format string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last) < r.period {
		r.held++
		r.mu.Unlock()
		return
	}
	held := r.held
	r.held, r.last = 0, now
	r.mu.Unlock()
	if held > 0 {
		format += " (and %d more refusals not logged)"
		args = append(args, held)
	}
	r.logf(format, args...)
}

// Listen starts a server on addr ("127.0.0.1:0" for any free port).
func Listen(addr string, opts Options, h Handler) (*Server, error) {
	opts.defaults()
	if opts.Token == "" {
		return nil, errors.New("transport: a server needs a cluster token")
	}
	var tlsConf *tls.Config
	if opts.Trust != nil && opts.Trust.Cert != nil {
		var err error
		if tlsConf, err = opts.Trust.ServerConfig(); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", addr, err)
	}
	plainOK := isLoopback(ln.Addr().String()) && !opts.TLSLoopback && !TLSAlways()
	if !plainOK && tlsConf == nil {
		ln.Close()
		return nil, fmt.Errorf("transport: listen %s: a listener that is not loopback-only (or with TLS asked for) serves TLS only, and this process has no member certificate (the cluster directory's tls/): %w", addr, trust.ErrNoTrust)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{opts: opts, handler: h, ln: ln, perConn: 256, logf: log.Printf, tlsConf: tlsConf, plainOK: plainOK,
		ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}, perSrc: map[string]int{}, pending: list.New()}
	s.refused = refusalLog{logf: func(f string, a ...any) { s.logf(f, a...) }, period: time.Second}
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
		pc := &pendingConn{nc: nc, src: sourceIP(nc)}
		var evicted *pendingConn
		s.mu.Lock()
		if s.perSrc[pc.src] >= MaxPendingHandshakesPerSrc {
			for e := s.pending.Front(); e != nil; e = e.Next() {
				if p := e.Value.(*pendingConn); p.src == pc.src {
					evicted = p
					break
				}
			}
		} else if s.pending.Len() >= MaxPendingHandshakes {
			evicted = s.pending.Front().Value.(*pendingConn)
		}
		if evicted != nil {
			s.donePendingLocked(evicted)
		}
		pc.elem = s.pending.PushBack(pc)
		s.perSrc[pc.src]++
		s.conns[nc] = struct{}{}
		s.mu.Unlock()
		if evicted != nil {
			evicted.nc.Close()
			s.refused.log("transport: dropped unauthenticated connection from %s: %d handshakes pending", evicted.nc.RemoteAddr(), MaxPendingHandshakes)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(pc)
			s.mu.Lock()
			delete(s.conns, nc)
			s.mu.Unlock()
			nc.Close()
		}()
	}
}

func sourceIP(nc net.Conn) string {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return nc.RemoteAddr().String()
}

// pendingConn is a connection in its handshake.
type pendingConn struct {
	nc   net.Conn
	src  string
	elem *list.Element // nil once done or evicted (guarded by Server.mu)
}

// donePendingLocked ends p's unauthenticated phase (once).
func (s *Server) donePendingLocked(p *pendingConn) {
	if p.elem == nil {
		return
	}
	s.pending.Remove(p.elem)
	p.elem = nil
	if s.perSrc[p.src]--; s.perSrc[p.src] <= 0 {
		delete(s.perSrc, p.src)
	}
}

func (s *Server) handshakeDone(p *pendingConn) {
	s.mu.Lock()
	s.donePendingLocked(p)
	s.mu.Unlock()
}

// prefixConn is a connection whose first bytes were already read.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// accept runs the handshake of a new connection with nothing but a
// fixed buffer (and the TLS state) allocated, and returns the
// connection to serve on and the peer's name.
func (s *Server) accept(raw net.Conn) (net.Conn, string, error) {
	var buf [handshakeMax]byte
	raw.SetDeadline(time.Now().Add(s.opts.DialTimeout))
	if _, err := io.ReadFull(raw, buf[:1]); err != nil {
		return nil, "", fmt.Errorf("bad handshake: %w", err)
	}
	nc := raw
	hs := net.Conn(&prefixConn{Conn: raw, pre: []byte{buf[0]}})
	if buf[0] == tlsRecordByte {
		if s.tlsConf == nil {
			return nil, "", errors.New("TLS asked for, but this server has no member certificate")
		}
		tc := newTLSServer(hs, s.tlsConf)
		if err := tc.HandshakeContext(s.ctx); err != nil {
			return nil, "", fmt.Errorf("TLS handshake: %w", err)
		}
		nc, hs = tc, tc
	} else if !s.plainOK {
		// Say so, so that a client holding the CA retries with TLS.
		writeSmall(raw, TError, RemoteError{Code: codeTLSRequired, Msg: "this listener serves TLS only"})
		return nil, "", errors.New("plaintext connection to a TLS-only listener")
	}
	peer, err := serverHandshake(hs, s.opts.Token, s.opts.Name, &buf)
	if err != nil {
		return nil, "", err
	}
	nc.SetDeadline(time.Time{})
	return nc, peer, nil
}

func (s *Server) serveConn(p *pendingConn) {
	raw := p.nc
	if tc, ok := raw.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	nc, peer, err := s.accept(raw)
	s.handshakeDone(p)
	if err != nil {
		s.refused.log("transport: refused connection from %s: %v", raw.RemoteAddr(), err)
		return
	}
	if nc != raw {
		s.mu.Lock()
		s.conns[nc] = struct{}{} // Close must close the TLS layer too
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.conns, nc)
			s.mu.Unlock()
			nc.Close()
		}()
	}
	// The big buffer only once the peer proved membership.
	br := bufio.NewReaderSize(nc, 256<<10)
	var wmu sync.Mutex
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
