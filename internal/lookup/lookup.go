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
// waited for the key. It adds +1 for each that found a completed key and
// -1 for each that took the key, saturating at ±Bias. The zero value counts none (and
// favours reserving straight away). It is safe for concurrent use.
type Tally struct{ n atomic.Int32 }

// Replays reports whether most recent first tries found a completed key:
// then a look-up first pays off.
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
	d := int32(-1)
	if replayed {
		d = 1
	}
	for {
		n := t.n.Load()
		if m := min(max(n+d, -Bias), Bias); m == n || t.n.CompareAndSwap(n, m) {
			return
		}
	}
}
