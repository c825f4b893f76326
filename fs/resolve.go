package fs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Opener connects to a file system named by a URL's authority
// ("host:port" or "h1:p1,h2:p2").
type Opener func(ctx context.Context, authority string) (FS, error)

var (
	schemesMu sync.Mutex
	schemes   = map[string]Opener{} // guarded by schemesMu
	local     FS                    // set by package localfs
	// conns caches one FS per URL authority, so that a process connects
	// to a cluster once. Guarded by schemesMu.
	conns = map[string]FS{}
)

// RegisterScheme makes Resolve accept scheme://authority/path URLs.
func RegisterScheme(scheme string, open Opener) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	schemes[scheme] = open
}

// RegisterLocal sets the FS that plain paths resolve to.
func RegisterLocal(f FS) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	local = f
}

// ErrBadPath: a path or URL that cannot be resolved.
var ErrBadPath = errkind.New(errkind.Usage, "fs: bad path")

// ClusterScheme is the scheme of ffkit cluster URLs, whose authority is
// one or more mgmtd addresses HOST:PORT (checked by ParseAuthority).
const ClusterScheme = "ffkit"

// IsURL reports whether p names a file system by URL (scheme://...).
func IsURL(p string) bool {
	i := strings.Index(p, "://")
	return i > 0 && !strings.ContainsAny(p[:i], "/.")
}

// SplitURL splits scheme://authority/path into its parts; path keeps its
// leading slash and is "/" when empty.
func SplitURL(u string) (scheme, authority, path string, err error) {
	i := strings.Index(u, "://")
	if i <= 0 {
		return "", "", "", fmt.Errorf("%w: %q is not a URL", ErrBadPath, u)
	}
	scheme, rest := u[:i], u[i+3:]
	j := strings.IndexByte(rest, '/')
	if j < 0 {
		authority, path = rest, "/"
	} else {
		authority, path = rest[:j], rest[j:]
	}
	if authority == "" {
		return "", "", "", fmt.Errorf("%w: %q has no host:port", ErrBadPath, u)
	}
	if scheme == ClusterScheme {
		if _, err := ParseAuthority(authority); err != nil {
			return "", "", "", fmt.Errorf("%w (in %q)", err, u)
		}
	}
	return scheme, authority, path, nil
}

// ParseAuthority checks a URL's authority, one or more comma-separated
// HOST:PORT addresses (an IPv6 host in brackets, a port 1..65535), and
// returns the addresses. It is the one parser of cluster addresses: every
// command that takes ffkit://HOST:PORT refuses the same mistakes with
// ErrBadPath (a usage error).
func ParseAuthority(authority string) ([]string, error) {
	if authority == "" {
		return nil, fmt.Errorf("%w: no HOST:PORT in the URL", ErrBadPath)
	}
	var addrs []string
	for _, a := range strings.Split(authority, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			var ae *net.AddrError
			msg := err.Error()
			if errors.As(err, &ae) {
				msg = ae.Err
			}
			return nil, fmt.Errorf("%w: address %q: %s, want HOST:PORT", ErrBadPath, a, msg)
		}
		if host == "" {
			return nil, fmt.Errorf("%w: address %q has no host, want HOST:PORT", ErrBadPath, a)
		}
		if strings.ContainsAny(host, "[]/ ") {
			return nil, fmt.Errorf("%w: address %q: bad host %q, want HOST:PORT", ErrBadPath, a, host)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("%w: address %q: port %q is not a number in 1..65535, want HOST:PORT", ErrBadPath, a, port)
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}

// Resolve returns the FS a user's path lives on and the path inside it.
// Plain paths are local; scheme://authority/path URLs go to the opener
// registered for the scheme (the ffkit:// client registers itself when
// package fs/client is linked in). Connections are cached per authority.
func Resolve(ctx context.Context, p string) (FS, string, error) {
	if !IsURL(p) {
		schemesMu.Lock()
		l := local
		schemesMu.Unlock()
		if l == nil {
			return nil, "", fmt.Errorf("%w: no local file system linked in", ErrBadPath)
		}
		return l, p, nil
	}
	scheme, authority, path, err := SplitURL(p)
	if err != nil {
		return nil, "", err
	}
	key := scheme + "://" + authority
	schemesMu.Lock()
	defer schemesMu.Unlock()
	if f, ok := conns[key]; ok {
		return f, path, nil
	}
	open, ok := schemes[scheme]
	if !ok {
		return nil, "", fmt.Errorf("%w: unknown scheme %q in %q", ErrBadPath, scheme, p)
	}
	f, err := open(ctx, authority)
	if err != nil {
		return nil, "", fmt.Errorf("connect to %s: %w", key, err)
	}
	conns[key] = f
	return f, path, nil
}

// Join joins path elements with slashes, keeping a URL's scheme intact.
func Join(elem ...string) string {
	var b strings.Builder
	for i, e := range elem {
		if e == "" {
			continue
		}
		if i > 0 && b.Len() > 0 && !strings.HasSuffix(b.String(), "/") {
			b.WriteByte('/')
		}
		if b.Len() > 0 {
			e = strings.TrimLeft(e, "/")
		}
		b.WriteString(e)
	}
	return b.String()
}
