package fuse

import (
	"context"
	"errors"
	iofs "io/fs"
	"syscall"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/errkind"
)

// Errno maps an error from the storage to the errno the FUSE caller gets.
// It is the one place where errors become errno values. Order matters: an
// errno already in the chain (the local file system's) wins, then ffkit's
// sentinels, then the error's kind.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, iofs.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, fs.ErrNoSpace):
		return syscall.ENOSPC
	case errors.Is(err, errors.ErrUnsupported), errors.Is(err, errNotSupported):
		return syscall.ENOTSUP
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, fs.ErrShortRead):
		return syscall.EIO
	case errors.Is(err, iofs.ErrInvalid):
		return syscall.EINVAL
	case errors.Is(err, fs.ErrNameTooLong):
		return syscall.ENAMETOOLONG
	case errors.Is(err, fs.ErrNoAttr):
		return syscall.ENODATA
	case errors.Is(err, fs.ErrNotPermitted):
		return syscall.EPERM
	}
	var d interface{ ErrnoForFUSE() syscall.Errno }
	if errors.As(err, &d) {
		return d.ErrnoForFUSE()
	}
	switch errkind.Of(err) {
	case errkind.Usage:
		return syscall.EINVAL
	case errkind.Unavailable:
		return syscall.EIO
	}
	return syscall.EIO
}

// errNotSupported: the backend lacks a capability the operation needs.
var errNotSupported = errkind.New(errkind.Usage, "fuse: operation not supported by this storage")
