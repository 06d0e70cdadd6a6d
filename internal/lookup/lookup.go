// Package lookup lets a SQL store choose, per reservation, how to take a
// key. It can look the key up before reserving it: one cheap read that
// answers a replay at once, wasted on a new key. Or it can reserve the key
// straight away: a new key saves the read, a replay pays a few round trips
// more. The choice follows what the store's recent first tries found.
package lookup

import (
	"sync/atomic"
	"time"
)

// Bias bounds a [Tally]: how many first tries of one kind in a row it takes
// to change the way once the other kind dominated.
const Bias = 4

// Tally counts recent first tries: reservations of a caller that has not
// waited for the key. It adds ReplayWeight (1 if zero) for each that found
// a completed key and -1 for each that took the key, saturating at
// -Bias*ReplayWeight and +Bias: from either end, Bias first tries of the
// other kind bring it back to even. The zero value counts both kinds alike
// (and favours reserving straight away). It is safe for concurrent use.
//
// A weight w makes a look-up first the way as soon as replays are more
// than 1/(w+1) of first tries: the weight is what a replay that skipped
// the look-up costs more, in units of what a look-up wasted on a new key
// costs.
type Tally struct {
	// ReplayWeight is set before first use and not changed after.
	ReplayWeight int32
	n            atomic.Int32
}

// Replays reports whether recent first tries found completed keys often
// enough for a look-up first to pay off.
func (t *Tally) Replays() bool { return t.n.Load() > 0 }

// Add records the outcome of a reservation that found a completed key
// (replayed) or took the key, if it was a first try: wait, the
// reservation's Wait, is 0. A caller that waited for a held key says
// nothing about the traffic and is not counted. (The package imports only
// the standard library, as the module's internal helpers of its library
// packages must.)
func (t *Tally) Add(wait time.Duration, replayed bool) {
	if wait != 0 {
		return
	}
	w := max(t.ReplayWeight, 1)
	d := int32(-1)
	if replayed {
		d = w
	}
	for {
		n := t.n.Load()
		if m := min(max(n+d, -Bias*w), Bias); m == n || t.n.CompareAndSwap(n, m) {
			return
		}
	}
}
