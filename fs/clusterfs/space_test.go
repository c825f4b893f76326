package clusterfs

import (
	"testing"

	"github.com/ffkit/ffkit/fs/proto"
)

// Each file system is counted once per host, however many storage
// processes (nodes) serve targets on it (issue 14: a one-host cluster of
// three storage processes showed three times its disk).
func TestSumSpaceCountsEachFileSystemOnce(t *testing.T) {
	r := &proto.Routing{Nodes: []proto.Node{{ID: 1, Addr: "10.0.0.1:9001"}, {ID: 2, Addr: "10.0.0.1:9002"}, {ID: 3, Addr: "10.0.0.2:9001"}}}
	const disk = 1000
	targets := []proto.TargetUsage{
		// host 10.0.0.1, one disk "a" shared by nodes 1 and 2
		{ID: 101, Node: 1, Capacity: disk, Free: 400, FSUsed: 550, FS: "a"},
		{ID: 102, Node: 1, Capacity: disk, Free: 400, FSUsed: 550, FS: "a"},
		{ID: 201, Node: 2, Capacity: disk, Free: 400, FSUsed: 550, FS: "a"},
		// host 10.0.0.2: a disk with the same id is another disk
		{ID: 301, Node: 3, Capacity: disk, Free: 900, FS: "a"},
		// unknown file system: counted alone; not measured: not counted
		{ID: 302, Node: 3, Capacity: 10, Free: 5},
		{ID: 303, Node: 3},
	}
	u := SumSpace(r, targets)
	if u.Total != 2*disk+10 || u.Free != 400+900+5 || u.Used != 550+100+5 {
		t.Fatalf("SumSpace = %+v", u)
	}
}
