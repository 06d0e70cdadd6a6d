/*
 * Guard.Run (runOp, runner.drive), the Completer and Forget, on the key's
 * row of protocol.pml. Included by it.
 */

byte lstep;      /* the step the Completer's listing saw */
bool forgot;     /* the operator's Forget ran */

/* Commits: a phase's transaction (holder == me), or, for a mutant that
 * took the key without its lock (nolock), a write that checks nothing. */
#define MINE (holder == me || nolock)

/* The Foreign call of step B starts with the commit that took the lease
 * for it (the lease outlasts the gap between the two: see README.md). */
inline foreignStart() {
	INV(foreign_repeats_only_after_lease_lost, fcalls == 0 || flost);
	fcalls++; flast = me; flost = false
}

/* The lease of this run's last commit: row UNFIN at s, leased to me. */
inline save(s) {
	INV(lease_taken_by_cas, row != UNFIN || owner == me || !live);
	INV(forgotten_never_resumes, mylife == life);
	row = UNFIN; step = s; owner = me; live = true;
	if :: !nolock -> holder = 0 :: else -> skip fi
}

/* Rollback of the phase's transaction: a new key is free again. */
inline rollback() {
	atomic {
		if
		:: holder == me -> holder = 0; if :: row == HELD -> row = ABSENT :: else -> skip fi
		:: else -> skip
		fi
	}
}

/* runner.release: after a failure, end the lease if it is this run's
 * (or ended) and count a try, in a phase of its own (Acquire + Release). */
inline release() {
	atomic {
		holder == 0 ->
		if
		:: row == UNFIN && (owner == me || !live) ->
			if :: owner == flast -> flost = true :: else -> skip fi;
			owner = me; live = false; tries++
		:: else -> skip
		fi
	}
}

proctype Runner(byte me; bool resume) {
	byte res, at, mdata, before, polls, savedAt, mylife, mydl;
	bool saved, stop, moved, nolock;
	byte conflicted;
#ifdef M_STALE_LIST
	/* recovery from the listing: no Acquire, no lease, no lock */
	if
	:: resume -> at = lstep; mdata = data; mydl = dlife; mylife = life; saved = true; savedAt = lstep; nolock = true; goto phase
	:: else -> skip
	fi;
#endif
#ifdef M_RESCUE_NO_HORIZON
	/* a rescuer that re-marks the row it listed as unfinished, whatever
	 * happened to it since */
	if
	:: resume -> atomic { holder == 0 -> row = UNFIN; step = lstep; owner = 0; live = false }
	:: else -> skip
	fi;
#endif
acq:	/* runner.acquire -> Stepper.Acquire */
	atomic {
		if
		:: holder != 0 -> res = R_BUSY
		:: holder == 0 && row == ABSENT -> row = HELD; holder = me; res = R_NEW
		:: holder == 0 && row == DONE && !expired -> res = R_DONE; replay()
		:: holder == 0 && row == DONE && expired -> newlife(); row = HELD; holder = me; res = R_NEW
		:: holder == 0 && row == UNFIN && owner == me -> holder = me; res = R_PHASE
		:: holder == 0 && row == UNFIN && owner != me && live -> res = R_BUSY
#ifdef M_TAKEOVER_NO_CAS
		/* reads the lapsed lease and takes the key over later with an
		 * unconditional write */
		:: holder == 0 && row == UNFIN && owner != me && !live -> res = R_NOLOCK; nolock = true
#else
		:: holder == 0 && row == UNFIN && owner != me && !live -> holder = me; res = R_PHASE
#endif
		:: row == HELD && holder == 0 -> res = R_BUSY /* cannot be: a held row has a holder */
		fi
	}
	if
	:: res == R_BUSY && polls < MAXPOLL -> polls++; res = 0; goto acq
	:: res == R_BUSY -> goto failed /* ErrInProgress */
	:: res == R_DONE -> goto out /* the record read, replayed */
	:: res == R_NEW ->
		if
		:: saved || resume ->
			/* the row this run went on from is gone (adopt: ErrNotFound) */
			rollback(); goto out
		:: else -> at = SA; mdata = 0; mylife = life; res = 0; polls = 0
		fi
	:: res == R_PHASE || res == R_NOLOCK ->
		res = 0; polls = 0;
		/* adopt */
		/* samePoint: the step and the data (an id A drew) */
		moved = stop && (step != savedAt || dlife != mydl);
		if
		:: saved && step == savedAt && dlife == mydl -> skip /* as this run left it */
		:: else -> at = step; mdata = data; mydl = dlife; mylife = life; saved = true; savedAt = step
		fi;
		if
		:: stop ->
#ifdef M_LATE_STOP
			/* the Stop is applied whatever another run did meanwhile */
#else
			if :: moved -> stop = false; moved = false; goto phase :: else -> skip fi;
#endif
			atomic { MINE ->
				INV(stop_has_no_later_steps, effC == 0 && effF == 0);
				complete(STOP); bystop = true }
			goto out
		:: else -> skip
		fi
	fi;
phase:	/* one phase, holding the row */
	if
	:: CANCRASH -> crash(me); goto gone
	:: true -> skip
	fi;
	if
	:: at == SA ->
		before = mdata;
		mdata++; /* the step sets State */
		if
		:: conflicted < MAXCONFLICT && conflicts < MAXCONFLICT ->
			/* its commit meets a conflict: it ran for nothing; again */
			conflicts++; conflicted++; rollback();
#ifndef M_CONFLICT_STATE
			mdata = before;
#endif
			before = 0;
			if :: !saved -> at = SA :: else -> skip fi;
			goto acq
		:: fails < MAXFAIL -> fails++; mdata = before; before = 0; rollback(); goto failed
		:: atomic { MINE ->
			effA++; INV(local_step_once, effA <= 1);
			data = mdata; dlife = life; mydl = life; INV(state_is_committed_writes, data == effA + effC);
			save(SB); foreignStart() }
			before = 0; saved = true; savedAt = SB; at = SB; goto call
		fi
	:: at == SB ->
		atomic { MINE -> save(SB); foreignStart() }
		saved = true; savedAt = SB; goto call
	:: at == SC ->
		before = mdata;
		mdata++; /* the step sets State */
		if
		:: conflicted < MAXCONFLICT && conflicts < MAXCONFLICT ->
			conflicts++; conflicted++; rollback();
#ifndef M_CONFLICT_STATE
			mdata = before;
#endif
			before = 0;
			goto acq
		:: fails < MAXFAIL -> fails++; mdata = before; before = 0; rollback(); goto failed
		:: atomic { MINE ->
			effC++; INV(local_step_once, effC <= 1);
			data = mdata; INV(state_is_committed_writes, data == effA + effC);
			save(SF) }
			before = 0; saved = true; savedAt = SF; at = SF;
			if
			:: fails < MAXFAIL -> fails++; goto ctxEnded /* its ctx ends between two steps */
			:: true -> goto acq
			fi
		fi
	:: at == SF ->
		atomic { MINE -> complete(me); effF++; INV(local_step_once, effF <= 1) }
		goto out
	fi;
call:	/* the Foreign call runs outside any transaction; the lease may end */
	if
	:: CANCRASH -> crash(me); goto gone
	:: true -> at = SC
	:: true -> stop = true
	:: fails < MAXFAIL -> fails++; goto failed
	fi;
	goto acq;
ctxEnded:
#ifdef M_RELEASE_BY_TIMEOUT
	/* the lease is left to run out */
	goto failedExit;
#endif
failed:
	if :: saved -> release() :: else -> skip fi;
failedExit:
	INV(released_on_exit, !(row == UNFIN && owner == me && live && holder == 0));
out:
gone:
	skip
}

/* The Completer: each pass lists the keys whose lease ended, with fewer
 * than MAXTRIES tries, and resumes each with a run of its own. */
#ifdef M_NO_COMPLETER
/* a Completer that lists nothing: an abandoned operation waits for a
 * retry that never comes */
#define NOCOMPLETER 1
#else
#define NOCOMPLETER 0
#endif
proctype Completer() {
	byte n;
end:	do
	:: atomic { holder == 0 && row == UNFIN && !live && tries < MAXTRIES && !NOCOMPLETER -> lstep = step; n = _nr_pr }
		run Runner(7, true);
		_nr_pr == n /* its run ended */
	od
}

/* An operator's Forget: deletes a completed key, or an unfinished one
 * whose lease ended; refuses a held one. */
proctype Forgetter() {
end:	atomic {
		holder == 0 && (row == DONE || (row == UNFIN && !live)) ->
		row = ABSENT; forgot = true; newlife()
	}
}

#ifdef CFG_RUN
/* A client's run and its retry in another process. */
init {
	atomic { run Runner(5, false); run Runner(6, false); run Clock() }
}
#endif

#ifdef CFG_RESUME
/* A client's run and the Completer. */
init {
	atomic { run Runner(5, false); run Completer(); run Clock() }
}
#endif

#ifdef CFG_ADMIN
/* A run, a call of Do with the same key, and an operator's Forget. */
init {
	atomic { run Runner(5, false); run Doer(3); run Forgetter(); run Clock() }
}
#endif

#ifdef CFG_LIVE
init {
	atomic { run Runner(5, false); run Completer(); run Clock() }
}

/* Every operation left unfinished is finished by a retry or the
 * Completer, or has used up its tries (the Completer reports it
 * Exhausted). */
ltl finishes { [] ((row == UNFIN) -> <> (row == DONE || tries >= MAXTRIES)) }
#endif
