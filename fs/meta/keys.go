package meta

import (
	"encoding/binary"
	"fmt"
)

// The key schema of the metadata store. It exists once here and once in
// docs/meta-schema.md; TestSchemaDocInSync keeps the two in sync (every
// row of Schema must appear verbatim in the document's table).
//
// Every key starts with a 4-byte ASCII prefix. Inode ids are 8 bytes
// big-endian, so the entries of one directory (DENT + parent) and the
// sessions of one inode (INOS + inode) are contiguous key ranges: listing
// a directory, testing it for emptiness, and finding a file's writers are
// single range reads. Values are JSON, except directory entries (binary).

// Key prefixes.
const (
	prefixInode   = "INOD"
	prefixDentry  = "DENT"
	prefixSession = "INOS"
	prefixIdem    = "IDEM"
	prefixGC      = "GCQU"
	prefixServer  = "MSRV"
	prefixDirTime = "DTIM"
	keyInodeAlloc = "IALC"
)

// SchemaRow documents one kind of key.
type SchemaRow struct {
	Key   string // the key's layout
	Value string // what the value holds
}

// Schema is the whole key schema, in the order docs/meta-schema.md lists it.
var Schema = []SchemaRow{
	{"INOD + inode (8 bytes BE)", "Inode JSON: id, type (1 file, 2 directory, 3 symlink, 4 FIFO, 5 socket, 6 character device, 7 block device), parent and name (the name its dentry copies follow; empty once that hard link is removed), size, mtime, atime, ctime (ns), truncate version, layout (chunk size, chains; files only), nlink (a file: its names; a directory: 2 + its subdirectories, changed by mkdir, rmdir and rename in their transaction), holes flag, perm, uid, gid, rdev, symlink target, xattrs"},
	{"DENT + parent inode (8 bytes BE) + name", "Dentry, 26 bytes (version 1) or 38 (version 2): version (1), flags (1: bit 0 directory, bit 1 owned: the inode stores permission bits and owner, bit 2 linked more than once when written, bits 4-7 the inode type, 0 in older entries), inode (8 BE), size (8 BE), mtime ns (8 BE), then in version 2 (owned entries) perm (4 BE), uid (4 BE), gid (4 BE); size, mtime and owner are copies so that a listing is one range read (a listing reads the inode of an owned version 1 entry or of one with bit 2 set, whose copies another name's change may have left stale)"},
	{"INOS + inode (8 bytes BE) + session id", "Session JSON: client, expiry; a write session of the inode (an unlinked inode with sessions is not collected)"},
	{"IDEM + request id", "Idem JSON: the stored result of a create, mkdir, rename, remove or commit, and when it was stored; a retried request returns it instead of acting twice"},
	{"GCQU + inode (8 bytes BE)", "GC JSON: the chains and first chunk index to remove of a deleted or truncated file; the collector removes the chunks, then the record (and the inode)"},
	{"MSRV + server address", "Server JSON: a live metadata server and its lease expiry; clients find metadata servers here through mgmtd"},
	{"DTIM + directory inode (8 bytes BE)", "16 bytes: mtime ns (8 BE), ctime ns (8 BE) of the directory's last entry change (create, remove, rename, link); written without a read, so concurrent changes in one directory do not conflict; it overrides the inode's times when newer than the inode's ctime"},
	{"IALC", "the next free inode id (8 bytes BE); servers take ids in blocks of 1024"},
}

// RootInode is the root directory's inode id.
const RootInode uint64 = 1

func inodeKey(id uint64) []byte {
	k := make([]byte, 0, 12)
	k = append(k, prefixInode...)
	return binary.BigEndian.AppendUint64(k, id)
}

func dentryPrefix(parent uint64) []byte {
	k := make([]byte, 0, 12)
	k = append(k, prefixDentry...)
	return binary.BigEndian.AppendUint64(k, parent)
}

func dentryKey(parent uint64, name string) []byte {
	return append(dentryPrefix(parent), name...)
}

// dentryName extracts the name from a DENT key.
func dentryName(k []byte) (string, error) {
	if len(k) < 12 || string(k[:4]) != prefixDentry {
		return "", fmt.Errorf("meta: bad dentry key %q", k)
	}
	return string(k[12:]), nil
}

func sessionPrefix(inode uint64) []byte {
	k := make([]byte, 0, 12)
	k = append(k, prefixSession...)
	return binary.BigEndian.AppendUint64(k, inode)
}

func sessionKey(inode uint64, session string) []byte {
	return append(sessionPrefix(inode), session...)
}

func idemKey(req string) []byte { return append([]byte(prefixIdem), req...) }

func gcKey(inode uint64) []byte {
	k := make([]byte, 0, 12)
	k = append(k, prefixGC...)
	return binary.BigEndian.AppendUint64(k, inode)
}

func serverKey(addr string) []byte { return append([]byte(prefixServer), addr...) }

// Dentries are fixed-size binary, not JSON: a listing decodes one per
// entry and JSON cost dominated it. Version 1 entries (26 bytes) carry no
// owner; owned entries are written as version 2 (38 bytes) with a copy of
// the inode's permission bits and owner.
const (
	dentrySize   = 26
	dentrySizeV2 = dentrySize + 12
)

func encodeDentry(d Dentry) []byte {
	b := make([]byte, 2, dentrySizeV2)
	b[0] = 1
	if d.IsDir {
		b[1] |= 1
	}
	if d.Owned {
		b[0] = 2
		b[1] |= 2
	}
	if d.Shared {
		b[1] |= 4
	}
	b[1] |= byte(d.Type&0xf) << 4
	b = binary.BigEndian.AppendUint64(b, d.Inode)
	b = binary.BigEndian.AppendUint64(b, uint64(d.Size))
	b = binary.BigEndian.AppendUint64(b, uint64(d.MTime))
	if d.Owned {
		b = binary.BigEndian.AppendUint32(b, d.Perm)
		b = binary.BigEndian.AppendUint32(b, d.Uid)
		b = binary.BigEndian.AppendUint32(b, d.Gid)
	}
	return b
}

func decodeDentry(b []byte) (Dentry, error) {
	v := firstByte(b)
	if !(v == 1 && len(b) == dentrySize) && !(v == 2 && len(b) == dentrySizeV2) {
		return Dentry{}, fmt.Errorf("meta: bad directory entry value (%d bytes, version %d)", len(b), v)
	}
	d := Dentry{IsDir: b[1]&1 != 0, Owned: b[1]&2 != 0, Shared: b[1]&4 != 0, Type: Type(b[1] >> 4),
		Inode: binary.BigEndian.Uint64(b[2:10]),
		Size:  int64(binary.BigEndian.Uint64(b[10:18])), MTime: int64(binary.BigEndian.Uint64(b[18:26]))}
	if v == 2 {
		d.Perm = binary.BigEndian.Uint32(b[26:30])
		d.Uid = binary.BigEndian.Uint32(b[30:34])
		d.Gid = binary.BigEndian.Uint32(b[34:38])
		d.hasOwner = d.Owned
	}
	return d, nil
}

func firstByte(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}

func dirTimeKey(dir uint64) []byte {
	k := make([]byte, 0, 12)
	k = append(k, prefixDirTime...)
	return binary.BigEndian.AppendUint64(k, dir)
}
