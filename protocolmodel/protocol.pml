/*
 * The idempotency protocol of one key, at the level of the store's atomic
 * steps (README.md maps each step to the Go function that performs it).
 *
 * The store is the key's row and an effect log. Each `atomic` block is one
 * transaction of the store (or one statement): what the SQL stores do
 * under the row's lock, Redis in one script. A process may stop (crash)
 * between any two of them.
 *
 * Configurations (one per compile, -D):
 *   CFG_DO    three callers of Guard.Do, a clock (TTL, provisional expiry),
 *             Purge, crashes;
 *   CFG_RUN   two callers of Guard.Run and one of Guard.Do on the same key,
 *             the Completer, an operator's Forget, a clock that ends
 *             leases, crashes, transient failures, conflicts;
 *   CFG_LIVE  one caller of Run that may crash or fail, the Completer and
 *             the clock: the liveness claim, under weak fairness.
 * Mutants (-DM_...) put back one real bug each; see README.md.
 *
 * Each invariant is an assertion preceded by a printf naming it, so that
 * a trail replayed with `spin -t` says which invariant broke.
 */

/* The invariants, by number. A mutant is checked against the one it
 * names alone (-DALL=0 -DTARGET=name); the model against all (ALL=1). */
#define one_effect_per_key 1
#define answer_never_changes 2
#define replay_returns_answer 3
#define purge_spares_held_and_unfinished 4
#define do_never_takes_unfinished 5
#define local_step_once 6
#define foreign_repeats_only_after_lease_lost 7
#define stop_has_no_later_steps 8
#define state_is_committed_writes 9
#define released_on_exit 10
#define lease_taken_by_cas 11
#define forgotten_never_resumes 12
#ifndef ALL
#define ALL 1
#endif
#ifndef TARGET
#define TARGET 0
#endif

#define INV(name, cond) \
	if \
	:: !(cond) && (ALL || name == TARGET) -> printf(#name); printf(" VIOLATED\n"); assert(cond) \
	:: else -> skip \
	fi

mtype = { ABSENT, HELD, UNFIN, DONE };

/* The key's row. */
mtype row = ABSENT;
byte holder;   /* the process whose open transaction holds the row (0: none) */
byte step;     /* UNFIN: the step the operation resumes at */
byte owner;    /* UNFIN: the run that holds (or last held) the lease */
bool live;     /* UNFIN: that lease has not ended (by the store's clock) */
byte tries;    /* UNFIN: runs that released the key after a failure */
byte answer;   /* DONE: the stored answer (the run or caller that gave it) */
bool expired;  /* DONE: past its TTL by the store's clock */
bool provexp;  /* the provisional expiry of the reservation passed */
byte data;     /* UNFIN: the step data committed (State): A's writes */
byte dlife;    /* UNFIN: the life in which A made its data (an id it drew) */
bool bystop;  /* DONE by a Stop */

/* The effect log of the key's current life; a life ends when the row is
 * deleted (Forget, Purge of an expired record) or its TTL passes. */
byte effDo;    /* effects committed by Do */
byte effA;     /* Local step A's effects */
byte effC;     /* Local step C's effects, after the Foreign step B */
byte effF;     /* Finish's effects */
byte fcalls;   /* calls of Foreign step B, with the key derived for B */
byte flast;    /* the run that made the last one */
bool flost;    /* that run lost its lease since */
byte fixed;    /* the first answer stored in this life (0: none) */
byte life = 1; /* bumped when a life ends */

/* Budgets that bound the state space. */
byte crashes, fails, conflicts;
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXFAIL
#define MAXFAIL 1
#endif
#define MAXCONFLICT 1
#define MAXTRIES 2
#define MAXPOLL 1

/* Steps of the operation: Local A, Foreign B, Local C, then Finish. */
#define SA 0
#define SB 1
#define SC 2
#define SF 3

#define STOP 9 /* the answer of a Stop */

/* Outcomes of acquire and reserve. */
#define R_BUSY 1
#define R_DONE 2
#define R_NEW 3
#define R_PHASE 4
#define R_NOLOCK 5

inline newlife() {
	life++; effDo = 0; effA = 0; effC = 0; effF = 0; fcalls = 0; flast = 0; flost = false;
	fixed = 0; bystop = false; expired = false; provexp = false; data = 0; dlife = 0; tries = 0; owner = 0; live = false
}

/* A completion stores ans: the answer of this life, never changed. */
inline complete(ans) {
	INV(answer_never_changes, fixed == 0 || fixed == ans);
	fixed = ans; answer = ans; row = DONE; holder = 0; owner = 0; live = false; tries = 0
}

/* A replay reads the stored answer (in the step that found it). */
inline replay() {
	INV(replay_returns_answer, answer == fixed && fixed != 0)
}

/* A crash of process me: the server ends its session, rolling back the
 * transaction it held; a lease it took stays until the clock ends it. */
inline crash(me) {
	atomic {
		crashes++;
		if
		:: holder == me -> holder = 0; if :: row == HELD -> row = ABSENT :: else -> skip fi
		:: else -> skip
		fi
	}
}

#define CANCRASH (crashes < MAXCRASH)

/* ---------------------------------------------------------------- Do */

/* Guard.Do: Reserve (KeyStore.Reserve), fn in the transaction, then
 * Txn.Complete or Txn.Rollback. */
proctype Doer(byte me) {
	byte res; byte polls;
again:
	atomic {
		if
		:: holder != 0 || (row == UNFIN) -> res = R_BUSY
		:: else ->
			if
#ifdef M_PROVISIONAL_REPLAY
			/* a record completed while the caller waited, judged by the
			 * provisional expiry of the reservation it waited for */
			:: row == DONE && !(expired || provexp) -> res = R_DONE; replay()
			:: row == DONE && (expired || provexp) ->
				if :: expired -> newlife() :: else -> skip fi;
#else
			:: row == DONE && !expired -> res = R_DONE; replay()
			:: row == DONE && expired -> newlife();
#endif
				row = HELD; holder = me; provexp = false; res = R_NEW
			:: row == ABSENT -> row = HELD; holder = me; provexp = false; res = R_NEW
			fi
		fi;
		INV(do_never_takes_unfinished, !(res == R_NEW && row == UNFIN))
	}
	if
	:: res == R_BUSY && polls < MAXPOLL -> polls++; goto again
	:: res == R_BUSY -> goto out /* ErrInProgress */
	:: res == R_DONE -> goto out /* the record read, replayed */
	:: res == R_NEW -> skip
	fi;
	/* fn runs in the transaction; the caller may die meanwhile */
	if
	:: CANCRASH -> crash(me); goto out
	:: true -> skip
	fi;
	if
	:: atomic { holder == me -> effDo++; INV(one_effect_per_key, effDo <= 1); complete(me) }
	:: atomic { holder == me -> holder = 0; row = ABSENT } /* fn failed: Rollback */
	:: holder != me -> skip /* the row was taken from it: nothing it does applies */
	fi;
out:
	skip
}

/* Purge: deletes a completed record past its TTL, never a held one. */
proctype Purger() {
end:	do
	:: atomic {
		holder == 0 && row == DONE && expired ->
		INV(purge_spares_held_and_unfinished, row == DONE && expired);
		row = ABSENT; newlife()
	   }
#ifdef M_PURGE_HELD
	/* deletes a reservation past its provisional expiry, while a
	 * transaction still holds it */
	:: atomic {
		row == HELD && provexp ->
		INV(purge_spares_held_and_unfinished, row == DONE && expired);
		row = ABSENT; holder = 0
	   }
#endif
	od
}

/* ------------------------------------------------------------ Run */

#include "run.pml"

/* The store's clock. */
proctype Clock() {
end:	do
	:: atomic { row == DONE && !expired -> expired = true }
	:: atomic { row == HELD && !provexp -> provexp = true }
	:: atomic { row == UNFIN && live && holder == 0 ->
		live = false; if :: owner == flast -> flost = true :: else -> skip fi }
	od
}

#ifdef CFG_DO
init {
	atomic {
		run Doer(1); run Doer(2); run Doer(3); run Clock(); run Purger()
	}
}
#endif
