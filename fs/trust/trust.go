// Package trust gives a cluster its identity: a certificate authority
// created once in the cluster directory (DIR/tls, mode 0700) and a member
// certificate signed by it that every service presents. A client that
// holds the CA certificate verifies a service against it before anything
// depending on the cluster's secret crosses the connection.
//
// Files in DIR/tls:
//
//	ca.pem       the CA certificate (public; clients need it)
//	ca.key       the CA private key (0600; only needed to issue members)
//	member.pem   the member certificate: DNS name MemberName, loopback IPs
//	             and the host's addresses, both server and client use
//	member.key   its private key (0600)
//
// The member certificate is the cluster's one service identity: services
// on every host present the same certificate, and a client checks that
// the peer was issued by the cluster's CA (its ServerName is MemberName),
// not which host it is. The embedded etcd uses the same pair for TLS with
// required client certificates.
//
// A Bundle is immutable after Load/Ensure and safe for concurrent use.
package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// MemberName is the DNS name in every member certificate; clients verify
// servers against it.
const MemberName = "ffkit-member"

// File names inside a trust directory.
const (
	CAFile     = "ca.pem"
	CAKeyFile  = "ca.key"
	CertFile   = "member.pem"
	KeyFile    = "member.key"
	DirName    = "tls" // the trust directory inside a cluster directory
	validYears = 20
)

// ErrNoTrust: a trust directory is missing or incomplete.
var ErrNoTrust = errors.New("trust: no cluster CA")

// Bundle is a cluster's trust material as one process holds it.
type Bundle struct {
	// Dir is the trust directory it was loaded from ("" for a CA-only
	// bundle built from PEM).
	Dir string
	// CA is the cluster CA certificate, Pool a pool holding only it.
	CA   *x509.Certificate
	Pool *x509.CertPool
	// CAPEM is the CA certificate in PEM.
	CAPEM []byte
	// Cert is the member certificate and key; nil for a client that only
	// verifies.
	Cert *tls.Certificate
}

// Fingerprint is the hex SHA-256 of the CA certificate: the cluster's
// identity.
func (b *Bundle) Fingerprint() string {
	s := sha256.Sum256(b.CA.Raw)
	return hex.EncodeToString(s[:])
}

// Paths of the files in the bundle's directory.
func (b *Bundle) CAPath() string   { return filepath.Join(b.Dir, CAFile) }
func (b *Bundle) CertPath() string { return filepath.Join(b.Dir, CertFile) }
func (b *Bundle) KeyPath() string  { return filepath.Join(b.Dir, KeyFile) }

// ServerConfig is the TLS configuration of a service. It asks for no
// client certificate: clients prove membership with the cluster token
// over the verified session (see fs/transport).
func (b *Bundle) ServerConfig() (*tls.Config, error) {
	if b.Cert == nil {
		return nil, fmt.Errorf("%w: %s holds no member certificate", ErrNoTrust, b.Dir)
	}
	return &tls.Config{Certificates: []tls.Certificate{*b.Cert}, MinVersion: tls.VersionTLS13}, nil
}

// ClientConfig is the TLS configuration of a client: the server must
// present a certificate for MemberName issued by the cluster's CA.
func (b *Bundle) ClientConfig() *tls.Config {
	c := &tls.Config{RootCAs: b.Pool, ServerName: MemberName, MinVersion: tls.VersionTLS13}
	if b.Cert != nil {
		c.Certificates = []tls.Certificate{*b.Cert}
	}
	return c
}

// FromPEM builds a verify-only bundle from a CA certificate in PEM.
func FromPEM(caPEM []byte) (*Bundle, error) {
	blk, _ := pem.Decode(caPEM)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: not a PEM certificate", ErrNoTrust)
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("trust: parse CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &Bundle{CA: ca, Pool: pool, CAPEM: caPEM}, nil
}

// Load reads the trust directory dir: the CA certificate always, the
// member pair when present (a client's copy may hold only ca.pem).
func Load(dir string) (*Bundle, error) {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs // other processes (and tokens.json) name it
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w in %s", ErrNoTrust, dir)
		}
		return nil, fmt.Errorf("trust: %w", err)
	}
	b, err := FromPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CAFile), err)
	}
	b.Dir = dir
	cp, kp := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	if _, err := os.Stat(kp); err == nil {
		c, err := tls.LoadX509KeyPair(cp, kp)
		if err != nil {
			return nil, fmt.Errorf("trust: member certificate in %s: %w", dir, err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			return nil, fmt.Errorf("trust: member certificate in %s: %w", dir, err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: b.Pool, DNSName: MemberName,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return nil, fmt.Errorf("trust: member certificate in %s is not issued by its CA: %w", dir, err)
		}
		c.Leaf = leaf
		b.Cert = &c
	}
	return b, nil
}

// Ensure loads the trust directory dir, creating the CA and the member
// certificate on first use (directory 0700, keys 0600), and tightens the
// modes of an existing one. extraIPs are added to a new member
// certificate's addresses (for an embedded etcd on a non-loopback
// address).
func Ensure(dir string, extraIPs ...net.IP) (*Bundle, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}
	for _, f := range []string{CAKeyFile, KeyFile} {
		if err := os.Chmod(filepath.Join(dir, f), 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("trust: %w", err)
		}
	}
	if b, err := Load(dir); err == nil && b.Cert != nil {
		return b, nil
	} else if err != nil && !errors.Is(err, ErrNoTrust) {
		return nil, err
	}
	if err := create(dir, extraIPs); err != nil {
		return nil, err
	}
	return Load(dir)
}

func create(dir string, extraIPs []net.IP) error {
	now := time.Now().Add(-time.Hour)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "ffkit cluster CA " + hex.EncodeToString(serial().Bytes()[:4])},
		NotBefore:             now,
		NotAfter:              now.AddDate(validYears, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("trust: create CA: %w", err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	mKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	ips = append(ips, extraIPs...)
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				ips = append(ips, n.IP)
			}
		}
	}
	mTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: MemberName},
		DNSNames:     []string{MemberName, "localhost"},
		IPAddresses:  ips,
		NotBefore:    now,
		NotAfter:     now.AddDate(validYears, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	mDER, err := x509.CreateCertificate(rand.Reader, mTmpl, ca, &mKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("trust: create member certificate: %w", err)
	}
	caKeyDER, _ := x509.MarshalECPrivateKey(caKey)
	mKeyDER, _ := x509.MarshalECPrivateKey(mKey)
	// Keys first, the CA certificate last: Load treats a directory
	// without ca.pem as empty, so a crash part-way leaves one that the
	// next Ensure recreates.
	for _, f := range []struct {
		name, typ string
		der       []byte
		mode      os.FileMode
	}{
		{CAKeyFile, "EC PRIVATE KEY", caKeyDER, 0o600},
		{KeyFile, "EC PRIVATE KEY", mKeyDER, 0o600},
		{CertFile, "CERTIFICATE", mDER, 0o644},
		{CAFile, "CERTIFICATE", caDER, 0o644},
	} {
		if err := writeAtomic(filepath.Join(dir, f.name), pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1))
}

func writeAtomic(p string, b []byte, mode os.FileMode) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	return nil
}
