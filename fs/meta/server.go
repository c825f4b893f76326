package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"sort"
	"sync"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/fs/trust"
	"github.com/prometheus/client_golang/prometheus"
)

// ServerOptions configure a metadata server. Zero values take the defaults.
type ServerOptions struct {
	// Listen is the address to serve on. Default "127.0.0.1:0".
	Listen string
	// Token is the cluster secret. Required.
	Token string
	// Trust is the cluster's CA and member certificate (see fs/trust);
	// TLSLoopback uses TLS on loopback too. Nil Trust: loopback only,
	// plaintext. See transport.Options.
	Trust       *trust.Bundle
	TLSLoopback bool
	// Name names the server for the transport fault layer. Default "meta".
	Name string
	// Faults drops traffic between named peers (tests).
	Faults transport.Faults
	// GCInterval is how often the collector runs. Default 1 s; < 0 never.
	GCInterval time.Duration
	// RegisterTTL: the server's registration (how clients find it)
	// expires this long after its last renewal. Default 5 s.
	RegisterTTL time.Duration
	// Logf logs. Default log.Printf.
	Logf func(format string, args ...any)
	// Registry receives the metrics. Default: a new registry.
	Registry *prometheus.Registry
}

// Server serves a Service over the transport. It holds no metadata: kill
// it at any moment and clients carry on with another server.
type Server struct {
	svc    *Service
	opts   ServerOptions
	srv    *transport.Server
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mOps *prometheus.CounterVec
	mErr *prometheus.CounterVec
}

// StartServer starts serving svc and registers the server in the store so
// that clients find it.
func StartServer(ctx context.Context, svc *Service, opts ServerOptions) (*Server, error) {
	if opts.Token == "" {
		return nil, fmt.Errorf("meta: a cluster token is required")
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.Name == "" {
		opts.Name = "meta"
	}
	if opts.GCInterval == 0 {
		opts.GCInterval = time.Second
	}
	if opts.RegisterTTL <= 0 {
		opts.RegisterTTL = 5 * time.Second
	}
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	s := &Server{svc: svc, opts: opts}
	s.mOps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ffkit_meta_ops_total", Help: "Metadata operations served, by method."}, []string{"method"})
	s.mErr = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ffkit_meta_errors_total", Help: "Metadata operations that failed, by method."}, []string{"method"})
	for _, c := range []prometheus.Collector{s.mOps, s.mErr} {
		if err := opts.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("meta: metrics: %w", err)
		}
	}
	var err error
	s.srv, err = transport.Listen(opts.Listen, transport.Options{Token: opts.Token, Name: opts.Name, Faults: opts.Faults, Trust: opts.Trust, TLSLoopback: opts.TLSLoopback}, s.handle)
	if err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	s.srv.SetLogf(opts.Logf)
	if err := s.register(ctx); err != nil {
		s.srv.Close()
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go s.loop(lctx)
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.srv.Addr() }

// Close deregisters and stops the server.
func (s *Server) Close() error {
	s.cancel()
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.svc.store.Update(ctx, func(tx kv.Txn) error { tx.Delete(serverKey(s.Addr())); return nil })
	return s.srv.Close()
}

// Kill stops serving at once, without deregistering (a crash, as far as
// clients can tell). For tests.
func (s *Server) Kill() {
	s.cancel()
	s.wg.Wait()
	s.srv.Close()
}

func (s *Server) register(ctx context.Context) error {
	rec := serverRec{Addr: s.Addr(), Expires: time.Now().Add(s.opts.RegisterTTL).UnixNano()}
	err := s.svc.store.Update(ctx, func(tx kv.Txn) error {
		setJSON(tx, serverKey(rec.Addr), rec)
		return nil
	})
	if err != nil {
		return fmt.Errorf("meta: register %s: %w", rec.Addr, err)
	}
	return nil
}

func (s *Server) loop(ctx context.Context) {
	defer s.wg.Done()
	reg := time.NewTicker(s.opts.RegisterTTL / 4)
	defer reg.Stop()
	var gc <-chan time.Time
	if s.opts.GCInterval > 0 {
		t := time.NewTicker(s.opts.GCInterval)
		defer t.Stop()
		gc = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-reg.C:
			if err := s.register(ctx); err != nil && ctx.Err() == nil {
				s.opts.Logf("meta: %v", err)
			}
		case <-gc:
			if s.svc.opts.Chunks == nil {
				continue
			}
			st, err := s.svc.CollectGarbage(ctx, 0)
			if err != nil && ctx.Err() == nil {
				s.opts.Logf("meta: garbage collection: %v", err)
			}
			if st.Files+st.Truncs+st.Sessions > 0 {
				s.opts.Logf("meta: collected %d files, %d truncations, %d expired sessions", st.Files, st.Truncs, st.Sessions)
			}
		}
	}
}

// LiveServers lists the addresses of the metadata servers registered in
// store and not expired, sorted.
func LiveServers(ctx context.Context, store kv.Store) ([]string, error) {
	var out []string
	now := time.Now().UnixNano()
	err := store.View(ctx, func(tx kv.ReadTxn) error {
		out = out[:0]
		p := []byte(prefixServer)
		kvs, err := tx.Range(ctx, p, kv.PrefixEnd(p), 0)
		if err != nil {
			return err
		}
		for _, e := range kvs {
			var r serverRec
			if json.Unmarshal(e.Value, &r) == nil && r.Expires > now {
				out = append(out, r.Addr)
			}
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

var methodNames = map[uint16]string{
	MStat: "stat", MStatInode: "stat_inode", MReaddir: "readdir", MMkdir: "mkdir", MCreate: "create",
	MRemove: "remove", MRename: "rename", MBeginFile: "begin_file", MCommitFile: "commit_file",
	MAbandonFile: "abandon_file", MExtend: "extend", MCloseSession: "close_session",
	MOpenWrite: "open_write", MTruncate: "truncate", MSetAttr: "set_attr",
	MMknod: "mknod", MLink: "link", MXattr: "xattr",
}

func (s *Server) handle(ctx context.Context, req *transport.Request) (any, [][]byte, error) {
	name, ok := methodNames[req.Method]
	if !ok {
		return nil, nil, merr(ErrInvalid, "meta: no method %d", req.Method)
	}
	s.mOps.WithLabelValues(name).Inc()
	var r Request
	if err := req.Decode(&r); err != nil {
		s.mErr.WithLabelValues(name).Inc()
		return nil, nil, merr(ErrInvalid, "meta: %s: bad request: %v", name, err)
	}
	resp, err := s.serve(ctx, req.Method, &r)
	if err != nil {
		s.mErr.WithLabelValues(name).Inc()
		return nil, nil, wireErr(err)
	}
	return resp, nil, nil
}

// wireErr gives store errors a code so the client can tell "retry
// elsewhere" (the store is unreachable from this server) from an answer.
func wireErr(err error) error {
	var me *Error
	if errors.As(err, &me) {
		return err
	}
	switch {
	case errors.Is(err, kv.ErrUnavailable),
		// The server's own context ended (it is shutting down) in the middle
		// of the operation: another server may do it, and request ids make
		// the retry safe if this one had committed.
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &Error{Code: "kv/unavailable", Msg: err.Error(), Base: kv.ErrUnavailable}
	case errors.Is(err, kv.ErrConflict):
		return &Error{Code: "kv/conflict", Msg: err.Error(), Base: kv.ErrConflict}
	}
	return err
}

func init() {
	transport.RegisterCode("kv/unavailable", kv.ErrUnavailable)
	transport.RegisterCode("kv/conflict", kv.ErrConflict)
}

func (s *Server) serve(ctx context.Context, m uint16, r *Request) (*Response, error) {
	var n *Inode
	var err error
	out := &Response{}
	switch m {
	case MStat:
		n, err = s.svc.Stat(ctx, r.Path)
	case MStatInode:
		n, err = s.svc.StatInode(ctx, r.Inode)
	case MReaddir:
		out.Entries, err = s.svc.Readdir(ctx, r.Path)
	case MMkdir:
		n, err = s.svc.Mkdir(ctx, r.ReqID, r.Path, r.Parents, r.Owner)
	case MCreate:
		n, err = s.svc.Create(ctx, r.ReqID, r.Path, r.Exclusive, r.Owner)
	case MRemove:
		err = s.svc.Remove(ctx, r.ReqID, r.Path)
	case MRename:
		err = s.svc.Rename(ctx, r.ReqID, r.Path, r.Dst, r.Flags)
	case MBeginFile:
		n, out.Session, err = s.svc.BeginFile(ctx, r.Path, r.Client, r.Owner)
	case MCommitFile:
		n, err = s.svc.CommitFile(ctx, r.ReqID, r.Path, r.Inode, r.Session, r.Size)
	case MAbandonFile:
		err = s.svc.AbandonFile(ctx, r.Inode, r.Session)
	case MExtend:
		n, err = s.svc.Extend(ctx, r.Inode, r.Size, r.TruncVer, r.Session)
	case MCloseSession:
		n, err = s.svc.CloseSession(ctx, r.Inode, r.Session, r.Size, r.TruncVer)
	case MOpenWrite:
		n, out.Session, err = s.svc.OpenWrite(ctx, r.ReqID, r.Path, r.Client, r.Create, r.Exclusive, r.Owner)
	case MSetAttr:
		n, err = s.svc.SetAttr(ctx, r.Path, AttrChange{Perm: r.Perm, Uid: r.Uid, Gid: r.Gid, ATime: r.ATime, MTime: r.MTime})
	case MMknod:
		n, err = s.svc.Mknod(ctx, r.ReqID, r.Path, r.Type, r.Target, r.Rdev, r.Owner)
	case MLink:
		n, err = s.svc.Link(ctx, r.ReqID, r.Path, r.Dst)
	case MXattr:
		n, err = s.svc.Xattr(ctx, r.Path, r.Op, r.Name, r.Value, int(r.Flags))
	case MTruncate:
		if r.Path == "" {
			n, err = s.svc.TruncateInode(ctx, r.Inode, r.Size, r.Session)
		} else {
			n, err = s.svc.Truncate(ctx, r.Path, r.Size, r.Session)
		}
	}
	out.Inode = n
	return out, err
}
