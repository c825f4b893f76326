package etcdkv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ffkit/ffkit/fs/kv"
	etcdtransport "go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// EmbedConfig describes one embedded etcd member.
type EmbedConfig struct {
	// Dir holds the member's data; a later start on the same Dir brings
	// the same data back. Required.
	Dir string
	// Name of the member. Default "ffkit".
	Name string
	// ClientAddr and PeerAddr are host:port to listen on. Default: a free
	// port on 127.0.0.1.
	ClientAddr, PeerAddr string
	// InitialCluster is "name=http://peer,..." for a multi-member
	// cluster. Default: this member alone.
	InitialCluster string
	// Token tells clusters apart. Default "ffkit".
	Token string
	// NoFsync skips fsync (tests of a replicated cluster). Default false.
	NoFsync bool
	// TickMs and ElectionMs set raft timing. Defaults 100 and 1000.
	TickMs, ElectionMs uint
	// Logger receives etcd's logs. Default: none (etcd is chatty).
	Logger *zap.Logger
	// StartTimeout bounds the wait for the member to serve. Default 60s.
	StartTimeout time.Duration
	// TLS, if set, serves clients and peers over TLS and requires their
	// certificates, issued by TLS.CA: only holders of a certificate from
	// that CA read or write anything. Default nil: plaintext, no
	// authentication (tests only).
	TLS *TLSFiles
}

// TLSFiles names the PEM files of a TLS identity.
type TLSFiles struct {
	CA, Cert, Key string
}

// ClientConfig is the TLS configuration of a client with this identity.
func (f *TLSFiles) ClientConfig() (*tls.Config, error) {
	info := etcdtransport.TLSInfo{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA}
	c, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcdkv: TLS identity (ca %s, cert %s, key %s): %w", f.CA, f.Cert, f.Key, err)
	}
	return c, nil
}

// Query is the part of a store spec that passes the files
// ("?cacert=...&cert=...&key=...").
func (f *TLSFiles) Query() string {
	return "?" + url.Values{"cacert": {f.CA}, "cert": {f.Cert}, "key": {f.Key}}.Encode()
}

// Server is a running embedded etcd member.
type Server struct {
	e        *embed.Etcd
	endpoint string
	name     string
	tls      *TLSFiles
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// StartEmbedded starts an etcd member inside this process and waits until
// it serves.
func StartEmbedded(ctx context.Context, c EmbedConfig) (*Server, error) {
	if c.Dir == "" {
		return nil, fmt.Errorf("%w: etcdkv: embedded etcd needs a data directory", kv.ErrUnavailable)
	}
	if c.Name == "" {
		c.Name = "ffkit"
	}
	if c.Token == "" {
		c.Token = "ffkit"
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 60 * time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcdkv: %w", err)
	}
	// A port found free may be taken (as another connection's ephemeral
	// port) before etcd binds it: then pick new ones and start again.
	pickClient, pickPeer := c.ClientAddr == "", c.PeerAddr == ""
	for attempt := 1; ; attempt++ {
		var err error
		for _, a := range []struct {
			pick bool
			addr *string
		}{{pickClient, &c.ClientAddr}, {pickPeer, &c.PeerAddr}} {
			if a.pick {
				if *a.addr, err = freeAddr(); err != nil {
					return nil, fmt.Errorf("%w: etcdkv: %v", kv.ErrUnavailable, err)
				}
			}
		}
		s, err := startEmbedded(ctx, c)
		if err == nil || !(pickClient || pickPeer) || attempt == 5 || !addrInUse(err) {
			return s, err
		}
	}
}

// freeAddr is FreeAddr; tests replace it.
var freeAddr = FreeAddr

// addrInUse: err is a failure to bind an address in use. etcd flattens
// the cause into its message, so the message is checked too.
func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func startEmbedded(ctx context.Context, c EmbedConfig) (*Server, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = filepath.Join(c.Dir, "member-data")
	scheme := "http"
	if c.TLS != nil {
		scheme = "https"
		info := etcdtransport.TLSInfo{CertFile: c.TLS.Cert, KeyFile: c.TLS.Key, TrustedCAFile: c.TLS.CA, ClientCertAuth: true}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = info, info
	}
	cu := url.URL{Scheme: scheme, Host: c.ClientAddr}
	pu := url.URL{Scheme: scheme, Host: c.PeerAddr}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	// etcd's HTTP endpoints (health, version) get a port of their own, so
	// that the client port serves gRPC alone with gRPC's own server: when
	// one TLS port serves both, gRPC goes through net/http's HTTP/2 server
	// (etcd's grpcHandlerFunc), which costs the metadata service about
	// half of its etcd round-trip throughput (profile in
	// docs/perf/meta-mount.md).
	httpAddr, err := FreeAddr()
	if err != nil {
		return nil, fmt.Errorf("%w: etcdkv: %v", kv.ErrUnavailable, err)
	}
	cfg.ListenClientHttpUrls = []url.URL{{Scheme: scheme, Host: httpAddr}}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = c.InitialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = c.Name + "=" + pu.String()
	}
	cfg.InitialClusterToken = c.Token
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.UnsafeNoFsync = c.NoFsync
	if c.TickMs > 0 {
		cfg.TickMs = c.TickMs
	}
	if c.ElectionMs > 0 {
		cfg.ElectionMs = c.ElectionMs
	}
	// Metadata transactions read and compare many keys: lift etcd's
	// default of 128 operations and 1.5 MiB per request.
	cfg.MaxTxnOps = 1 << 16
	cfg.MaxRequestBytes = 8 << 20
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "10m"
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(c.Logger)
	cfg.ListenMetricsUrls = nil
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: etcdkv: start embedded etcd in %s: %v", kv.ErrUnavailable, c.Dir, err)
	}
	timer := time.NewTimer(c.StartTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("%w: etcdkv: embedded etcd in %s: %v", kv.ErrUnavailable, c.Dir, err)
	case <-timer.C:
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("%w: etcdkv: embedded etcd in %s not ready after %v", kv.ErrUnavailable, c.Dir, c.StartTimeout)
	case <-ctx.Done():
		e.Server.Stop()
		e.Close()
		return nil, ctx.Err()
	}
	return &Server{e: e, endpoint: c.ClientAddr, name: c.Name, tls: c.TLS}, nil
}

// Endpoint is the member's client address (host:port).
func (s *Server) Endpoint() string { return s.endpoint }

// Spec is how another process reaches the member: "etcd://host:port",
// with the TLS files as a query when the member uses TLS.
func (s *Server) Spec() string {
	if s.tls != nil {
		return "etcd://" + s.endpoint + s.tls.Query()
	}
	return "etcd://" + s.endpoint
}

// Close stops the member.
func (s *Server) Close() { s.e.Close() }

// OpenEmbedded starts a single-member etcd with its data in dir and
// returns a Store on it that owns the server: Close stops both. clientAddr
// may be "" for a free port; other processes reach the same store through
// Endpoint.
//
// With files non-nil the member serves TLS only and requires client
// certificates (see EmbedConfig.TLS); the Store uses files as its own
// identity.
func OpenEmbedded(ctx context.Context, dir, clientAddr string, files *TLSFiles, opts Options) (*Store, *Server, error) {
	srv, err := StartEmbedded(ctx, EmbedConfig{Dir: dir, ClientAddr: clientAddr, TLS: files})
	if err != nil {
		return nil, nil, err
	}
	if files != nil && opts.TLS == nil {
		if opts.TLS, err = files.ClientConfig(); err != nil {
			srv.Close()
			return nil, nil, err
		}
	}
	s, err := Open(ctx, []string{srv.Endpoint()}, opts)
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	s.onClose = srv.Close
	return s, srv, nil
}

// Cluster is a multi-member etcd cluster of embedded members on loopback,
// for tests and local experiments.
type Cluster struct {
	Members []*Server
	configs []EmbedConfig
}

// StartCluster starts n members with their data under dir and waits until
// all serve.
func StartCluster(ctx context.Context, dir string, n int) (*Cluster, error) {
	cl := &Cluster{}
	var peers []string
	for i := 0; i < n; i++ {
		ca, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		pa, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		c := EmbedConfig{Dir: filepath.Join(dir, fmt.Sprintf("m%d", i)), Name: fmt.Sprintf("m%d", i),
			ClientAddr: ca, PeerAddr: pa, Token: "ffkit-test", NoFsync: true, TickMs: 50, ElectionMs: 500}
		cl.configs = append(cl.configs, c)
		peers = append(peers, c.Name+"=http://"+pa)
	}
	type res struct {
		i   int
		s   *Server
		err error
	}
	ch := make(chan res, n)
	for i := range cl.configs {
		cl.configs[i].InitialCluster = strings.Join(peers, ",")
		go func(i int) {
			s, err := StartEmbedded(ctx, cl.configs[i])
			ch <- res{i, s, err}
		}(i)
	}
	cl.Members = make([]*Server, n)
	var first error
	for i := 0; i < n; i++ {
		r := <-ch
		cl.Members[r.i] = r.s
		if r.err != nil && first == nil {
			first = r.err
		}
	}
	if first != nil {
		cl.Close()
		return nil, first
	}
	return cl, nil
}

// Endpoints lists the members' client addresses.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.configs {
		eps = append(eps, m.ClientAddr)
	}
	return eps
}

// StopMember stops member i (a crash, as far as the others can tell).
func (c *Cluster) StopMember(i int) {
	if m := c.Members[i]; m != nil {
		m.Close()
		c.Members[i] = nil
	}
}

// Close stops every member.
func (c *Cluster) Close() {
	for i := range c.Members {
		c.StopMember(i)
	}
}
