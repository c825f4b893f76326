package clusterfs

import (
	"context"
	"slices"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/fs/meta"
)

// The POSIX side (fs/posix.go): symlinks, special files, hard links,
// rename flags and extended attributes, all stored by the metadata
// service. New nodes take the owner fs.WithOwner put in the context.

var (
	_ fs.NodeMaker     = (*FS)(nil)
	_ fs.RenameFlagger = (*FS)(nil)
	_ fs.Xattrer       = (*FS)(nil)
)

// Symlink creates name as a symbolic link to target.
func (f *FS) Symlink(ctx context.Context, target, name string) error {
	p := abs(name)
	_, err := f.meta.Mknod(ctx, p, meta.TypeSymlink, target, 0)
	return wrap("symlink", f.String()+p, err)
}

// Readlink returns the target of the symbolic link name.
func (f *FS) Readlink(ctx context.Context, name string) (string, error) {
	p := abs(name)
	n, err := f.meta.Stat(ctx, p)
	if err != nil {
		return "", wrap("readlink", f.String()+p, err)
	}
	if n.Type != meta.TypeSymlink {
		return "", wrap("readlink", f.String()+p, meta.ErrInvalid)
	}
	return n.Target, nil
}

// Mknod creates a FIFO, socket or device node.
func (f *FS) Mknod(ctx context.Context, name string, kind fs.Kind, rdev uint32) error {
	p := abs(name)
	_, err := f.meta.Mknod(ctx, p, meta.Type(kind), "", rdev)
	return wrap("mknod", f.String()+p, err)
}

// Link makes newname a hard link of oldname.
func (f *FS) Link(ctx context.Context, oldname, newname string) error {
	o, n := abs(oldname), abs(newname)
	_, err := f.meta.Link(ctx, o, n)
	return wrap("link", f.String()+o+" to "+n, err)
}

// RenameFlags is Rename with renameat2's flags.
func (f *FS) RenameFlags(ctx context.Context, oldname, newname string, flags uint32) error {
	o, n := abs(oldname), abs(newname)
	return wrap("rename", f.String()+o+" to "+n, f.meta.RenameFlags(ctx, o, n, flags))
}

// GetXattr returns extended attribute attr of name.
func (f *FS) GetXattr(ctx context.Context, name, attr string) ([]byte, error) {
	p := abs(name)
	n, err := f.meta.Stat(ctx, p)
	if err != nil {
		return nil, wrap("getxattr", f.String()+p, err)
	}
	v, ok := n.Xattrs[attr]
	if !ok {
		return nil, wrap("getxattr "+attr, f.String()+p, fs.ErrNoAttr)
	}
	return v, nil
}

// ListXattr lists the extended attributes of name, sorted.
func (f *FS) ListXattr(ctx context.Context, name string) ([]string, error) {
	p := abs(name)
	n, err := f.meta.Stat(ctx, p)
	if err != nil {
		return nil, wrap("listxattr", f.String()+p, err)
	}
	out := make([]string, 0, len(n.Xattrs))
	for k := range n.Xattrs {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

// SetXattr sets extended attribute attr of name.
func (f *FS) SetXattr(ctx context.Context, name, attr string, value []byte, flags int) error {
	p := abs(name)
	_, err := f.meta.Xattr(ctx, p, meta.XattrSet, attr, value, flags)
	return wrap("setxattr "+attr, f.String()+p, err)
}

// RemoveXattr removes extended attribute attr of name.
func (f *FS) RemoveXattr(ctx context.Context, name, attr string) error {
	p := abs(name)
	_, err := f.meta.Xattr(ctx, p, meta.XattrRemove, attr, nil, 0)
	return wrap("removexattr "+attr, f.String()+p, err)
}
