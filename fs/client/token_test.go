package client

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ffkit/ffkit/fs/trust"
)

// Tokens are kept per cluster identity: an address reused by another
// cluster moves to it, and clusters that are gone are dropped.
func TestTokensKeyedByClusterIdentity(t *testing.T) {
	base := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(base, "config"))
	t.Setenv("FFKIT_TOKEN", "")
	t.Setenv("FFKIT_TLS_DIR", "")
	a, _ := trust.Ensure(filepath.Join(base, "a", "tls"))
	b, _ := trust.Ensure(filepath.Join(base, "b", "tls"))
	c, _ := trust.Ensure(filepath.Join(base, "c", "tls"))
	if err := RecordToken("127.0.0.1:7000", "token-a", a); err != nil {
		t.Fatal(err)
	}
	if err := RecordToken("127.0.0.1:7001", "token-c", c); err != nil {
		t.Fatal(err)
	}
	tok, tb, err := LookupCluster("ffkit://127.0.0.1:7000")
	if err != nil || tok != "token-a" || tb.Fingerprint() != a.Fingerprint() {
		t.Fatalf("lookup a: %q %v", tok, err)
	}
	// Cluster b takes a's port; cluster c's directory is removed.
	os.RemoveAll(filepath.Join(base, "c"))
	if err := RecordToken("127.0.0.1:7000", "token-b", b); err != nil {
		t.Fatal(err)
	}
	tok, tb, err = LookupCluster("127.0.0.1:7000")
	if err != nil || tok != "token-b" || tb.Fingerprint() != b.Fingerprint() {
		t.Fatalf("lookup after reuse: %q %v", tok, err)
	}
	if _, _, err := LookupCluster("127.0.0.1:7001"); err == nil {
		t.Fatal("a removed cluster's token is still found")
	}
	p, _ := TokensPath()
	tf, err := readTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(tf.Clusters) != 1 || tf.Clusters[b.Fingerprint()] == nil {
		t.Fatalf("entries left: %d (want only b's)", len(tf.Clusters))
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Fatalf("tokens.json mode %v", st.Mode().Perm())
	}
}
