// Package proto holds what the services of the ffkit cluster (mgmtd,
// storage) and its client say to each other: identifiers, the routing
// information mgmtd publishes, the request and reply headers of every
// method, and the error taxonomy that crosses the wire.
//
// Headers travel as JSON in the header part of a transport frame; bulk data
// (chunk bytes) travels raw in the frame's data part, never inside JSON.
//
// Chunk data on the wire is always described by (ChainID, ChainVer): every
// hop rejects a request routed with another chain version than its own, so
// no node acts on a stale configuration.
package proto

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// NodeID names a storage service (or mgmtd, 0).
type NodeID uint32

// TargetID names a storage target: one directory of chunks, on one node,
// in one chain.
type TargetID uint32

// ChainID names a chain of targets holding identical replicas.
type ChainID uint32

// ChunkID names a chunk: chunk Index of file Inode.
type ChunkID struct {
	Inode uint64 `json:"inode"`
	Index uint64 `json:"index"`
}

// Key is the chunk id as 16 big-endian bytes, so a file's chunks sort
// together and in index order.
func (c ChunkID) Key() [16]byte {
	var k [16]byte
	binary.BigEndian.PutUint64(k[:8], c.Inode)
	binary.BigEndian.PutUint64(k[8:], c.Index)
	return k
}

func (c ChunkID) String() string { return fmt.Sprintf("%016x-%016x", c.Inode, c.Index) }

// ParseChunkID parses the String form.
func ParseChunkID(s string) (ChunkID, error) {
	var c ChunkID
	if len(s) != 33 || s[16] != '-' {
		return c, fmt.Errorf("proto: bad chunk id %q", s)
	}
	if _, err := fmt.Sscanf(s, "%016x-%016x", &c.Inode, &c.Index); err != nil {
		return c, fmt.Errorf("proto: bad chunk id %q: %w", s, err)
	}
	return c, nil
}

// MaxChunkSize bounds a chunk's length; a write past it is refused.
const MaxChunkSize = 64 << 20

// BlockSize is the checksum granularity inside a chunk: a read verifies the
// CRC32C of each block it touches, not of the whole chunk. 4 KiB keeps a
// small random read from reading (and checksumming) more than it asked.
const BlockSize = 4 << 10

// DefaultChunkSize is the chunk size mgmtd announces unless told otherwise.
const DefaultChunkSize = 4 << 20

// PayloadCRCs returns the CRC32C of each BlockSize block of data (the last
// may be short), counted from data's start.
func PayloadCRCs(data []byte) []uint32 {
	crcs := make([]uint32, (len(data)+BlockSize-1)/BlockSize)
	for b := range crcs {
		lo := b * BlockSize
		crcs[b] = crc32.Checksum(data[lo:min(lo+BlockSize, len(data))], castagnoli)
	}
	return crcs
}

// PayloadChecksum is the checksum a write carries for its data: the
// CRC32C of the big-endian block CRCs (PayloadCRCs). A receiver that
// verifies it has the block CRCs it stores for an aligned write in hand,
// so the data is checksummed once per hop.
func PayloadChecksum(crcs []uint32) uint32 {
	b := make([]byte, 4*len(crcs))
	for i, c := range crcs {
		binary.BigEndian.PutUint32(b[4*i:], c)
	}
	return crc32.Checksum(b, castagnoli)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)
