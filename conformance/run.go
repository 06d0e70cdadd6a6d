package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Callers is how many concurrent callers the concurrency cases fire.
const Callers = 20

// caseTimeout bounds every case: a deadlock fails the case instead of
// hanging the run.
const caseTimeout = 60 * time.Second

// testCase is one named subtest of [Run] and the contract sentences it
// checks (logged when it fails).
type testCase struct {
	name  string
	rules []rule
	fn    func(t *testing.T)
}

// Run runs every conformance case against the backend that h describes,
// each as a subtest named after the contract it checks. A failing case
// logs the sentences of keystore.go (or idempotency.go) it checks.
func Run[Tx any](t *testing.T, h Harness[Tx]) {
	t.Helper()
	if h.NewFixture == nil {
		t.Fatal("conformance: Harness.NewFixture is nil")
	}
	s := &suite[Tx]{h: h, late: newLateSink(t), lacks: map[string]bool{}}
	for _, c := range s.cases() {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(func() {
				if t.Failed() {
					for _, r := range c.rules {
						t.Logf("contract: %v", r)
					}
				}
			})
			// The case's context ends as soon as the case function returns
			// (or fails), before any cleanup. The goroutines the case
			// started see it, and the cleanups of within and fire wait for
			// them while t can still take their reports.
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			s.ctx = ctx
			c.fn(t)
		})
	}
}

func (s *suite[Tx]) cases() []testCase {
	return []testCase{
		{"ConcurrentSameKey", []rule{ruleOneTxn}, s.concurrentSameKey},
		{"WinnerFailsWhileOthersWait", []rule{ruleWaitThenRecord, ruleRollback}, s.winnerFails},
		{"SmallPool", []rule{ruleOneConn}, s.smallPool},
		{"DistinctKeysParallel", nil, s.distinctKeys},
		{"DistinctKeyNotBlocked", nil, s.distinctKeyNotBlocked},
		{"ScopesAreSeparate", []rule{ruleKeys}, s.scopes},
		{"KeysAreByteExact", []rule{ruleKeys}, s.byteExactKeys},
		{"WaiterGetsReplay", []rule{ruleWaitThenRecord}, s.waiterGetsReplay},
		{"WaitBound", []rule{ruleInProgress}, s.waitBound},
		{"NoWait", []rule{ruleInProgress}, s.noWait},
		{"CancelWhileWaiting", []rule{ruleCtx, ruleOneConn}, s.cancelWhileWaiting},
		{"OneStoreWaiterPerKey", []rule{ruleMemWait}, s.oneStoreWaiterPerKey},
		{"MaxWaitersBound", []rule{ruleMaxWaiters}, s.maxWaiters},
		{"ErrorRollsBack", []rule{ruleRollback}, s.errorRollsBack},
		{"PanicRollsBack", []rule{ruleRollback}, s.panicRollsBack},
		{"InvalidResponseRollsBack", []rule{ruleRollback}, s.invalidResponse},
		{"RollbackWithCancelledContext", []rule{ruleRollbackDone, ruleRollback}, s.rollbackCancelled},
		{"CompleteWithCancelledContext", []rule{ruleCompleteDone}, s.completeCancelled},
		{"CompleteInterrupted", []rule{ruleAtomic, ruleComplete}, s.completeInterrupted},
		{"FnEndsTx", []rule{ruleFnEndsTx}, s.fnEndsTx},
		{"LeaseRunsOut", []rule{ruleLease}, s.leaseRunsOut},
		{"LargeBinaryBody", []rule{ruleBytes}, s.largeBody},
		{"HeaderBytes", []rule{ruleBytes}, s.headerBytes},
		{"EmptyBodyAndHeader", []rule{ruleEmpty}, s.emptyBody},
		{"RecordBelongsToCaller", []rule{ruleOwner, ruleCreatedAt}, s.recordOwnership},
		{"InvalidInputRefused", nil, s.invalidInput},
		{"TTLExpiry", []rule{ruleExpiredAbsent}, s.ttlExpiry},
		{"TTLFromCompletion", []rule{ruleTTL, ruleCompletedWhileWaiting}, s.ttlFromCompletion},
		{"TTLFromCompletionClock", []rule{ruleTTL, ruleCompletedWhileWaiting}, s.ttlFromCompletionClock},
		{"TTLExtremes", []rule{ruleMaxExpiry, ruleTimes}, s.ttlExtremes},
		{"ClockExtremes", []rule{ruleMaxExpiry, ruleMinClock, ruleTimes}, s.clockExtremes},
		{"SubMillisecondExpiry", []rule{ruleTimes, ruleExpiredAbsent}, s.subMillisecond},
		{"Purge", []rule{rulePurgeDeletes}, s.purge},
		{"PurgeSkipsHeld", []rule{rulePurgeHeld}, s.purgeSkipsHeld},
		{"MigrateTwice", []rule{ruleMigrate}, s.migrateTwice},
		{"SchemaCheck", []rule{ruleSchemaCheck}, s.schemaCheck},
		{"Observer", nil, s.observer},
		{"NoGoroutineGrowth", nil, s.noGoroutineGrowth},
		{"RacingReserves", []rule{ruleOneTxn, ruleTakeoverCAS}, s.racingReserves},
		{"RacingWinnerFails", []rule{ruleWaitThenRecord, ruleRollback}, s.racingWinnerFails},
		{"LeaseTakeover", []rule{ruleLeaseEnds, ruleTakeoverCAS, ruleLease}, s.leaseTakeover},
		{"LeaseStaleRollback", []rule{ruleStaleOwner}, s.leaseStaleRollback},
		{"LeaseStaleComplete", []rule{ruleStaleOwner, ruleLease}, s.leaseStaleComplete},
		{"PurgeRecheck", []rule{rulePurgeRecheck, rulePurgeNotHeldOnly}, s.purgeRecheck},
		{"PurgeLimit", []rule{rulePurgeCount, rulePurgeDeletes}, s.purgeLimit},
		{"PurgeCountsDeleted", []rule{rulePurgeCount}, s.purgeCountsDeleted},
		{"FailedCompleteFreesKey", []rule{ruleFailedComplete}, s.failedCompleteFreesKey},
		// On the store's own clock, and on hosts whose clocks differ.
		{"TTLExpiryStoreClock", []rule{ruleStoreClock, ruleExpiredAbsent, ruleRoundUp, rulePurgeDeletes}, s.ttlExpiryStoreClock},
		{"HostClocksDiffer", []rule{ruleHostsDisagree, ruleNoClockHold}, s.hostClocksDiffer},
		{"LeaseHolderDies", []rule{ruleHoldEnds, ruleLeaseEnds}, s.leaseHolderDies},
		// Multi-step operations (backend.Stepper); skipped on a store
		// that does not implement it.
		{"StepsNewKey", []rule{ruleAcquirePhase, ruleStepOneTxn, ruleSave, rulePhaseRollback}, s.stepsNewKey},
		{"StepsResumeOwnLease", []rule{ruleAcquirePhase, ruleSave, rulePhaseRollback}, s.stepsResumeOwnLease},
		{"StepsOtherOwnerLiveLease", []rule{ruleAcquireHeld}, s.stepsOtherOwnerLiveLease},
		{"StepsLeaseEndsByStoreClock", []rule{ruleStepClock, ruleAcquirePhase, ruleAcquireHeld}, s.stepsLeaseClock},
		{"StepsTakeOverIsCAS", []rule{ruleStepCAS, ruleAcquireHeld}, s.stepsTakeOverIsCAS},
		{"StepsReleaseCountsTries", []rule{ruleRelease, ruleAcquireTries, rulePhaseRollback}, s.stepsReleaseCountsTries},
		{"StepsCompleteClearsProgress", []rule{rulePhaseComplete, ruleAcquireRecord, ruleCreatedAt}, s.stepsComplete},
		{"StepsReserveTreatsUnfinishedAsHeld", []rule{ruleStepReserveHeld}, s.stepsReserveUnfinished},
		{"StepsPurgeSkipsUnfinished", []rule{ruleStepNeverExpires, rulePurgeDeletes}, s.stepsPurgeSkipsUnfinished},
		{"StepsAbandoned", []rule{ruleAbandoned, ruleAbandonedNoLock}, s.stepsAbandoned},
		{"StepsPhaseOneConnection", []rule{ruleOneConn, rulePhaseOver}, s.stepsOneConnection},
		{"StepsInvalidInput", []rule{ruleAcquireInput, ruleSave, ruleAbandonedLimit, rulePhaseOver}, s.stepsInvalidInput},
		{"StepsHoldRunsOutMidStep", []rule{rulePhaseHolds, ruleStepClock}, s.stepsHoldRunsOut},
		// Key administration (backend.KeyAdmin, backend.KeyLister);
		// skipped on a store that does not implement it.
		{"AdminInspect", []rule{ruleInspect, ruleInspectHeldNew, ruleStateHeld, ruleStateUnfinished, ruleStateExpired, ruleInfoTimes}, s.adminInspect},
		{"AdminForget", []rule{ruleForget, ruleForgetUnfinished}, s.adminForget},
		{"AdminList", []rule{ruleList, ruleListNext, ruleListCursor, ruleListLimit}, s.adminList},
		{"AdminStats", []rule{ruleStats, ruleStatsFields}, s.adminStats},
		// Quota counters (backend.QuotaCounter); skipped on a store
		// that does not implement it.
		{"QuotaAtomic", []rule{ruleQuotaAtomic, ruleQuotaCAS}, s.quotaAtomic},
		{"QuotaReplayFree", []rule{ruleQuotaReplay}, s.quotaReplayFree},
		{"QuotaRefusedNotCounted", []rule{ruleQuotaOver, ruleQuotaEnd}, s.quotaRefusedNotCounted},
		// Operations end to end (Guard.Run over backend.Stepper).
		{"OperationConcurrentSameKey", nil, s.operationConcurrentSameKey},
		{"OperationResumes", nil, s.operationResumes},
		{"OperationLease", nil, s.operationLease},
		{"OperationCompleter", nil, s.operationCompleter},
		{"OperationDurable", nil, s.operationDurable},
	}
}

type suite[Tx any] struct {
	h Harness[Tx]
	// ctx is the running case's context, set by Run before each case
	// (the cases run one at a time).
	ctx context.Context
	// late takes the reports that reach a fixture's t after its case ended.
	late *lateSink
	// lacks names the optional interfaces (backend.Stepper, KeyAdmin,
	// KeyLister) a fixture's store was found not to implement: the later
	// cases that need one skip without building a fixture.
	lacks map[string]bool
}

// env is one case's fixture, context and helpers.
type env[Tx any] struct {
	t   *testing.T
	ctx context.Context
	f   Fixture[Tx]
	// stores are the instances of the store the case spread its callers
	// over: f.Store first, then the ones Fixture.Reopen opened.
	stores []idempotency.KeyStore[Tx]
	// lacks is the suite's: see suite.lacks.
	lacks map[string]bool
	// feat is the harness's Features.
	feat Features
}

func (s *suite[Tx]) setup(t *testing.T, opts Options) *env[Tx] {
	t.Helper()
	ctx := s.ctx
	if ctx == nil {
		c, cancel := context.WithTimeout(context.Background(), caseTimeout)
		t.Cleanup(cancel)
		ctx = c
	}
	f := s.h.NewFixture(guardTB(t, s.late), opts)
	if f.Store == nil || f.Effect == nil || f.Count == nil {
		t.Fatal("conformance: fixture must set Store, Effect and Count")
	}
	return &env[Tx]{t: t, ctx: ctx, f: f, lacks: s.lacks, feat: s.h.Features}
}

// setupClock is setup with a fixture whose store reads clk instead of its
// own clock; it skips the case for a fixture that cannot take a test clock.
func (s *suite[Tx]) setupClock(t *testing.T, opts Options, clk *clock) *env[Tx] {
	t.Helper()
	if why := s.h.Features.testClockSkip(); why != "" {
		t.Skip(why)
	}
	opts.Clock = clk.Now
	return s.setup(t, opts)
}

func (e *env[Tx]) guard(cfg *idempotency.Config) *idempotency.Guard[Tx] {
	e.t.Helper()
	return e.guardOn(e.f.Store, cfg)
}

func (e *env[Tx]) guardOn(store idempotency.KeyStore[Tx], cfg *idempotency.Config) *idempotency.Guard[Tx] {
	e.t.Helper()
	g, err := idempotency.New(store, cfg)
	if err != nil {
		e.t.Fatalf("idempotency.New: %v", err)
	}
	return g
}

// count fails the case unless exactly want effects tagged tag committed.
func (e *env[Tx]) count(tag string, want int, contract string) {
	e.t.Helper()
	if got := e.counted(tag); got != want {
		e.t.Fatalf("%s: effects committed for %q: got %d, want %d", contract, tag, got, want)
	}
}

// counted returns how many effects tagged tag committed.
func (e *env[Tx]) counted(tag string) int {
	e.t.Helper()
	got, err := e.f.Count(e.ctx, tag)
	if err != nil {
		e.t.Fatalf("Count(%q): %v", tag, err)
	}
	return got
}
