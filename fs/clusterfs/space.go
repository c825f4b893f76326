package clusterfs

import (
	"context"
	"fmt"
	"net"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/proto"
)

var _ fs.StatFSer = (*FS)(nil)

// StatFS reports the cluster's capacity from the storage services' latest
// space reports (SumSpace): what a mount's statfs and `ffkit fs df` show.
func (f *FS) StatFS(ctx context.Context, name string) (fs.Usage, error) {
	st, err := f.chunks.Status(ctx)
	if err != nil {
		return fs.Usage{}, err
	}
	return SumSpace(st.Routing, st.Targets), nil
}

// SumSpace adds up the file systems the targets live on, each counted
// once: targets of one host reporting the same file-system id share a
// disk, whether one storage process or several serve them. Used is the
// file systems' own use (as df(1) counts it), not only chunk data.
func SumSpace(r *proto.Routing, targets []proto.TargetUsage) fs.Usage {
	type fsKey struct{ host, fs string }
	seen := map[fsKey]bool{}
	var u fs.Usage
	for _, t := range targets {
		if t.Capacity <= 0 {
			continue // not measured
		}
		k := fsKey{host: hostOf(r, t.Node), fs: t.FS}
		if t.FS == "" {
			k.fs = fmt.Sprintf("target-%d", t.ID) // unknown: count it alone
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		u.Total += t.Capacity
		u.Free += t.Free
		used := t.FSUsed
		if used <= 0 {
			used = t.Capacity - t.Free
		}
		u.Used += used
	}
	return u
}

// hostOf is the host part of a storage node's address (the node id when
// the routing does not know it).
func hostOf(r *proto.Routing, node proto.NodeID) string {
	addr := ""
	if r != nil {
		addr = r.NodeAddr(node)
	}
	if addr == "" {
		return fmt.Sprintf("node-%d", node)
	}
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
