package transport

import (
	"crypto/tls"
	"net"
	"sync"
)

// crypto/tls writes every record (at most 16 KiB of data) with its own
// write(2): a 4 MiB frame is 256 system calls on the sender, each of them
// a TCP push the receiver wakes up for. batchConn sits between a tls.Conn
// and the socket and gathers the records of one large frame into writes
// of up to batchSize; the frame writer (writeFrame, holding the
// connection's write lock) turns it on for the frame and flushes at its
// end. Outside a frame (handshake, alerts, close_notify) it writes
// through, so nothing TLS sends on its own is held back.
//
// Measured on the namespace cluster (docs/perf/xhost.md): the sending
// side of a large TLS transfer spent as much CPU in write(2) as in
// AES-GCM.

// batchSize is the largest write batchConn makes while batching.
const batchSize = 256 << 10

// batchMin: frames smaller than this go out record by record (one or
// two records; batching would only add a copy).
const batchMin = 64 << 10

type batchConn struct {
	net.Conn
	mu       sync.Mutex
	batching bool   // guarded by mu
	buf      []byte // guarded by mu: records not yet written (pooled, cap batchSize)
	err      error  // guarded by mu: the first failed write; every later write fails with it
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if !b.batching || len(p) >= batchSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		n, err := b.Conn.Write(p)
		b.err = err
		return n, err
	}
	if len(b.buf)+len(p) > batchSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	if b.buf == nil {
		b.buf = GetBuffer(batchSize)[:0]
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *batchConn) flushLocked() error {
	if b.err != nil {
		return b.err
	}
	if len(b.buf) == 0 {
		return nil
	}
	_, b.err = b.Conn.Write(b.buf)
	b.buf = b.buf[:0]
	return b.err
}

// begin starts gathering writes.
func (b *batchConn) begin() {
	b.mu.Lock()
	b.batching = true
	b.mu.Unlock()
}

// end writes what was gathered and writes through again; it returns the
// batch's write error.
func (b *batchConn) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	err := b.flushLocked()
	if b.buf != nil {
		PutBuffer(b.buf[:cap(b.buf)])
		b.buf = nil
	}
	return err
}

// tlsConn is a TLS connection over a batchConn.
type tlsConn struct {
	*tls.Conn
	batch *batchConn
}

// newTLSClient and newTLSServer return a TLS connection over raw whose
// large frames are written in batches (see batchConn).
func newTLSClient(raw net.Conn, conf *tls.Config) *tlsConn {
	b := &batchConn{Conn: raw}
	return &tlsConn{Conn: tls.Client(b, conf), batch: b}
}

func newTLSServer(raw net.Conn, conf *tls.Config) *tlsConn {
	b := &batchConn{Conn: raw}
	return &tlsConn{Conn: tls.Server(b, conf), batch: b}
}
