package client

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ffkit/ffkit/fs/trust"
	"github.com/ffkit/ffkit/internal/errkind"
)

// ErrNoToken: no cluster token was found for an address.
var ErrNoToken = errkind.New(errkind.Usage, "client: no cluster token (pass --token-file, set FFKIT_TOKEN, or run on the machine that ran `ffkit fs up`)")

// NewToken returns a fresh random cluster token.
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// TokensPath is the user's token file: $XDG_CONFIG_HOME/ffkit/tokens.json
// or ~/.config/ffkit/tokens.json (see tokenFile).
func TokensPath() (string, error) {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("client: no home directory for the token file: %w", err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "ffkit", "tokens.json"), nil
}

// tokenFile is tokens.json: one entry per cluster, keyed by the
// fingerprint of its CA (its identity), not by an address that another
// cluster may reuse later. An address belongs to at most one entry.
type tokenFile struct {
	Clusters map[string]*tokenEntry `json:"clusters"`
}

type tokenEntry struct {
	Token string   `json:"token"`
	CA    string   `json:"ca"`    // the CA certificate (PEM)
	Dir   string   `json:"dir"`   // the trust directory, if on this host
	Addrs []string `json:"addrs"` // host:port of its mgmtd
}

func hostPort(authority string) string {
	return strings.TrimPrefix(strings.TrimSuffix(authority, "/"), "ffkit://")
}

// readTokens reads the user's token file; entries in an older layout
// (address -> token, no cluster identity) are dropped.
func readTokens(p string) (*tokenFile, error) {
	tf := &tokenFile{Clusters: map[string]*tokenEntry{}}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return tf, nil
	}
	if err != nil {
		return nil, fmt.Errorf("client: read %s: %w", p, err)
	}
	if err := json.Unmarshal(b, tf); err != nil {
		return nil, fmt.Errorf("client: %s is not a token file: %w", p, err)
	}
	if tf.Clusters == nil {
		tf.Clusters = map[string]*tokenEntry{}
	}
	return tf, nil
}

// stale reports whether the cluster of entry e is gone: its trust
// directory on this host was removed or now holds another CA.
func (e *tokenEntry) stale(fp string) bool {
	if e.Dir == "" {
		return false
	}
	b, err := trust.Load(e.Dir)
	return err != nil || b.Fingerprint() != fp
}

func (e *tokenEntry) bundle() (*trust.Bundle, error) {
	if e.Dir != "" {
		if b, err := trust.Load(e.Dir); err == nil {
			return b, nil
		}
	}
	return trust.FromPEM([]byte(e.CA))
}

// LookupCluster finds the token and trust for a cluster authority
// ("host:port" or "h1:p1,h2:p2"). The token is $FFKIT_TOKEN if set, else
// the user's token file's entry for any of the addresses; the trust is
// $FFKIT_TLS_DIR (a trust directory) if set, else that entry's. Trust is
// nil when neither is known: the client then reaches loopback addresses
// only.
func LookupCluster(authority string) (string, *trust.Bundle, error) {
	var b *trust.Bundle
	if d := os.Getenv("FFKIT_TLS_DIR"); d != "" {
		var err error
		if b, err = trust.Load(d); err != nil {
			return "", nil, fmt.Errorf("client: FFKIT_TLS_DIR: %w", err)
		}
	}
	envTok := strings.TrimSpace(os.Getenv("FFKIT_TOKEN"))
	p, err := TokensPath()
	if err != nil {
		if envTok != "" {
			return envTok, b, nil
		}
		return "", nil, err
	}
	tf, err := readTokens(p)
	if err != nil {
		if envTok != "" {
			return envTok, b, nil
		}
		return "", nil, err
	}
	for _, a := range strings.Split(hostPort(authority), ",") {
		for fp, e := range tf.Clusters {
			if !slices.Contains(e.Addrs, a) || e.stale(fp) {
				continue
			}
			if b == nil {
				if b, err = e.bundle(); err != nil {
					return "", nil, fmt.Errorf("client: %s entry %s: %w", p, fp, err)
				}
			}
			if envTok != "" {
				return envTok, b, nil
			}
			return e.Token, b, nil
		}
	}
	if envTok != "" {
		return envTok, b, nil
	}
	return "", nil, fmt.Errorf("%w: %s (not in %s)", ErrNoToken, authority, p)
}

// LookupToken is LookupCluster's token.
func LookupToken(authority string) (string, error) {
	t, _, err := LookupCluster(authority)
	return t, err
}

// ReadTokenFile reads a token file (the whole file, trimmed).
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("client: token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("%w: token file %s is empty", ErrNoToken, path)
	}
	return t, nil
}

// TrustBesideTokenFile loads the trust directory of the cluster whose
// token file is path (DIR/token -> DIR/tls); nil if there is none.
func TrustBesideTokenFile(path string) (*trust.Bundle, error) {
	b, err := trust.Load(filepath.Join(filepath.Dir(path), trust.DirName))
	if errors.Is(err, trust.ErrNoTrust) {
		return nil, nil
	}
	return b, err
}

// RecordToken stores the token and identity of the cluster whose mgmtd
// serves at authority in the user's token file (mode 0600), so local
// commands find them. It drops the address from any other cluster's
// entry (a recycled port), and entries whose cluster is gone.
func RecordToken(authority, token string, b *trust.Bundle) error {
	if b == nil {
		return fmt.Errorf("client: record token for %s: %w", authority, trust.ErrNoTrust)
	}
	p, err := TokensPath()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	tf, err := readTokens(p)
	if err != nil {
		tf = &tokenFile{Clusters: map[string]*tokenEntry{}} // unreadable: start over
	}
	a := hostPort(authority)
	fp := b.Fingerprint()
	for k, e := range tf.Clusters {
		e.Addrs = slices.DeleteFunc(e.Addrs, func(x string) bool { return x == a })
		if k != fp && (len(e.Addrs) == 0 || e.stale(k)) {
			delete(tf.Clusters, k)
		}
	}
	e := tf.Clusters[fp]
	if e == nil {
		e = &tokenEntry{}
		tf.Clusters[fp] = e
	}
	e.Token, e.CA, e.Dir = token, string(b.CAPEM), b.Dir
	e.Addrs = append(e.Addrs, a)
	out, _ := json.MarshalIndent(tf, "", "  ")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return fmt.Errorf("client: write %s: %w", tmp, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return nil
}
