package meta

import (
	"context"
	"errors"
	iofs "io/fs"
	"math/rand/v2"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ffkit/ffkit/fs/kv"
	"github.com/ffkit/ffkit/fs/kv/etcdkv"
	"github.com/ffkit/ffkit/fs/kv/memkv"
)

// model is the reference: a set of paths, each a file or a directory.
type model map[string]bool // path -> isDir

func (m model) kids(p string) []string {
	var out []string
	pre := strings.TrimSuffix(p, "/") + "/"
	for q := range m {
		if q != "/" && strings.HasPrefix(q, pre) && !strings.Contains(q[len(pre):], "/") {
			out = append(out, q)
		}
	}
	sort.Strings(out)
	return out
}

// errClass names an error's class for comparison.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, iofs.ErrNotExist):
		return "notexist"
	case errors.Is(err, iofs.ErrExist):
		return "exist"
	case errors.Is(err, ErrNotEmpty):
		return "notempty"
	case errors.Is(err, ErrNotDir):
		return "notdir"
	case errors.Is(err, ErrIsDir):
		return "isdir"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	}
	return "other: " + err.Error()
}

// walkTo checks every proper prefix directory of p (its ancestors).
func (m model) parentOK(p string) string {
	comps := strings.Split(strings.Trim(p, "/"), "/")
	cur := ""
	for _, c := range comps[:len(comps)-1] {
		cur += "/" + c
		isDir, ok := m[cur]
		if !ok {
			return "notexist"
		}
		if !isDir {
			return "notdir"
		}
	}
	return "ok"
}

func (m model) stat(p string) string {
	if p == "/" {
		return "ok"
	}
	if c := m.parentOK(p); c != "ok" {
		return c
	}
	if _, ok := m[p]; !ok {
		return "notexist"
	}
	return "ok"
}

func (m model) mkdir(p string, parents bool) string {
	comps := strings.Split(strings.Trim(p, "/"), "/")
	cur := ""
	for i, c := range comps {
		cur += "/" + c
		isDir, ok := m[cur]
		last := i == len(comps)-1
		if ok {
			if last && (!parents || !isDir) {
				return "exist"
			}
			if !isDir {
				return "notdir"
			}
			continue
		}
		if !last && !parents {
			return "notexist"
		}
	}
	cur = ""
	for _, c := range comps {
		cur += "/" + c
		m[cur] = true
	}
	return "ok"
}

func (m model) create(p string, excl bool) string {
	if c := m.parentOK(p); c != "ok" {
		return c
	}
	if isDir, ok := m[p]; ok {
		if isDir {
			return "isdir"
		}
		if excl {
			return "exist"
		}
		return "ok"
	}
	m[p] = false
	return "ok"
}

func (m model) remove(p string) string {
	if p == "/" {
		return "invalid"
	}
	if c := m.parentOK(p); c != "ok" {
		return c
	}
	isDir, ok := m[p]
	if !ok {
		return "notexist"
	}
	if isDir && len(m.kids(p)) > 0 {
		return "notempty"
	}
	delete(m, p)
	return "ok"
}

func (m model) rename(p, q string) string {
	if p == "/" || q == "/" {
		return "invalid"
	}
	if c := m.parentOK(p); c != "ok" {
		return c
	}
	srcDir, ok := m[p]
	if !ok {
		return "notexist"
	}
	if c := m.parentOK(q); c != "ok" {
		return c
	}
	if srcDir && (path.Dir(q) == p || strings.HasPrefix(path.Dir(q), p+"/")) {
		return "invalid"
	}
	if dstDir, ok := m[q]; ok {
		if p == q {
			return "ok"
		}
		switch {
		case dstDir && !srcDir:
			return "isdir"
		case !dstDir && srcDir:
			return "notdir"
		case dstDir && len(m.kids(q)) > 0:
			return "notempty"
		}
	}
	// Move p and everything under it.
	moved := map[string]bool{}
	for k, v := range m {
		if k == p || strings.HasPrefix(k, p+"/") {
			moved[q+k[len(p):]] = v
			delete(m, k)
		}
	}
	delete(m, q)
	for k, v := range moved {
		m[k] = v
	}
	return "ok"
}

func randPath(r *rand.Rand) string {
	n := 1 + r.IntN(3)
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString("/" + []string{"a", "b", "c"}[r.IntN(3)])
	}
	return b.String()
}

// dump lists the service's tree as "path/" for dirs and "path" for files.
func dump(t *testing.T, s *Service) string {
	t.Helper()
	var out []string
	var rec func(p string)
	rec = func(p string) {
		es, err := s.Readdir(context.Background(), p)
		if err != nil {
			t.Fatalf("readdir %s: %v", p, err)
		}
		for _, e := range es {
			q := path.Join(p, e.Name)
			if e.IsDir {
				out = append(out, q+"/")
				rec(q)
			} else {
				out = append(out, q)
			}
		}
	}
	rec("/")
	sort.Strings(out)
	return strings.Join(out, " ")
}

func (m model) dump() string {
	var out []string
	for k, v := range m {
		if v {
			k += "/"
		}
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// runModel applies random operations to the service and to the model and
// compares every outcome, and the whole tree every few steps.
func runModel(t *testing.T, store kv.Store, seed uint64, steps int) {
	ctx := context.Background()
	s, _ := newTestService(t, store)
	m := model{}
	r := rand.New(rand.NewPCG(seed, 1))
	okOps := 0
	for i := 0; i < steps; i++ {
		p, q := randPath(r), randPath(r)
		var op, want, got string
		switch k := r.IntN(10); {
		case k < 2:
			parents := r.IntN(2) == 0
			op = "mkdir " + p
			want = m.mkdir(p, parents)
			_, err := s.Mkdir(ctx, "", p, parents, nil)
			got = errClass(err)
		case k < 4:
			excl := r.IntN(2) == 0
			op = "create " + p
			want = m.create(p, excl)
			_, err := s.Create(ctx, "", p, excl, nil)
			got = errClass(err)
		case k < 6:
			op = "remove " + p
			want = m.remove(p)
			got = errClass(s.Remove(ctx, "", p))
		case k < 8:
			op = "rename " + p + " " + q
			want = m.rename(p, q)
			got = errClass(s.Rename(ctx, "", p, q, 0))
		default:
			op = "stat " + p
			want = m.stat(p)
			_, err := s.Stat(ctx, p)
			got = errClass(err)
		}
		if got == "ok" {
			okOps++
		}
		if got != want {
			t.Fatalf("step %d: %s: service %s, model %s\nmodel: %s\nservice: %s", i, op, got, want, m.dump(), dump(t, s))
		}
		if i%25 == 0 || i == steps-1 {
			if a, b := dump(t, s), m.dump(); a != b {
				t.Fatalf("step %d (%s): trees differ\nservice: %s\nmodel:   %s", i, op, a, b)
			}
		}
	}
	checkTree(t, s)
	t.Logf("seed %d: %d ops succeeded of %d; final tree: %s", seed, okOps, steps, m.dump())
}

func TestModelMemKV(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		runModel(t, nil, seed, 600)
	}
}

func TestModelEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	s, _, err := etcdkv.OpenEmbedded(context.Background(), t.TempDir(), "", nil, etcdkv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runModel(t, s, 11, 300)
}

// Concurrent random operations from several clients (each its own
// Service, as separate metadata servers would be) on one store: whatever
// interleaving happens, the store stays a tree: every entry names a live
// inode that points back, no directory is unreachable, no cycle.
func TestConcurrentRandomOpsKeepATree(t *testing.T) {
	store := memkv.New(memkv.Options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	var okOps atomic.Int64
	for w := 0; w < 6; w++ {
		s, _ := newTestService(t, store)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; i < 300; i++ {
				p, q := randPath(r), randPath(r)
				var err error
				switch r.IntN(5) {
				case 0:
					_, err = s.Mkdir(ctx, "", p, r.IntN(2) == 0, nil)
				case 1:
					_, err = s.Create(ctx, "", p, r.IntN(2) == 0, nil)
				case 2:
					err = s.Remove(ctx, "", p)
				default:
					err = s.Rename(ctx, "", p, q, 0)
				}
				if c := errClass(err); strings.HasPrefix(c, "other") {
					t.Errorf("%v", err)
					return
				}
				if err == nil {
					okOps.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	s, _ := newTestService(t, store)
	checkTree(t, s)
	t.Logf("%d operations succeeded; final tree: %s", okOps.Load(), dump(t, s))
}
