package client

import (
	"time"

	"github.com/ffkit/ffkit/fs/proto"
	"github.com/ffkit/ffkit/fs/trust"
)

// Identifiers, shared with the services (see package proto).
type (
	// ChainID names a chain of replicas.
	ChainID = proto.ChainID
	// ChunkID names chunk Index of file Inode.
	ChunkID = proto.ChunkID
	// Routing is mgmtd's routing snapshot.
	Routing = proto.Routing
)

// MaxChunkSize bounds a chunk's length.
const MaxChunkSize = proto.MaxChunkSize

// ErrBadRequest: an argument out of range (range past MaxChunkSize,
// unknown chain). errkind.Usage.
var ErrBadRequest = proto.ErrBadRequest

// ChunkRead is one range read of one chunk in a ReadChunks batch.
type ChunkRead struct {
	Chain ChainID
	Chunk ChunkID
	Off   int64  // offset inside the chunk
	Buf   []byte // filled completely: stored bytes, then zeros
	// Direct: if the bytes are read locally (Options.NoLocalReads) and
	// are not in the page cache, read them with O_DIRECT, leaving the
	// cache as it was (fs.OpenOptions.Direct). Otherwise a local read
	// goes through the page cache, which keeps them for the next read.
	Direct bool
	// N is set by ReadChunks: how many bytes of Buf came from stored data
	// (the rest is past the chunk's end, or the chunk does not exist).
	N int
}

// ChunkInfo describes a stored chunk.
type ChunkInfo struct {
	Index  uint64 // the chunk's index in its inode
	Length int64  // bytes stored
}

// Options tune a Client. Zero values take the defaults.
type Options struct {
	// Token is the cluster secret. Required (see LookupToken).
	Token string
	// Trust is the cluster's CA and member certificate (see fs/trust);
	// TLSLoopback uses TLS on loopback too. Nil Trust: loopback only,
	// plaintext. See transport.Options.
	Trust       *trust.Bundle
	TLSLoopback bool
	// Name names this client for the transport fault layer. Default "client".
	Name string
	// RetryTimeout is how long a call keeps retrying through
	// reconfiguration before failing with fs.ErrUnavailable. Default 60 s.
	RetryTimeout time.Duration
	// RequestTimeout bounds one attempt. Default 10 s.
	RequestTimeout time.Duration
	// MaxInFlightPerNode bounds concurrent requests to one storage
	// service. Default 8.
	MaxInFlightPerNode int
	// MaxBatchBytes and MaxBatchIOs bound one batched read request.
	// Defaults 4 MiB and 128.
	MaxBatchBytes int64
	MaxBatchIOs   int
	// MergeGap: ranges of one chunk closer than this are read as one.
	// Default 64 KiB.
	MergeGap int64
	// RefreshInterval is how often routing is refreshed in the
	// background. Default 1 s.
	RefreshInterval time.Duration
	// NoLocalReads: never read chunk files directly. By default a large
	// read from a storage service on this host (same boot and mount
	// namespace) is a short-circuit read: the service answers with the
	// committed chunk file's path and block CRCs, and the client reads
	// and checks the bytes itself, sparing both sides the copy through
	// the connection (proto.ReadIO.Local).
	NoLocalReads bool
}
