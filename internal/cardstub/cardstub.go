// Package cardstub is an in-process stand-in for another system that an
// operation calls between its local steps (a card processor): it
// deduplicates on the key it is given, so the same key gives the same
// charge, and it can be told to fail its next calls. The runner's tests and
// the conformance cases of operations share it.
package cardstub

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrDown is what a call that Fail told to fail returns.
var ErrDown = errors.New("cardstub: the processor is unavailable (503)")

// Processor counts its calls and the charges it made. Its zero value is
// not ready: use [New].
type Processor struct {
	// Calls counts every call of Charge, failed ones included.
	Calls atomic.Int64
	// Fail is how many of the next calls fail with ErrDown.
	Fail atomic.Int64

	mu      sync.Mutex
	charges map[string]string // key -> charge id
}

// New returns a Processor that has charged nothing.
func New() *Processor { return &Processor{charges: map[string]string{}} }

// Charge charges once per key: a repeated key gets the first call's id.
func (p *Processor) Charge(key string) (string, error) {
	p.Calls.Add(1)
	if p.Fail.Add(-1) >= 0 {
		return "", ErrDown
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.charges[key]; ok {
		return id, nil
	}
	id := fmt.Sprintf("ch_%d", len(p.charges)+1)
	p.charges[key] = id
	return id, nil
}

// Charges is how many distinct charges p made.
func (p *Processor) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}
