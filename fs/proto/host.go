package proto

import (
	"os"
	"strings"
	"sync"
)

// HostID names this host, mount namespace and root directory: the
// kernel's boot id, the mount namespace and the root (a chroot's), so two
// processes with equal HostIDs see the same files at the same paths. ""
// when any is unknown (no /proc): such a process neither offers nor asks
// for local reads (ReadIO.Local).
var HostID = sync.OnceValue(func() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	mnt, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return ""
	}
	root, err := os.Readlink("/proc/self/root")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(boot)) + "/" + mnt + "/" + root
})
