package transport

import (
	"bufio"
	"os"
	"strings"
	"sync"
	"time"
)

// Faults decides whether traffic between two named peers is dropped.
type Faults interface {
	Blocked(from, to string) bool
}

// Partition is an in-memory Faults: a set of blocked peer pairs, symmetric.
type Partition struct {
	mu    sync.Mutex
	pairs map[[2]string]bool // guarded by mu
}

// Block drops all traffic between a and b until Heal.
func (p *Partition) Block(a, b string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pairs == nil {
		p.pairs = map[[2]string]bool{}
	}
	p.pairs[[2]string{a, b}] = true
	p.pairs[[2]string{b, a}] = true
}

// Heal removes every block.
func (p *Partition) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pairs = nil
}

// Blocked implements Faults.
func (p *Partition) Blocked(from, to string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pairs[[2]string{from, to}]
}

// FileFaults reads blocked pairs from a file, one "block A B" per line,
// re-reading it at most every 50 ms; a missing file blocks nothing. Tests
// partition real processes by writing the file they all watch
// (FFKIT_FAULT_FILE).
type FileFaults struct {
	Path string

	mu    sync.Mutex
	read  time.Time          // guarded by mu
	pairs map[[2]string]bool // guarded by mu
}

// Blocked implements Faults.
func (f *FileFaults) Blocked(from, to string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.read) > 50*time.Millisecond {
		f.read = time.Now()
		f.pairs = map[[2]string]bool{}
		if fh, err := os.Open(f.Path); err == nil {
			sc := bufio.NewScanner(fh)
			for sc.Scan() {
				w := strings.Fields(sc.Text())
				if len(w) == 3 && w[0] == "block" {
					f.pairs[[2]string{w[1], w[2]}] = true
					f.pairs[[2]string{w[2], w[1]}] = true
				}
			}
			fh.Close()
		}
	}
	return f.pairs[[2]string{from, to}]
}

// FaultsFromEnv returns FileFaults for $FFKIT_FAULT_FILE, or nil.
func FaultsFromEnv() Faults {
	if p := os.Getenv("FFKIT_FAULT_FILE"); p != "" {
		return &FileFaults{Path: p}
	}
	return nil
}
