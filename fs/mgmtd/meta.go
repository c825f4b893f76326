package mgmtd

import (
	"context"

	"github.com/ffkit/ffkit/fs/meta"
	"github.com/ffkit/ffkit/fs/proto"
)

// addMeta fills in the live metadata servers (registered by package
// fs/meta in the same store) so that clients, which know only mgmtd's
// address, find them. Not part of the persisted routing: a failure to
// read them leaves the list empty and the client retries.
func (s *Server) addMeta(ctx context.Context, r *proto.Routing) {
	r.Meta, _ = meta.LiveServers(ctx, s.opts.Store)
}
