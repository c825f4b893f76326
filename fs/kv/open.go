package kv

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/ffkit/ffkit/internal/errkind"
)

// Opener opens a store from the part of a spec after "scheme:".
type Opener func(ctx context.Context, rest string) (Store, error)

var (
	backendsMu sync.Mutex
	backends   = map[string]Opener{} // guarded by backendsMu
)

// RegisterBackend makes Open accept specs "scheme:...". Backends register
// themselves from init (memkv as "mem", etcdkv as "etcd", fdbkv as "fdb"
// when built with the fdb tag).
func RegisterBackend(scheme string, open Opener) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	backends[scheme] = open
}

// ErrBadSpec: a store spec that names no known backend.
var ErrBadSpec = errkind.New(errkind.Usage, "kv: bad store spec")

// Open opens the store a spec names, e.g. "mem:",
// "etcd://127.0.0.1:2379,127.0.0.1:2381/prefix/", or
// "fdb:/etc/foundationdb/fdb.cluster". The backend's package must be
// linked in (imported for side effects).
func Open(ctx context.Context, spec string) (Store, error) {
	scheme, rest, ok := strings.Cut(spec, ":")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("%w: %q: want SCHEME:..., e.g. etcd://HOST:PORT or mem:", ErrBadSpec, spec)
	}
	backendsMu.Lock()
	open := backends[scheme]
	var known []string
	for k := range backends {
		known = append(known, k)
	}
	backendsMu.Unlock()
	if open == nil {
		if scheme == "fdb" {
			return nil, fmt.Errorf("%w: %q: this ffkit was built without FoundationDB support; "+
				"install the FoundationDB client (libfdb_c 7.1+, https://github.com/apple/foundationdb/releases), "+
				"point go.mod at matching Go bindings (github.com/apple/foundationdb/bindings/go) and rebuild with "+
				"`go build -tags fdb ./cmd/ffkit` (docs/metadata.md, \"FoundationDB\")", ErrBadSpec, spec)
		}
		sort.Strings(known)
		return nil, fmt.Errorf("%w: %q: unknown backend %q (known: %s)", ErrBadSpec, spec, scheme, strings.Join(known, ", "))
	}
	return open(ctx, rest)
}
