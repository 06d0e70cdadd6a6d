package conformance

// rule is a sentence of the contract that a case checks, quoted verbatim
// (comment markers and line breaks aside) from the file that states it.
// A failing case logs the rules it checks, as testing/slogtest does; the
// package's own tests fail if a quote drifts from its source.
type rule struct {
	file string // relative to the module root
	text string
}

func (r rule) String() string { return r.file + `: "` + r.text + `"` }

// The sentences of keystore.go and config.go that the cases check.
var (
	ruleOneTxn = rule{"keystore.go",
		"Under concurrent calls with the same key at most one obtains a Txn at any time."}
	ruleWaitThenRecord = rule{"keystore.go",
		"While another caller holds the key, Reserve blocks (up to r.Wait and while ctx lives) until that caller ends its hold. If that caller completes, Reserve returns the record; if it rolls back or loses its lease, Reserve competes again for the key."}
	ruleInProgress = rule{"keystore.go",
		"another caller holds the key and still held it when r.Wait ran out (r.Wait == 0: do not wait at all)."}
	ruleOneConn = rule{"keystore.go",
		"No method asks its pool for a second connection while it holds one."}
	ruleCtx = rule{"keystore.go",
		"Methods return promptly, with ctx.Err() in the chain, once ctx is done."}
	ruleKeys = rule{"keystore.go",
		"Keys are compared byte-exact, in the ID and in the Scope: no case folding, no trimming of spaces, no Unicode normalisation."}
	ruleBytes = rule{"keystore.go",
		"Status, header and body are stored and returned byte-exact, whatever the bytes: header names and values need not be UTF-8, and each name keeps its values in order."}
	ruleEmpty = rule{"keystore.go",
		"A zero-length Body may come back nil or empty, and an empty Header nil or empty: they are the same response, and a store need not keep them apart."}
	ruleOwner = rule{"keystore.go",
		"A returned *Record belongs to the caller, who may keep and change it: the store keeps no reference to it, to its Header or to its Body, and each caller gets a copy of its own."}
	ruleCreatedAt = rule{"backend/contract.go",
		"CreatedAt is set by the store's clock when the key was reserved, to at least millisecond precision (rounding down), and is never after ExpiresAt."}
	ruleTimes = rule{"keystore.go",
		"Times are kept to at least millisecond precision, rounding down, for every clock reading the core accepts, from [backend.MinClock]() to [backend.MaxExpiry]: a record never outlives its expiry, and a record that expires at MaxExpiry() never expires."}
	ruleLease = rule{"keystore.go",
		"A store that holds keys by lease (a reservation that can run out while fn runs, as on Redis) refuses Complete from an owner whose lease ran out and was taken over: it returns [backend.ErrLeaseLost] and applies nothing of that owner's transaction."}
	ruleCompletedWhileWaiting = rule{"keystore.go",
		"A record completed while Reserve waited for its holder is judged by the expiry it was completed with, never by the provisional one of the reservation. It is returned, never taken over."}
	rulePurgeDeletes = rule{"keystore.go",
		"Purge deletes at most limit records whose ExpiresAt <= the store's clock now, in one short transaction of its own (one connection), and reports how many it deleted."}
	rulePurgeHeld = rule{"keystore.go",
		"Records held by an open transaction are never deleted. Purge never waits for them either, except on a store with one writer at a time for the whole database (SQLite). There Purge queues for the write lock like every writer, while ctx lives."}
	ruleFnEndsTx = rule{"backend/contract.go",
		"fn must not commit or roll back Tx itself. A store whose handle lets fn do so anyway (a *sql.Tx) keeps the guarantee: never an answer without its effect, nor a second run. After fn's rollback, Complete fails and the key is free. After fn's commit, the key holds fn's answer or stays held (Reserve reports [ErrInProgress]) until the reservation's provisional expiry: the store's clock at the reservation plus [Reservation].TTL."}
	ruleComplete = rule{"backend/contract.go",
		"Complete stores resp (status, header, body byte-exact) as the key's record, marks it completed and commits the transaction with it. The effect, the key and the response become visible together or not at all."}
	ruleAtomic = rule{"backend/contract.go",
		"Complete is atomic whatever interrupts it (ctx ending, a cut connection, a crash): the effect and the record are committed together or not at all. A retry with the same key then replays the record or runs fn once."}
	ruleCompleteDone = rule{"backend/contract.go",
		"Called with a ctx that is already done, it either commits nothing and returns an error with ctx.Err() in its chain, or commits everything and returns nil."}
	ruleRollback = rule{"backend/contract.go",
		"Rollback abandons the transaction: the reservation and every effect done through Tx are discarded and the key is free again."}
	ruleRollbackDone = rule{"backend/contract.go",
		"It must work with an already cancelled ctx (the caller may be unwinding after a cancel)."}
	ruleExpiredAbsent = rule{"backend/contract.go",
		"TTL is how long the completed record is remembered, counted by the store's clock from its completion ([Txn.Complete]); records whose ExpiresAt <= the store's clock now count as absent."}
	ruleMigrate = rule{"backend/contract.go",
		"It is idempotent: running it again, or from several callers at once, changes nothing and returns nil."}
	ruleLeaseEnds = rule{"keystore.go",
		"On such a store the lease ends a hold, not the provisional expiry ([backend.Reservation].ExpiresAt, which only bounds how long a record left pending may last): once the lease ran out the key is free to take over, and a caller already waiting for it takes it within one second of the lease's end, not at the end of its wait."}
	ruleTakeoverCAS = rule{"keystore.go",
		"Taking over a lapsed lease is a compare-and-swap on the reservation that lapsed, as taking a free key is one on its absence: of several callers that find a key free or its lease lapsed at once, in one process or in several, exactly one obtains a Txn. A read followed by an unconditional write is not enough."}
	ruleStaleOwner = rule{"keystore.go",
		"A stale owner (one whose lease was taken over) changes nothing: its Rollback frees nothing and never the new owner's key, and its Complete returns an error wrapping [backend.ErrLeaseLost]."}
	rulePurgeRecheck = rule{"keystore.go",
		"A record re-reserved or completed after Purge chose it is not deleted. The delete re-checks each record it chose (its expiry, or the revision the scan saw) in the same atomic step."}
	rulePurgeCount = rule{"keystore.go",
		"The count is of records deleted, not of records chosen, and never more than limit, however many expired records there are."}
	ruleFailedComplete = rule{"backend/contract.go",
		"A Complete that returns an error and committed nothing frees the key as Rollback does: another caller can take it within one second, never only when a lease runs out."}

	// The multi-step primitives ([backend.Stepper], [backend.Phase]).
	ruleStepNeverExpires = rule{"backend/steps.go",
		"An unfinished key is never expired and never purged: its expiry is [MaxExpiry] until it completes, and idempotency.KeyStore.Purge skips it."}
	ruleStepReserveHeld = rule{"backend/steps.go",
		"idempotency.KeyStore.Reserve treats an unfinished key as held: it reports [ErrInProgress], at once or after waiting, and never takes it over."}
	ruleStepOneTxn = rule{"backend/steps.go",
		"Every phase is one transaction of the store on the key's row: the caller's writes through [Phase.Tx], the progress and the lease commit together or not at all."}
	ruleStepCAS = rule{"backend/steps.go",
		"Taking a lease is a compare-and-swap on the row, as taking a free key is: of several callers that find an unfinished key's lease free or ended at once, in one process or in several, exactly one obtains a Phase; the others get [ErrInProgress]."}
	ruleStepClock = rule{"backend/steps.go",
		"Leases are judged by the store's clock, as expiries are."}
	ruleAcquirePhase = rule{"backend/steps.go",
		"Either no live record existed (phase.Progress() is nil: a new key, held as idempotency.KeyStore.Reserve holds it, so Rollback frees it), or the key is unfinished and its lease was free, ended (by the store's clock), or already a.Owner's. Then phase.Progress() is the progress last saved, phase.Fingerprint() the fingerprint the operation started with, and the lease is a.Owner's in the transaction."}
	ruleAcquireTries = rule{"backend/steps.go",
		"Taking over another owner's ended lease counts in Tries only if a later Release commits."}
	ruleAcquireRecord = rule{"backend/steps.go",
		"(nil, rec, nil): the key is completed and live, as in Reserve."}
	ruleAcquireHeld = rule{"backend/steps.go",
		"(nil, nil, err) with err wrapping [ErrInProgress]: the key is held by a transaction of Reserve or Acquire (waited for up to a.Wait, as Reserve does) or leased to another owner until a later time (reported at once: the core polls)."}
	// The suite requires these bounds to be refused with an error wrapping
	// idempotency.ErrInvalidConfig, before anything is written: the
	// contract names no error for them, and ErrInvalidConfig is the one
	// the core gives a value out of range.
	ruleAcquireInput = rule{"backend/steps.go",
		"a.Owner is a token of at most 64 printable ASCII bytes; a.Lease is at least one millisecond."}
	ruleAbandonedLimit = rule{"backend/steps.go",
		"Limit bounds the list: 1 to 1000."}
	ruleListLimit = rule{"backend/admin.go",
		"Limit is the page's size: 1 to 1000."}
	ruleAbandoned = rule{"backend/steps.go",
		"Abandoned lists up to q.Limit unfinished keys whose lease ended at least q.Grace ago by the store's clock (a run that released its lease ended it then) and whose Tries are under q.MaxTries, the longest ended first."}
	ruleAbandonedNoLock = rule{"backend/steps.go",
		"It takes no lease and locks nothing: the caller then acquires each one, and may lose it to another."}
	rulePhaseOver = rule{"backend/steps.go",
		"After it returns, whatever the error, the transaction is over and its connection released."}
	ruleSave = rule{"backend/steps.go",
		"Save commits the phase: the writes done through Tx, progress as the key's progress (at most [MaxProgressLen] bytes, never nil), and the lease, the Acquisition's owner's until the store's clock plus its Lease. The key is unfinished."}
	ruleRelease = rule{"backend/steps.go",
		"Release commits the phase with progress and the lease ended now, and counts one more try: a run that failed and lets a retry or the completer resume the key. Writes done through Tx are committed too"}
	rulePhaseComplete = rule{"backend/steps.go",
		"Complete stores resp as the key's completed record and commits, as [Txn.Complete] does, with the writes done through Tx. The progress, owner, lease and tries are cleared; the expiry is the store's clock plus the Acquisition's TTL."}
	rulePhaseRollback = rule{"backend/steps.go",
		"Rollback discards the phase: the writes done through Tx and the lease taken by Acquire. An unfinished key stays as it was committed (progress, owner, lease end); a new key is free again."}

	// Key administration ([backend.KeyAdmin], [backend.KeyLister]).
	ruleInspect = rule{"backend/admin.go",
		"Inspect returns what the store holds for key, with its body only if body is true (BodyLen is always set). A key with no record gives an error wrapping [ErrNotFound]. It takes no lock and waits for none."}
	ruleInspectHeldNew = rule{"backend/admin.go",
		"A store that holds a new key in an open transaction with no row visible to others (PostgreSQL) reports it [KeyInProgress] if it can tell without waiting, else [ErrNotFound]: its documentation says which."}
	ruleStateHeld = rule{"backend/admin.go",
		"KeyInProgress: a call of Guard.Do holds the key in an open transaction, or a run of an Operation holds its live lease."}
	ruleStateUnfinished = rule{"backend/admin.go",
		"KeyUnfinished: an operation stopped between two steps and nobody holds it: a retry with the key or the Completer resumes it."}
	ruleStateExpired = rule{"backend/admin.go",
		"KeyExpired: past its expiry by the store's clock, not yet purged; it counts as absent."}
	ruleInfoTimes = rule{"backend/admin.go",
		"CreatedAt and ExpiresAt are by the store's clock; ExpiresAt is [MaxExpiry] for an unfinished key, zero when the store cannot tell (a key held in a transaction with no row yet)."}
	ruleForget = rule{"backend/admin.go",
		"Forget deletes key's record and returns what it deleted (without the body). A key held (by a transaction of Reserve or Acquire, or by a live lease) is refused with [ErrInProgress] and nothing changes; Forget never waits for it. A key with no record gives [ErrNotFound]."}
	ruleForgetUnfinished = rule{"backend/admin.go",
		"An unfinished key whose lease ended is deleted: its operation will not be resumed."}
	ruleList = rule{"backend/admin.go",
		"List returns one page of the keys of q.Scope: the unfinished and held ones first, then the others, each part in byte order of ID. Bodies are not read."}
	ruleListNext = rule{"backend/admin.go",
		"Next resumes the listing; nil when this page is the last."}
	ruleListCursor = rule{"backend/admin.go",
		"Unfinished: the last key was in the first part (unfinished or held)."}
	ruleStats = rule{"backend/admin.go",
		"Stats counts the store's records by state, by the store's clock."}
	ruleStatsFields = rule{"backend/admin.go",
		"OldestUnfinished is the creation of the oldest unfinished or held operation, zero when there is none. Failing counts the unfinished keys with at least one failed try. BodyBytes sums the bodies of live completed records."}

	// Clocks, coarse expiries, dead holders.
	ruleStoreClock = rule{"keystore.go",
		"Every expiry is judged by one clock that every instance of a service shares: the store's (the database server's or Redis's), never the application's."}
	ruleHostsDisagree = rule{"keystore.go",
		"A lease (Redis PX/PEXPIRE) is judged by the store too, so instances whose clocks disagree by hours still agree on every record and every lease."}
	ruleNoClockHold = rule{"keystore.go",
		"It judges a hold by a duration the store itself counts down (an etcd lease, a TTL counted by the server) or by a duration measured on one host's monotonic clock from a revision that host read, never by comparing an instant one host wrote (the holder's clock plus the lease) with another host's clock: hosts whose clocks differ by more than a lease would take over a live hold, or never take over a dead one."}
	ruleRoundUp = rule{"keystore.go",
		"A store whose expiry mechanism is coarser (an etcd lease lasts whole seconds) rounds every TTL and lease up to a whole number of its units, never down: a record is never absent before its TTL has passed, and lasts at most one unit longer."}
	ruleHoldEnds = rule{"keystore.go",
		"A hold ends when its holder dies, with nothing else to end it: a reservation on a lease store carries a lease that the store counts down (on a transactional store, the hold dies with the holder's connection)."}
	rulePurgeNotHeldOnly = rule{"keystore.go",
		"Checking only that the record is not held is not enough: a key taken and completed again between the scan and the delete is not held either, and deleting it loses its answer, so that a retry runs fn again."}
	rulePhaseHolds = rule{"backend/steps.go",
		"A phase commits only while it holds its key. A store that holds a phase by its lease alone (no transaction, as on etcd) lets another owner take the key once the lease ended by the store's clock, even while the phase is open. The stale phase's Save, Release and Complete then return an error wrapping [ErrLeaseLost] and commit nothing, and its Rollback frees nothing."}

	// Quota counters ([backend.QuotaCounter]).
	ruleQuotaAtomic = rule{"backend/quota.go",
		"AdmitQuota is one atomic statement (one round trip): of several callers in one process or in several, no more than the limit are counted in a window."}
	ruleQuotaCAS = rule{"backend/quota.go",
		"A read followed by an unconditional write is not enough: racing admissions overwrite each other and count more than the limit."}
	ruleQuotaReplay = rule{"backend/quota.go",
		"A key with a live completed record (by the store's clock) is not counted and never refused: its replay costs nothing."}
	ruleQuotaOver = rule{"backend/quota.go",
		"Over a limit, nothing is counted."}
	ruleQuotaEnd = rule{"backend/quota.go",
		"EndQuota ends an admission that AdmitQuota counted: one less in flight, one less key if none was created, and e.Bytes more stored, all in the window the admission was counted in."}

	ruleTTL = rule{"config.go",
		"TTL is how long a completed key is remembered, counted by the store's clock from the moment its answer was committed (however long fn ran). After it the key counts as new."}
	ruleMaxExpiry = rule{"backend/clock.go",
		"The store's clock plus the TTL is clamped to it, so a TTL such as math.MaxInt64 means \"never expire\" on every store. A clock reading at or after it is refused with [ErrInvalidConfig]."}
	ruleMinClock = rule{"backend/clock.go",
		"MinClock is the earliest clock reading a store accepts (1677-09-21, the earliest instant of a signed 64-bit count of Unix nanoseconds); an earlier reading is refused with [ErrInvalidConfig]."}
	ruleMemWait = rule{"config.go",
		"Callers of the same key in this Guard never count: they wait in memory for the one that is in the store."}
	ruleMaxWaiters = rule{"config.go",
		"Beyond it, a call whose key is held returns [ErrInProgress] at once (HTTP 409 with Retry-After), so waiters cannot take the pool from other traffic."}
)

// allRules lists every quoted rule, for the package's own drift check.
var allRules = []rule{
	ruleOneTxn, ruleWaitThenRecord, ruleInProgress, ruleOneConn, ruleCtx, ruleKeys, ruleBytes,
	ruleEmpty, ruleOwner, ruleCreatedAt, ruleTimes, ruleLease, ruleCompletedWhileWaiting, rulePurgeDeletes,
	rulePurgeHeld, ruleFnEndsTx, ruleComplete, ruleAtomic, ruleCompleteDone, ruleRollback,
	ruleRollbackDone, ruleExpiredAbsent, ruleMigrate, ruleTTL, ruleMaxExpiry, ruleMinClock,
	ruleMemWait, ruleMaxWaiters, ruleLeaseEnds, ruleTakeoverCAS, ruleStaleOwner, rulePurgeRecheck,
	rulePurgeCount, ruleFailedComplete,
	ruleStepNeverExpires, ruleStepReserveHeld, ruleStepOneTxn, ruleStepCAS, ruleStepClock, ruleAcquirePhase,
	ruleAcquireTries, ruleAcquireRecord, ruleAcquireHeld, ruleAcquireInput, ruleAbandonedLimit, ruleListLimit,
	ruleAbandoned, ruleAbandonedNoLock, rulePhaseOver, ruleSave, ruleRelease, rulePhaseComplete, rulePhaseRollback,
	ruleInspect, ruleInspectHeldNew, ruleStateHeld, ruleStateUnfinished, ruleStateExpired, ruleInfoTimes,
	ruleForget, ruleForgetUnfinished, ruleList, ruleListNext, ruleListCursor, ruleStats, ruleStatsFields,
	ruleStoreClock, ruleHostsDisagree, ruleNoClockHold, ruleRoundUp, ruleHoldEnds, rulePurgeNotHeldOnly, rulePhaseHolds,
	ruleQuotaAtomic, ruleQuotaCAS, ruleQuotaReplay, ruleQuotaOver, ruleQuotaEnd,
}
