package backend

import (
	"math"
	"time"
)

// MaxExpiry is the latest expiry a record can have: the latest instant a
// signed 64-bit count of Unix nanoseconds can hold (2262-04-11). The store's
// clock plus the TTL is clamped to it, so a TTL such as math.MaxInt64 means
// "never expire" on every store. A clock reading at or after it is refused
// with [ErrInvalidConfig].
func MaxExpiry() time.Time { return time.Unix(0, math.MaxInt64).UTC() }

// MinClock is the earliest clock reading a store accepts (1677-09-21,
// the earliest instant of a signed 64-bit count of Unix nanoseconds); an
// earlier reading is refused with [ErrInvalidConfig]. Only a store's test
// clock can be out of range; see [CheckClock].
func MinClock() time.Time { return time.Unix(0, math.MinInt64).UTC() }
