package transport

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ffkit/ffkit/fs/trust"
)

// Options configure both ends of a connection.
type Options struct {
	// Token is the cluster secret every connection presents. Required.
	Token string
	// Name names this peer for the fault layer and logs ("storage-1",
	// "client"). Default "anon".
	Name string
	// MaxFrame bounds a frame. Default DefaultMaxFrame.
	MaxFrame int
	// Faults, if set, drops traffic between named peers.
	Faults Faults
	// DialTimeout bounds connect + handshake (and a server's wait for an
	// unauthenticated peer's handshake). Default 3 s.
	DialTimeout time.Duration
	// Trust is the cluster's CA (clients) and member certificate
	// (servers). Connections to or listeners on non-loopback addresses
	// need it: they always use TLS. Nil: plaintext on loopback only.
	Trust *trust.Bundle
	// TLSLoopback uses TLS on loopback addresses too (FFKIT_TLS=always in
	// the environment does the same). Default false: loopback connections
	// are plaintext, still authenticated both ways by the token proofs.
	TLSLoopback bool
}

func (o *Options) defaults() {
	if o.Name == "" {
		o.Name = "anon"
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = DefaultMaxFrame
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 3 * time.Second
	}
}

// Conn is a client connection carrying many concurrent calls.
type Conn struct {
	nc     net.Conn
	opts   Options
	peer   string // the server's name
	addr   string
	wmu    sync.Mutex // serialises frame writes
	mu     sync.Mutex
	nextID uint64              // guarded by mu
	calls  map[uint64]*pending // guarded by mu
	err    error               // guarded by mu: set once the connection broke
	done   chan struct{}
}

type reply struct {
	f    Frame
	err  error
	sunk bool // the data went to the call's sink
}

// Sink receives a reply's data straight from the connection, into the
// caller's own buffers (no intermediate copy). It runs on the
// connection's reader after the reply header was decoded into the call's
// resp, and must read the n data bytes from r (what it leaves is
// discarded). It must not block on anything but r.
type Sink func(r io.Reader, n int) error

// pending is a call waiting for its reply.
type pending struct {
	ch    chan reply // buffered: one reply
	sink  Sink
	resp  any
	state atomic.Int32 // 0 waiting, 1 sink running, 2 abandoned by the caller
}

// Dial connects to addr, checks that the server is a member of the
// cluster (TLS against the cluster CA when used, then the server's proof
// of the token) and proves its own membership (see handshake.go). The
// token itself never crosses the connection.
func Dial(ctx context.Context, addr string, opts Options) (*Conn, error) {
	opts.defaults()
	useTLS, err := opts.dialTLS(addr)
	if err != nil {
		return nil, err
	}
	c, err := dial(ctx, addr, opts, useTLS)
	if errors.Is(err, errTLSRequired) {
		// A loopback listener started with TLS required: no secret was
		// sent; go again with TLS if we can verify the server.
		if opts.Trust == nil {
			return nil, fmt.Errorf("%w: %s serves TLS only and this process has no cluster CA (tls/ca.pem of the cluster directory, FFKIT_TLS_DIR)", ErrNotMember, addr)
		}
		return dial(ctx, addr, opts, true)
	}
	return c, err
}

func dial(ctx context.Context, addr string, opts Options, useTLS bool) (*Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, dialError(addr, "connect", err)
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		// No SetReadBuffer/SetWriteBuffer: fixing the socket buffers turns
		// off Linux's autotuning, which halved large reads on loopback.
		tc.SetNoDelay(true)
	}
	raw.SetDeadline(handshakeDeadline(ctx, opts.DialTimeout))
	nc := raw
	if useTLS {
		tc := newTLSClient(raw, opts.Trust.ClientConfig())
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, dialError(addr, "TLS handshake", err)
		}
		nc = tc
	}
	peer, err := clientHandshake(nc, addr, opts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	if opts.Faults != nil && opts.Faults.Blocked(opts.Name, peer) {
		nc.Close()
		return nil, fmt.Errorf("%w: %s -> %s", ErrPartitioned, opts.Name, peer)
	}
	// Small: whatever the buffer holds past a frame's header is copied out
	// of it once more, and bulk data is read straight from the socket
	// (frameReader), so a large buffer only costs a copy. With 256 KiB,
	// that copy was 7% of a FUSE mount's CPU on cold 4 MiB block reads;
	// 32 KiB still takes several small replies per system call.
	br := bufio.NewReaderSize(nc, 32<<10)
	c := &Conn{nc: nc, opts: opts, peer: peer, addr: addr, calls: map[uint64]*pending{}, done: make(chan struct{})}
	go c.readLoop(br)
	return c, nil
}

// Peer is the server's name.
func (c *Conn) Peer() string { return c.peer }

// Err reports why the connection broke, or nil while it works.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection; calls in flight fail with ErrClosed.
func (c *Conn) Close() error {
	c.fail(ErrClosed)
	<-c.done
	return nil
}

func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		for id, p := range c.calls {
			p.ch <- reply{err: err}
			delete(c.calls, id)
		}
	}
	c.mu.Unlock()
	c.nc.Close()
}

func (c *Conn) readLoop(br *bufio.Reader) {
	defer close(c.done)
	broken := func(err error) {
		c.fail(fmt.Errorf("%w: %s: %v", ErrClosed, c.addr, err))
	}
	for {
		var head [prefixLen + fixedLen]byte
		if _, err := io.ReadFull(br, head[:]); err != nil {
			broken(err)
			return
		}
		n := binary.BigEndian.Uint32(head[0:])
		if n < fixedLen || uint64(n) > uint64(c.opts.MaxFrame) {
			broken(fmt.Errorf("%w: length %d outside [%d, %d]", ErrFrame, n, fixedLen, c.opts.MaxFrame))
			return
		}
		id := binary.BigEndian.Uint64(head[4:])
		typ := head[12]
		h := binary.BigEndian.Uint32(head[16:])
		if h > n-fixedLen {
			broken(fmt.Errorf("%w: header length %d exceeds frame body %d", ErrFrame, h, n-fixedLen))
			return
		}
		if c.opts.Faults != nil && c.opts.Faults.Blocked(c.peer, c.opts.Name) {
			if _, err := io.CopyN(io.Discard, br, int64(n-fixedLen)); err != nil {
				broken(err)
				return
			}
			continue // dropped on the wire
		}
		c.mu.Lock()
		p := c.calls[id]
		sink := p != nil && p.sink != nil && typ == TReply && p.state.CompareAndSwap(0, 1)
		if p != nil && (sink || p.sink == nil || typ != TReply) {
			delete(c.calls, id)
		}
		c.mu.Unlock()
		if sink {
			hdr := make([]byte, h)
			if _, err := io.ReadFull(br, hdr); err != nil {
				p.ch <- reply{err: fmt.Errorf("%w: %s: %v", ErrClosed, c.addr, err)}
				broken(err)
				return
			}
			lr := &frameReader{br: br, nc: c.nc, N: int64(n - fixedLen - h)}
			err := unmarshalHeader(hdr, p.resp)
			if err != nil {
				err = fmt.Errorf("transport: bad reply from %s: %w", c.addr, err)
			} else {
				err = p.sink(lr, int(lr.N))
			}
			if lr.N > 0 {
				if _, derr := io.CopyN(io.Discard, lr, lr.N); derr != nil {
					p.ch <- reply{err: fmt.Errorf("%w: %s: %v", ErrClosed, c.addr, derr)}
					broken(derr)
					return
				}
			}
			p.ch <- reply{sunk: true, err: err}
			continue
		}
		buf := GetBuffer(int(n))
		copy(buf, head[prefixLen:])
		if _, err := io.ReadFull(br, buf[fixedLen:]); err != nil {
			PutBuffer(buf)
			broken(err)
			return
		}
		f, err := decodeBody(buf)
		if err != nil {
			PutBuffer(buf)
			broken(err)
			return
		}
		f.buf = buf
		if p != nil && p.state.Load() != 2 {
			p.ch <- reply{f: f}
		} else {
			f.Release() // the caller gave up
		}
	}
}

// frameReader hands a sink the rest of one frame: the bytes the
// connection's bufio.Reader already holds, then large reads straight from
// the socket (never past the frame, so the bufio.Reader stays in step), so
// that bulk reply data lands in the sink's buffers with one copy, in
// whatever pieces the sink reads it.
type frameReader struct {
	br *bufio.Reader
	nc net.Conn
	N  int64 // bytes of the frame left
}

// directRead: reads at least this large skip the bufio.Reader.
const directRead = 64 << 10

func (f *frameReader) Read(p []byte) (int, error) {
	if f.N <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > f.N {
		p = p[:f.N]
	}
	var k int
	var err error
	if b := f.br.Buffered(); b > 0 {
		k, err = f.br.Read(p[:min(len(p), b)])
	} else if len(p) >= directRead {
		k, err = f.nc.Read(p)
	} else {
		k, err = f.br.Read(p) // small reads: one system call fills the buffer for many
	}
	f.N -= int64(k)
	return k, err
}

// Call sends a request with a JSON header and raw data parts and waits for
// the reply, decoding its header into resp (if non-nil). It returns the
// reply's data, which belongs to the caller. A remote error comes back as
// *RemoteError.
func (c *Conn) Call(ctx context.Context, method uint16, req any, data [][]byte, resp any) ([]byte, error) {
	out, _, err := c.CallRelease(ctx, method, req, data, resp)
	return out, err
}

// CallRelease is Call, returning also a function that recycles the reply's
// buffer once the caller is done with the data (calling it is optional).
func (c *Conn) CallRelease(ctx context.Context, method uint16, req any, data [][]byte, resp any) ([]byte, func(), error) {
	return c.call(ctx, method, req, data, resp, nil)
}

// CallInto is Call with the reply's data delivered to sink (see Sink)
// instead of a buffer. When it returns, sink has finished or will never
// run.
func (c *Conn) CallInto(ctx context.Context, method uint16, req any, data [][]byte, resp any, sink Sink) error {
	_, _, err := c.call(ctx, method, req, data, resp, sink)
	return err
}

func (c *Conn) call(ctx context.Context, method uint16, req any, data [][]byte, resp any, sink Sink) ([]byte, func(), error) {
	hdr, err := marshalHeader(req)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: encode request: %w", err)
	}
	p := &pending{ch: make(chan reply, 1), sink: sink, resp: resp}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, nil, err
	}
	c.nextID++
	id := c.nextID
	c.calls[id] = p
	c.mu.Unlock()

	if c.opts.Faults == nil || !c.opts.Faults.Blocked(c.opts.Name, c.peer) {
		if err := writeFrame(c.nc, &c.wmu, id, TRequest, method, hdr, data); err != nil {
			c.fail(fmt.Errorf("%w: %s: %v", ErrClosed, c.addr, err))
		}
	}
	select {
	case r := <-p.ch:
		if r.err != nil {
			return nil, nil, r.err
		}
		if r.sunk {
			return nil, func() {}, nil
		}
		f := r.f
		if f.Type == TError {
			defer f.Release()
			re := &RemoteError{Peer: c.peer}
			if err := json.Unmarshal(f.Header, re); err != nil {
				return nil, nil, fmt.Errorf("transport: bad error reply from %s: %w", c.addr, err)
			}
			re.Peer = c.peer
			return nil, nil, re
		}
		if resp != nil {
			if err := unmarshalHeader(f.Header, resp); err != nil {
				f.Release()
				return nil, nil, fmt.Errorf("transport: bad reply from %s: %w", c.addr, err)
			}
		}
		if len(f.Data) == 0 {
			f.Release()
			return nil, func() {}, nil
		}
		return f.Data, f.Release, nil
	case <-ctx.Done():
		c.mu.Lock()
		abandoned := p.state.CompareAndSwap(0, 2)
		if abandoned {
			delete(c.calls, id)
		}
		c.mu.Unlock()
		if !abandoned {
			// The sink is writing into the caller's buffers: cut the
			// connection so it stops at once, and wait for it.
			c.fail(fmt.Errorf("%w: %s: call abandoned mid-reply", ErrClosed, c.addr))
			if r := <-p.ch; r.f.buf != nil {
				r.f.Release()
			}
		}
		return nil, nil, fmt.Errorf("transport: call %d to %s (%s): %w", method, c.peer, c.addr, ctx.Err())
	}
}

// writeFrame writes one frame with writev; data parts are not copied.
func writeFrame(nc net.Conn, mu *sync.Mutex, id uint64, typ byte, method uint16, hdr []byte, data [][]byte) error {
	n := 0
	for _, d := range data {
		n += len(d)
	}
	head := appendHead(make([]byte, 0, prefixLen+fixedLen+len(hdr)), id, typ, method, len(hdr), n)
	head = append(head, hdr...)
	bufs := make(net.Buffers, 0, 1+len(data))
	bufs = append(bufs, head)
	for _, d := range data {
		if len(d) > 0 {
			bufs = append(bufs, d)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if tc, ok := nc.(*tlsConn); ok && n >= batchMin {
		tc.batch.begin()
		_, err := bufs.WriteTo(nc)
		if eerr := tc.batch.end(); err == nil {
			err = eerr
		}
		return err
	}
	_, err := bufs.WriteTo(nc)
	return err
}
