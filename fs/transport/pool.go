package transport

import (
	"context"
	"sync"
)

// Pool keeps one connection per address, redialling broken ones.
type Pool struct {
	opts  Options
	mu    sync.Mutex
	conns map[string]*Conn // guarded by mu
}

// NewPool returns a pool dialling with opts.
func NewPool(opts Options) *Pool {
	return &Pool{opts: opts, conns: map[string]*Conn{}}
}

// Get returns a working connection to addr.
func (p *Pool) Get(ctx context.Context, addr string) (*Conn, error) {
	p.mu.Lock()
	c := p.conns[addr]
	p.mu.Unlock()
	if c != nil && c.Err() == nil {
		return c, nil
	}
	nc, err := Dial(ctx, addr, p.opts)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[addr]; c != nil && c.Err() == nil {
		go nc.Close()
		return c, nil
	}
	p.conns[addr] = nc
	return nc, nil
}

// Drop closes the connection to addr (after an error that suggests it is
// stuck, e.g. a partition).
func (p *Pool) Drop(addr string) {
	p.mu.Lock()
	c := p.conns[addr]
	delete(p.conns, addr)
	p.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	cs := p.conns
	p.conns = map[string]*Conn{}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}
