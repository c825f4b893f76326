//go:build !race

package ffrecord

const raceEnabled = false
