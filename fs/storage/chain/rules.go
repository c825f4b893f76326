package chain

// DeltaCheck is what a replica does with an update that is a change on
// the version before it (not a whole content).
type DeltaCheck int

const (
	// DeltaApply: the update follows the committed version: build it.
	DeltaApply DeltaCheck = iota
	// DeltaDone: the version is committed here already (a retried
	// update): answer with the chunk's committed state, which the
	// predecessor compares with its own (and sends the whole content when
	// they differ).
	DeltaDone
	// DeltaMissing: a version in between never arrived: refuse, so the
	// predecessor sends the whole content.
	DeltaMissing
)

func (d DeltaCheck) String() string {
	switch d {
	case DeltaApply:
		return "apply"
	case DeltaDone:
		return "done"
	case DeltaMissing:
		return "missing update"
	}
	return "delta?"
}

// CheckDelta is the version check of every hop: an update of version ver,
// a change on version ver-1, reaching a replica whose committed version
// is committed. Shared by Replica and fs/storage.Service (the simulator's
// mutation SkipVersionCheck switches it off). Pure.
func CheckDelta(committed, ver uint64) DeltaCheck {
	switch {
	case ver <= committed:
		return DeltaDone
	case ver != committed+1:
		return DeltaMissing
	}
	return DeltaApply
}

// AckCheck is what a hop does with its successor's acknowledgement of the
// version it forwarded.
type AckCheck int

const (
	// AckCommit: the successor committed this very version (number and
	// content): commit it here.
	AckCommit AckCheck = iota
	// AckReplace: the successor holds another version or content: send it
	// the whole content (the predecessor's data wins).
	AckReplace
)

func (a AckCheck) String() string {
	switch a {
	case AckCommit:
		return "commit"
	case AckReplace:
		return "replace"
	}
	return "ack?"
}

// CheckAck is the rule of every hop on an acknowledgement: ver and sum
// are the version it forwarded and its content's checksum, ackVer and
// ackSum the successor's committed ones. Shared by Replica (the content
// itself is its checksum there) and fs/storage.Service (the whole-chunk
// checksum). Pure.
func CheckAck(ver, sum, ackVer, ackSum uint64) AckCheck {
	if ackVer == ver && ackSum == sum {
		return AckCommit
	}
	return AckReplace
}
