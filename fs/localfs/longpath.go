package localfs

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pathMax is Linux's PATH_MAX: the longest path a system call takes,
// counting its terminating NUL.
const pathMax = unix.PathMax

// shortPath returns a name for name that system calls take, and a release
// to call when done with it. A path of PATH_MAX bytes or more (a path
// near PATH_MAX inside a mount of a local directory is longer than that
// as the directory's absolute path) is named through a descriptor of one
// of its ancestors, /proc/self/fd/N/REST, the ancestor opened (O_PATH) by
// walking down in pieces shorter than PATH_MAX; shorter paths are
// returned as they are. What resolving the name does (following symbolic
// links among its directories, not its last component unless the call
// does) is unchanged.
func shortPath(name string) (string, func(), error) {
	if len(name) < pathMax {
		return name, func() {}, nil
	}
	dirfd := unix.AT_FDCWD
	release := func() {
		if dirfd != unix.AT_FDCWD {
			unix.Close(dirfd)
		}
	}
	rest := name
	for {
		prefix := ""
		if dirfd != unix.AT_FDCWD {
			prefix = "/proc/self/fd/" + strconv.Itoa(dirfd) + "/"
		}
		if len(prefix)+len(rest) < pathMax {
			return prefix + rest, release, nil
		}
		i := strings.LastIndexByte(rest[:pathMax-1], '/')
		if i <= 0 {
			release()
			return "", nil, &os.PathError{Op: "open", Path: name, Err: unix.ENAMETOOLONG}
		}
		fd, err := unix.Openat(dirfd, rest[:i], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			release()
			return "", nil, &os.PathError{Op: "open", Path: name[:len(name)-len(rest)+i], Err: err}
		}
		release()
		dirfd = fd
		rest = strings.TrimLeft(rest[i+1:], "/")
	}
}

// shortPaths is shortPath of two names.
func shortPaths(a, b string) (string, string, func(), error) {
	sa, ra, err := shortPath(a)
	if err != nil {
		return "", "", nil, err
	}
	sb, rb, err := shortPath(b)
	if err != nil {
		ra()
		return "", "", nil, err
	}
	return sa, sb, func() { ra(); rb() }, nil
}
