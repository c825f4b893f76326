package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/fs/client"
	"github.com/ffkit/ffkit/fs/kv/etcdkv"
	"github.com/ffkit/ffkit/fs/trust"
)

// tlsLoopbackFlag adds --tls-loopback to a service command.
func tlsLoopbackFlag(c *cobra.Command, v *bool) {
	c.Flags().BoolVar(v, "tls-loopback", false, "use TLS on loopback addresses too (default: loopback connections are plaintext, still authenticated both ways; FFKIT_TLS=always does the same; non-loopback addresses always use TLS)")
}

// clusterTrust finds the cluster's trust material for a command that
// talks to (or serves in) a cluster: $FFKIT_TLS_DIR, else DIR/tls beside
// --token-file DIR/token, else the user's token file entry for the
// cluster. Nil when none is found: loopback addresses only.
func clusterTrust(tokenFile, authority string) (*trust.Bundle, error) {
	if d := os.Getenv("FFKIT_TLS_DIR"); d != "" {
		b, err := trust.Load(d)
		if err != nil {
			return nil, fmt.Errorf("FFKIT_TLS_DIR: %w", err)
		}
		return b, nil
	}
	if tokenFile != "" {
		return client.TrustBesideTokenFile(tokenFile)
	}
	_, b, err := client.LookupCluster(authority)
	if err != nil {
		return nil, nil // no entry: the token lookup reports what is missing
	}
	return b, nil
}

// etcdFiles are the TLS files an embedded etcd of a cluster with trust b
// serves with and requires of its clients.
func etcdFiles(b *trust.Bundle) *etcdkv.TLSFiles {
	if b == nil {
		return nil
	}
	return &etcdkv.TLSFiles{CA: b.CAPath(), Cert: b.CertPath(), Key: b.KeyPath()}
}

// ensureClusterTrust creates or loads DIR/tls and tightens the modes of
// the cluster directory.
func ensureClusterTrust(dir string) (*trust.Bundle, error) {
	if err := privateDir(dir); err != nil {
		return nil, err
	}
	return trust.Ensure(filepath.Join(dir, trust.DirName))
}

// privateDir creates dir (0700) or tightens an existing one to 0700:
// a cluster directory holds the token, keys, logs and data.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// tightenFiles sets the modes of what an older ffkit left readable in a
// cluster directory: cluster.json, the token and logs 0600, the logs
// directory 0700.
func tightenFiles(dir string) error {
	paths := []string{filepath.Join(dir, "cluster.json"), filepath.Join(dir, "token")}
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*"))
	paths = append(paths, logs...)
	for _, p := range paths {
		st, err := os.Lstat(p)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if err := os.Chmod(p, 0o600); err != nil {
			return fmt.Errorf("tighten %s: %w", p, err)
		}
	}
	return nil
}
