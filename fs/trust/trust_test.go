package trust

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnsureCreatesPrivateFilesAndTightens(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	b, err := Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b.Cert == nil || len(b.Fingerprint()) != 64 {
		t.Fatalf("bundle: cert %v fingerprint %q", b.Cert, b.Fingerprint())
	}
	for name, want := range map[string]os.FileMode{"": 0o700, CAKeyFile: 0o600, KeyFile: 0o600} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: %v mode %v, want %v", name, err, st.Mode().Perm(), want)
		}
	}
	// An older, looser directory is tightened; the identity is kept.
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Join(dir, KeyFile), 0o644)
	b2, err := Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b2.Fingerprint() != b.Fingerprint() {
		t.Fatal("Ensure made a new CA for an existing directory")
	}
	if st, _ := os.Stat(filepath.Join(dir, KeyFile)); st.Mode().Perm() != 0o600 {
		t.Fatalf("member key not tightened: %v", st.Mode().Perm())
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Fatalf("directory not tightened: %v", st.Mode().Perm())
	}
}

func TestLoadRefusesAMemberOfAnotherCA(t *testing.T) {
	a, err := Ensure(filepath.Join(t.TempDir(), "a"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := Ensure(filepath.Join(t.TempDir(), "b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{CertFile, KeyFile} {
		b, _ := os.ReadFile(filepath.Join(other.Dir, f))
		os.WriteFile(filepath.Join(a.Dir, f), b, 0o600)
	}
	if _, err := Load(a.Dir); err == nil || !strings.Contains(err.Error(), "not issued by its CA") {
		t.Fatalf("want a refusal, got %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Fatal("an empty directory loaded")
	}
	if _, err := FromPEM([]byte("junk")); err == nil {
		t.Fatal("junk PEM accepted")
	}
}
