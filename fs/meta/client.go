package meta

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/fs/trust"
	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrNoServer: no metadata server answered within the retry budget.
var ErrNoServer = errkind.New(errkind.Unavailable, "meta: no metadata server reachable")

// ClientOptions configure a Client. Zero values take the defaults.
type ClientOptions struct {
	// Token is the cluster secret. Required.
	Token string
	// Trust is the cluster's CA and member certificate (see fs/trust);
	// TLSLoopback uses TLS on loopback too. Nil Trust: loopback only,
	// plaintext. See transport.Options.
	Trust       *trust.Bundle
	TLSLoopback bool
	// Name names the client for the transport fault layer. Default "client".
	Name string
	// Servers are metadata server addresses to start with.
	Servers []string
	// Discover returns the current server addresses; called when every
	// known server failed. Default: none (Servers only).
	Discover func(ctx context.Context) ([]string, error)
	// RetryTimeout: how long a call keeps trying servers. Default 30 s.
	RetryTimeout time.Duration
	// Faults feeds the transport fault layer (tests).
	Faults transport.Faults
}

// Client calls metadata servers, failing over to another server when one
// dies. Mutations carry a request id kept across retries, so a retry of an
// operation that did take effect returns its first outcome. Safe for
// concurrent use.
type Client struct {
	opts ClientOptions
	id   string // this client's id, the prefix of its request ids
	seq  atomic.Uint64

	mu      sync.Mutex
	servers []string                   // guarded by mu
	cur     int                        // guarded by mu: index of the preferred server
	conns   map[string]*transport.Conn // guarded by mu
	closed  bool                       // guarded by mu
}

// NewClient returns a client; it connects lazily.
func NewClient(opts ClientOptions) (*Client, error) {
	if opts.Token == "" {
		return nil, fmt.Errorf("meta: a cluster token is required")
	}
	if opts.Name == "" {
		opts.Name = "client"
	}
	if opts.RetryTimeout <= 0 {
		opts.RetryTimeout = 30 * time.Second
	}
	if len(opts.Servers) == 0 && opts.Discover == nil {
		return nil, fmt.Errorf("meta: no metadata servers given")
	}
	c := &Client{opts: opts, id: fmt.Sprintf("%016x", rand.Uint64()), conns: map[string]*transport.Conn{}}
	c.servers = append([]string(nil), opts.Servers...)
	if len(c.servers) > 0 {
		c.cur = rand.IntN(len(c.servers))
	}
	return c, nil
}

// Close closes the connections.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for a, cn := range c.conns {
		cn.Close()
		delete(c.conns, a)
	}
	return nil
}

// ClientID is this client's id (sessions record it).
func (c *Client) ClientID() string { return c.id }

func (c *Client) newReqID() string { return fmt.Sprintf("%s-%d", c.id, c.seq.Add(1)) }

// conn returns a connection to the preferred server.
func (c *Client) conn(ctx context.Context) (*transport.Conn, string, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, "", fmt.Errorf("%w: client closed", ErrNoServer)
	}
	if len(c.servers) == 0 {
		c.mu.Unlock()
		return nil, "", fmt.Errorf("%w: none known (mgmtd lists no live metadata server: is 'ffkit fs meta' running?)", ErrNoServer)
	}
	addr := c.servers[c.cur%len(c.servers)]
	cn := c.conns[addr]
	c.mu.Unlock()
	if cn != nil && cn.Err() == nil {
		return cn, addr, nil
	}
	cn, err := transport.Dial(ctx, addr, transport.Options{Token: c.opts.Token, Name: c.opts.Name, Faults: c.opts.Faults, Trust: c.opts.Trust, TLSLoopback: c.opts.TLSLoopback})
	if err != nil {
		return nil, addr, err
	}
	c.mu.Lock()
	if old := c.conns[addr]; old != nil {
		old.Close()
	}
	c.conns[addr] = cn
	c.mu.Unlock()
	return cn, addr, nil
}

// failover drops addr and moves to the next server; after a full round it
// asks Discover for the current list.
func (c *Client) failover(ctx context.Context, addr string, round *int) {
	c.mu.Lock()
	if cn := c.conns[addr]; cn != nil {
		cn.Close()
		delete(c.conns, addr)
	}
	c.cur++
	*round++
	n := len(c.servers)
	c.mu.Unlock()
	if c.opts.Discover != nil && (*round >= n || n == 0) {
		*round = 0
		if list, err := c.opts.Discover(ctx); err == nil && len(list) > 0 {
			c.mu.Lock()
			c.servers = list
			c.cur = rand.IntN(len(list))
			c.mu.Unlock()
		}
	}
}

// retryable reports whether err means "this server could not do it now;
// another may": a broken connection or an unreachable store.
func retryable(err error) bool {
	var re *transport.RemoteError
	if errors.As(err, &re) {
		return errors.Is(err, kv.ErrUnavailable) || errors.Is(err, kv.ErrConflict)
	}
	return true
}

func (c *Client) call(ctx context.Context, m uint16, req *Request) (*Response, error) {
	deadline := time.Now().Add(c.opts.RetryTimeout)
	backoff := 20 * time.Millisecond
	round := 0
	var last error
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		cn, addr, err := c.conn(ctx)
		if err == nil {
			var resp Response
			_, err = cn.Call(ctx, m, req, nil, &resp)
			if err == nil {
				return &resp, nil
			}
			if !retryable(err) || ctx.Err() != nil {
				var re *transport.RemoteError
				if errors.As(err, &re) {
					if base, ok := codes[re.Code]; ok {
						// The server's own message already names the operation.
						return nil, &Error{Code: re.Code, Msg: re.Msg, Base: base}
					}
				}
				return nil, err
			}
		}
		last = err
		c.failover(ctx, addr, &round)
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w within %v: %w", ErrNoServer, c.opts.RetryTimeout, last)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff/2 + rand.N(backoff)):
		}
		if backoff < time.Second {
			backoff *= 2
		}
	}
}

// Stat returns the inode at path.
func (c *Client) Stat(ctx context.Context, path string) (*Inode, error) {
	r, err := c.call(ctx, MStat, &Request{Path: path})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// StatInode returns inode id.
func (c *Client) StatInode(ctx context.Context, id uint64) (*Inode, error) {
	r, err := c.call(ctx, MStatInode, &Request{Inode: id})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// Readdir lists the directory at path.
func (c *Client) Readdir(ctx context.Context, path string) ([]Entry, error) {
	r, err := c.call(ctx, MReaddir, &Request{Path: path})
	if err != nil {
		return nil, err
	}
	return r.Entries, nil
}

// Mkdir creates a directory (with parents: mkdir -p).
func (c *Client) Mkdir(ctx context.Context, path string, parents bool) (*Inode, error) {
	r, err := c.call(ctx, MMkdir, &Request{ReqID: c.newReqID(), Path: path, Parents: parents, Owner: ctxOwner(ctx)})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// Create creates an empty file (exclusive: fail if it exists).
func (c *Client) Create(ctx context.Context, path string, exclusive bool) (*Inode, error) {
	r, err := c.call(ctx, MCreate, &Request{ReqID: c.newReqID(), Path: path, Exclusive: exclusive, Owner: ctxOwner(ctx)})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// SetAttr changes the permission bits, owner and times of path.
func (c *Client) SetAttr(ctx context.Context, path string, a AttrChange) (*Inode, error) {
	r, err := c.call(ctx, MSetAttr, &Request{Path: path, Perm: a.Perm, Uid: a.Uid, Gid: a.Gid, ATime: a.ATime, MTime: a.MTime})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// Mknod creates a symlink to target, a FIFO, a socket or a device node.
func (c *Client) Mknod(ctx context.Context, path string, t Type, target string, rdev uint32) (*Inode, error) {
	r, err := c.call(ctx, MMknod, &Request{ReqID: c.newReqID(), Path: path, Type: t, Target: target, Rdev: rdev, Owner: ctxOwner(ctx)})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// Link makes dst a hard link of src.
func (c *Client) Link(ctx context.Context, src, dst string) (*Inode, error) {
	r, err := c.call(ctx, MLink, &Request{ReqID: c.newReqID(), Path: src, Dst: dst})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// Xattr sets (XattrSet) or removes (XattrRemove) an extended attribute.
func (c *Client) Xattr(ctx context.Context, path string, op int, name string, value []byte, flags int) (*Inode, error) {
	r, err := c.call(ctx, MXattr, &Request{Path: path, Op: op, Name: name, Value: value, Flags: uint32(flags)})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// Remove removes a file or an empty directory.
func (c *Client) Remove(ctx context.Context, path string) error {
	_, err := c.call(ctx, MRemove, &Request{ReqID: c.newReqID(), Path: path})
	return err
}

// Rename moves src to dst atomically.
func (c *Client) Rename(ctx context.Context, src, dst string) error {
	return c.RenameFlags(ctx, src, dst, 0)
}

// RenameFlags is Rename with renameat2's flags (fs.RenameNoReplace,
// fs.RenameExchange).
func (c *Client) RenameFlags(ctx context.Context, src, dst string, flags uint32) error {
	_, err := c.call(ctx, MRename, &Request{ReqID: c.newReqID(), Path: src, Dst: dst, Flags: flags})
	return err
}

// BeginFile starts a new unpublished file for path and a write session.
func (c *Client) BeginFile(ctx context.Context, path string) (*Inode, string, error) {
	r, err := c.call(ctx, MBeginFile, &Request{Path: path, Client: c.id, Owner: ctxOwner(ctx)})
	if err != nil {
		return nil, "", err
	}
	return r.Inode, r.Session, nil
}

// CommitFile publishes a file started with BeginFile.
func (c *Client) CommitFile(ctx context.Context, path string, inode uint64, session string, size int64) (*Inode, error) {
	r, err := c.call(ctx, MCommitFile, &Request{ReqID: c.newReqID(), Path: path, Inode: inode, Session: session, Size: size})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// AbandonFile drops a file started with BeginFile.
func (c *Client) AbandonFile(ctx context.Context, inode uint64, session string) error {
	_, err := c.call(ctx, MAbandonFile, &Request{Inode: inode, Session: session})
	return err
}

// Extend reports acknowledged bytes up to end (length = max of reports).
func (c *Client) Extend(ctx context.Context, inode uint64, end int64, truncVer uint64, session string) (*Inode, error) {
	r, err := c.call(ctx, MExtend, &Request{Inode: inode, Size: end, TruncVer: truncVer, Session: session})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// CloseSession ends a write session with its final end.
func (c *Client) CloseSession(ctx context.Context, inode uint64, session string, end int64, truncVer uint64) (*Inode, error) {
	r, err := c.call(ctx, MCloseSession, &Request{Inode: inode, Session: session, Size: end, TruncVer: truncVer})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// OpenWrite opens a write session on path (create: O_CREAT; exclusive: O_EXCL).
func (c *Client) OpenWrite(ctx context.Context, path string, create, exclusive bool) (*Inode, string, error) {
	r, err := c.call(ctx, MOpenWrite, &Request{ReqID: c.newReqID(), Path: path, Client: c.id, Create: create, Exclusive: exclusive, Owner: ctxOwner(ctx)})
	if err != nil {
		return nil, "", err
	}
	return r.Inode, r.Session, nil
}

// Truncate sets the length of path.
func (c *Client) Truncate(ctx context.Context, path string, size int64, session string) (*Inode, error) {
	r, err := c.call(ctx, MTruncate, &Request{Path: path, Size: size, Session: session})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// TruncateInode sets the length of an open file by inode.
func (c *Client) TruncateInode(ctx context.Context, inode uint64, size int64, session string) (*Inode, error) {
	r, err := c.call(ctx, MTruncate, &Request{Inode: inode, Size: size, Session: session})
	if err != nil {
		return nil, err
	}
	return r.Inode, nil
}

// ctxOwner is the owner new nodes get: the one fs.WithOwner put in ctx
// (nil: none stored, the mount's defaults apply).
func ctxOwner(ctx context.Context) *fs.Owner {
	if o, ok := fs.OwnerFrom(ctx); ok {
		return &o
	}
	return nil
}
