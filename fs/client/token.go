package client

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
// or ~/.config/ffkit/tokens.json. It maps "ffkit://HOST:PORT" to tokens.
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

func urlKey(authority string) string {
	return "ffkit://" + strings.TrimPrefix(strings.TrimSuffix(authority, "/"), "ffkit://")
}

// LookupToken finds the token for a cluster authority ("host:port" or
// "h1:p1,h2:p2"): $FFKIT_TOKEN if set, else the user's token file (any of
// the listed addresses).
func LookupToken(authority string) (string, error) {
	if t := strings.TrimSpace(os.Getenv("FFKIT_TOKEN")); t != "" {
		return t, nil
	}
	p, err := TokensPath()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%w: %s", ErrNoToken, authority)
		}
		return "", fmt.Errorf("client: read %s: %w", p, err)
	}
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		return "", fmt.Errorf("client: %s is not a JSON object of tokens: %w", p, err)
	}
	if t, ok := m[urlKey(authority)]; ok {
		return t, nil
	}
	for _, a := range strings.Split(strings.TrimPrefix(authority, "ffkit://"), ",") {
		if t, ok := m[urlKey(a)]; ok {
			return t, nil
		}
	}
	return "", fmt.Errorf("%w: %s (not in %s)", ErrNoToken, authority, p)
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

// RecordToken stores the token for a cluster address in the user's token
// file (mode 0600), so local commands find it.
func RecordToken(authority, token string) error {
	p, err := TokensPath()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	m := map[string]string{}
	if b, err := os.ReadFile(p); err == nil {
		json.Unmarshal(b, &m)
	}
	m[urlKey(authority)] = token
	b, _ := json.MarshalIndent(m, "", "  ")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("client: write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return nil
}
