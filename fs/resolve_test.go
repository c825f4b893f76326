package fs

import (
	"errors"
	"testing"

	"github.com/ffkit/ffkit/internal/errkind"
)

func TestSplitURLRefusesMalformedAuthorities(t *testing.T) {
	for _, u := range []string{"ffkit://127.0.0.1:99999/", "ffkit://127.0.0.1/", "ffkit://[::1/", "ffkit:///x",
		"ffkit://:9000/", "ffkit://h:0/", "ffkit://h:p/", "ffkit://a:1,b/", "ffkit://a:1,/"} {
		_, _, _, err := SplitURL(u)
		if !errors.Is(err, ErrBadPath) || errkind.Of(err) != errkind.Usage {
			t.Errorf("SplitURL(%q): %v, want a usage error", u, err)
		}
	}
	for u, want := range map[string]string{
		"ffkit://127.0.0.1:9000/ds":          "127.0.0.1:9000",
		"ffkit://[::1]:9000":                 "[::1]:9000",
		"ffkit://a.example:1,b.example:2/x/": "a.example:1,b.example:2",
	} {
		_, auth, _, err := SplitURL(u)
		if err != nil || auth != want {
			t.Errorf("SplitURL(%q) = %q, %v", u, auth, err)
		}
	}
}
