package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/transport"
	"github.com/ffkit/ffkit/fs/trust"
	"github.com/ffkit/ffkit/internal/errkind"
)

// upMgmtd runs the two mgmtd processes of `ffkit fs up` (issue 16): each
// is a child `ffkit fs mgmtd` on the embedded etcd that the fs up process
// serves (so the store outlives either of them), on an address fixed at
// the cluster's first start (DIR/cluster.json), with its own directory
// DIR/mgmtd-N (its lease candidate id). The one holding the primary lease
// in the store serves; the other stands by and takes over when the lease
// lapses (the primary frozen or killed). Both run under fs up's
// supervisor: one that dies is started again, and comes back as the
// standby (or, if nobody took its lease yet, as the primary again, with a
// new lease epoch).
type upMgmtd struct {
	dir, exe, kvSpec, tokenFile, token, metrics string
	trust                                       *trust.Bundle
	tlsLoopback                                 bool
	addrs                                       []string // primary's, standby's
	cfg                                         upConfig
	timers                                      clusterTimers

	sup  *supervisor
	kids []*supKid
}

// upLeaseTTL is the primary lease of fs up's mgmtd pair: three quarters of
// the fail timeout (3 s by default), at least 1.5 s. The storage services
// stop serving clients after half the fail timeout without a mgmtd, so a
// frozen primary costs about TTL - FailTimeout/2 + the standby's start of
// client I/O, and a takeover does not stop I/O for longer than the fail
// timeout.
func upLeaseTTL(t clusterTimers) time.Duration {
	return max(t.failTimeout*3/4, 1500*time.Millisecond)
}

// start starts mgmtd-1, waits until it serves, then starts mgmtd-2 (so
// that the first start makes mgmtd-1 the primary).
func (m *upMgmtd) start(ctx context.Context) error {
	m.sup = newSupervisor(upLogf)
	pool := transport.NewPool(transport.Options{Token: m.token, Trust: m.trust, TLSLoopback: m.tlsLoopback, Name: "fs-up"})
	defer pool.Close()
	for i := range m.addrs {
		name := fmt.Sprintf("mgmtd-%d", i+1)
		k, err := m.sup.add(name, m.starter(i), func(pid, restarts int) {
			fmt.Fprintf(os.Stderr, "ffkit: mgmtd %s pid %d (restart %d)\n", name, pid, restarts)
		})
		if err != nil {
			return err
		}
		m.kids = append(m.kids, k)
		if i > 0 {
			break
		}
		deadline := time.Now().Add(60 * time.Second)
		for m.status(ctx, pool) == nil {
			if gone, err := k.exited(); gone {
				return errkind.Wrap(errkind.Unavailable, fmt.Errorf("%s exited during start-up (%v); see %s", name, err, m.logPath(i)))
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return errkind.Wrap(errkind.Unavailable, fmt.Errorf("%s not serving within 60s; see %s", name, m.logPath(i)))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// watch starts restarting mgmtd processes that die.
func (m *upMgmtd) watch() { m.sup.watch() }

// stop stops both (SIGTERM: the primary resigns its lease, so the next
// fs up on DIR takes it at once).
func (m *upMgmtd) stop() {
	if m.sup != nil {
		m.sup.stop()
	}
}

func (m *upMgmtd) logPath(i int) string {
	return filepath.Join(m.dir, "logs", fmt.Sprintf("mgmtd-%d.log", i+1))
}

// status asks whichever mgmtd serves for the routing and readiness; nil if
// none answers.
func (m *upMgmtd) status(ctx context.Context, pool *transport.Pool) *proto.StatusResp {
	for _, addr := range m.addrs {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pool.Get(actx, addr)
		if err == nil {
			var st proto.StatusResp
			_, err = conn.Call(actx, proto.MStatus, struct{}{}, nil, &st)
			if err == nil && st.Routing != nil {
				cancel()
				return &st
			}
			pool.Drop(addr)
		}
		cancel()
	}
	return nil
}

// starter starts mgmtd i (a child process logging to DIR/logs/mgmtd-N.log,
// killed if fs up dies).
func (m *upMgmtd) starter(i int) supStart {
	return func() (*exec.Cmd, <-chan struct{}, *error, error) {
		logf, err := os.OpenFile(m.logPath(i), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, nil, nil, err
		}
		metrics := "127.0.0.1:0"
		if i == 0 || m.metrics == "" {
			metrics = m.metrics
		}
		args := []string{"fs", "mgmtd", "--dir", filepath.Join(m.dir, fmt.Sprintf("mgmtd-%d", i+1)), "--kv", m.kvSpec,
			"--listen", m.addrs[i], "--token-file", m.tokenFile, "--metrics-listen", metrics,
			"--expect-targets", strconv.Itoa(m.cfg.Storage * m.cfg.TargetsPerStorage), "--replicas", strconv.Itoa(m.cfg.Replicas),
			"--chunk-size", strconv.FormatInt(m.cfg.ChunkSize, 10),
			"--heartbeat", m.timers.heartbeat.String(), "--fail-timeout", m.timers.failTimeout.String(),
			"--lease-ttl", upLeaseTTL(m.timers).String()}
		if m.tlsLoopback {
			args = append(args, "--tls-loopback")
		}
		return startLogged(m.exe, args, logf, fmt.Sprintf("mgmtd %d", i+1))
	}
}

// freeAddr turns host:0 into host:PORT with a port free now (a listener
// opened and closed); an address with a port is returned as is.
func freeAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", usagef("--listen %q: %v", listen, err)
	}
	if port != "0" {
		return listen, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("pick a port for mgmtd on %s: %w", host, err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// hostOf is the host part of host:port.
func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}
