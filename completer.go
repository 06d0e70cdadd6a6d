package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/observe"
)

// CompleterConfig tunes a [Completer]. The zero value (or nil) means the
// defaults.
type CompleterConfig struct {
	// Grace is how long after a run's lease ended (it died, or released
	// the key after a failure) the Completer takes over: clients retrying
	// with the key come first. Defaults to 1 minute.
	Grace time.Duration
	// Interval is the pause between two passes of [Completer.Serve].
	// Defaults to 30 seconds.
	Interval time.Duration
	// Batch bounds how many keys one pass resumes: 1 to 1000. Defaults
	// to 100.
	Batch int
	// MaxTries is how many failed runs an operation may have before the
	// Completer stops resuming it and reports it [observe.Exhausted]. Such a key
	// stays unfinished, never purged, for an operator: a client's retry
	// still resumes it, and [Guard.Forget] deletes it. Defaults to 10.
	MaxTries int
}

// Defaults of [CompleterConfig].
const (
	defaultGrace    = time.Minute
	defaultInterval = 30 * time.Second
	defaultBatch    = 100
	defaultMaxTries = 10
)

// Completer finishes the operations that runs left unfinished: a process
// killed between two steps, a client that never retried, a step that
// failed. Run one per service (each pass takes keys one by one, so several
// are safe but redundant), or call [Completer.Once] from a command.
type Completer[Tx any] struct {
	g   *Guard[Tx]
	ss  backend.Stepper[Tx]
	cfg CompleterConfig
	ops map[string]*Operation[Tx]
}

// CompleterReport says what one pass of a [Completer] did.
type CompleterReport struct {
	// Listed is how many abandoned keys the pass looked at: at most
	// Batch, and more when it skipped some (see [Completer.Once]).
	Listed int
	// Finished: runs that completed their key (a Stop included).
	Finished int
	// Failed: runs that stopped again at a step, the key released.
	Failed int
	// Exhausted: keys whose failed runs reached MaxTries in this pass.
	Exhausted int
	// Skipped: keys another run held or finished first, or of an
	// operation this Completer was not given.
	Skipped int
	// Duration is how long the pass took.
	Duration time.Duration
}

// NewCompleter returns a Completer of g's key store for ops, which must
// have distinct names. The store must implement [backend.Stepper]; others give an
// error wrapping [errors.ErrUnsupported].
func NewCompleter[Tx any](g *Guard[Tx], cfg *CompleterConfig, ops ...*Operation[Tx]) (*Completer[Tx], error) {
	if g == nil {
		return nil, fmt.Errorf("%w: nil Guard", ErrInvalidConfig)
	}
	ss, ok := g.store.(backend.Stepper[Tx])
	if !ok {
		return nil, fmt.Errorf("idempotency: the store %T does not run operations (no backend.Stepper): %w", g.store, errors.ErrUnsupported)
	}
	var c CompleterConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.Grace < 0:
		return nil, fmt.Errorf("%w: negative Grace %v", ErrInvalidConfig, c.Grace)
	case c.Interval < 0:
		return nil, fmt.Errorf("%w: negative Interval %v", ErrInvalidConfig, c.Interval)
	case c.Batch < 0 || c.Batch > 1000:
		return nil, fmt.Errorf("%w: Batch %d outside 1..1000", ErrInvalidConfig, c.Batch)
	case c.MaxTries < 0:
		return nil, fmt.Errorf("%w: negative MaxTries %d", ErrInvalidConfig, c.MaxTries)
	case len(ops) == 0:
		return nil, fmt.Errorf("%w: no operations", ErrInvalidConfig)
	}
	if c.Grace == 0 {
		c.Grace = defaultGrace
	}
	if c.Interval == 0 {
		c.Interval = defaultInterval
	}
	if c.Batch == 0 {
		c.Batch = defaultBatch
	}
	if c.MaxTries == 0 {
		c.MaxTries = defaultMaxTries
	}
	byName := make(map[string]*Operation[Tx], len(ops))
	for _, op := range ops {
		if err := op.validate(); err != nil {
			return nil, err
		}
		if byName[op.Name] != nil {
			return nil, fmt.Errorf("%w: two operations named %q", ErrInvalidConfig, op.Name)
		}
		byName[op.Name] = op
	}
	return &Completer[Tx]{g: g, ss: ss, cfg: c, ops: byName}, nil
}

// Serve makes a pass every Interval until ctx ends, and returns ctx's error.
// A pass that fails (the store is down) is retried at the next interval;
// its error goes to the Guard's [observe.Observer] as an Event with Outcome
// [observe.StoreError] and no key.
func (c *Completer[Tx]) Serve(ctx context.Context) error {
	for {
		if _, err := c.Once(ctx); err != nil && ctx.Err() == nil && c.g.cfg.Observer != nil {
			c.g.cfg.Observer(ctx, observe.Event{Outcome: observe.StoreError, Err: err, Operation: "*"})
		}
		if err := sleep(ctx, c.cfg.Interval); err != nil {
			return err
		}
	}
}

// Once makes one pass: it lists up to Batch keys abandoned for at least
// Grace with fewer than MaxTries failed runs, oldest first, and resumes
// each to the end or to its next failure. Each run is told to the Guard's
// [observe.Observer] as [Guard.Run] tells it; a run that makes its key reach
// MaxTries is told with Outcome [observe.Exhausted]. It returns the error of the
// listing, or ctx's once it ends; a key's failure is counted, not
// returned.
//
// Keys it cannot resume (of an operation it was not given, saved by a
// newer version, stopped at a step that no longer exists) are skipped and
// stay where they are, oldest first. So that they do not fill every pass,
// a pass that skipped some lists again, further, until it resumed Batch
// keys or listed 1000 at once (the most [backend.AbandonedQuery] allows): only
// that many keys it cannot resume, older than all the others, hold it up.
func (c *Completer[Tx]) Once(ctx context.Context) (CompleterReport, error) {
	start := time.Now()
	var rep CompleterReport
	defer func() { rep.Duration = time.Since(start) }()
	seen := map[Key]bool{}
	resumed := 0
	for limit := c.cfg.Batch; ; {
		keys, err := c.ss.Abandoned(ctx, backend.AbandonedQuery{Grace: c.cfg.Grace, MaxTries: c.cfg.MaxTries, Limit: limit})
		if err != nil {
			return rep, fmt.Errorf("idempotency: completer: list abandoned keys: %w", err)
		}
		fresh := 0
		for _, k := range keys {
			if seen[k.Key] {
				continue
			}
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			seen[k.Key] = true
			fresh++
			rep.Listed++
			if c.resume(ctx, k, &rep) {
				if resumed++; resumed == c.cfg.Batch {
					return rep, nil
				}
			}
		}
		if fresh == 0 || len(keys) < limit || limit == backend.MaxAbandoned {
			return rep, nil
		}
		limit = min(backend.MaxAbandoned, len(seen)+c.cfg.Batch-resumed)
	}
}

// resume drives one abandoned key, counts what came of it, and reports
// whether a run reached the key's steps (finished, failed again, or found
// it finished).
func (c *Completer[Tx]) resume(ctx context.Context, k backend.AbandonedKey, rep *CompleterReport) bool {
	p, err := decodeProgress(k.Progress)
	op := c.ops[p.Op]
	if err != nil || op == nil {
		rep.Skipped++
		return false
	}
	start := time.Now()
	resp, step, err := c.g.runOp(ctx, k.Key, k.Fingerprint, nil, op, true)
	ev := observe.Event{Key: k.Key, Outcome: runOutcome(resp, err), Duration: time.Since(start), Attempts: 1, Err: err, Operation: op.Name, Step: step}
	ran := true
	switch {
	case err == nil && resp.Replayed: // finished by another run meanwhile
		rep.Skipped++
	case err == nil:
		rep.Finished++
	case errors.Is(err, ErrUnfinished):
		rep.Failed++
		if k.Tries+1 >= c.cfg.MaxTries {
			rep.Exhausted++
			ev.Outcome = observe.Exhausted
		}
	default:
		rep.Skipped++
		ran = false
	}
	if c.g.cfg.Observer != nil {
		c.g.cfg.Observer(ctx, ev)
	}
	return ran
}
