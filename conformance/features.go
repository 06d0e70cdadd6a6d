package conformance

import "time"

// leaseOf is the lease the suite asks for when it wants d: at least the
// store's [Features].MinLease, rounded up to its ExpiryGranularity.
func (f Features) leaseOf(d time.Duration) time.Duration {
	d = max(d, f.MinLease)
	if g := f.ExpiryGranularity; g > 0 && d%g != 0 {
		d += g - d%g
	}
	return d
}

// slack is what a bound on a lease's or a record's end allows beyond it:
// the store's ExpiryGranularity (zero for a precise store).
func (f Features) slack() time.Duration { return max(f.ExpiryGranularity, 0) }

// testClockSkip says why the cases that drive a test clock are skipped on
// this store, "" when they run.
func (f Features) testClockSkip() string {
	switch {
	case f.NoClock:
		return "conformance: this case drives time through Options.Clock, which the fixture does not honour (Features.NoClock); TTLExpiryStoreClock checks the rule on the store's own clock"
	case f.ExpiryGranularity > 0:
		return "conformance: this case drives time through Options.Clock to the millisecond, finer than the store's Features.ExpiryGranularity; TTLExpiryStoreClock checks the rule on the store's own clock"
	}
	return ""
}
