package conformance

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// Phases of a call, as the labeler names the steps they send.
const (
	phaseReserve  = "reserve"
	phaseFn       = "fn"
	phaseComplete = "complete"
	phaseRollback = "rollback"
	phaseOther    = "other"
)

// faultLabeler names every step the proxy sees by the store call that was
// running when it was sent: "reserve#2" is the second round trip of
// Reserve.
type faultLabeler struct {
	mu     sync.Mutex
	phase  string
	counts map[string]int
	labels map[int]string // by Step.Seq
	order  []faultStep
}

func newFaultLabeler() *faultLabeler {
	return &faultLabeler{counts: map[string]int{}, labels: map[int]string{}}
}

func (l *faultLabeler) set(phase string) {
	l.mu.Lock()
	l.phase = phase
	l.mu.Unlock()
}

// reset starts counting again; call it right before Proxy.Arm.
func (l *faultLabeler) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts = map[string]int{}
	l.labels = map[int]string{}
	l.order = nil
}

func (l *faultLabeler) onStep(st faultproxy.Step) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ph := l.phase
	if ph == "" {
		ph = phaseOther
	}
	l.counts[ph]++
	label := ph + "#" + strconv.Itoa(l.counts[ph])
	l.labels[st.Seq] = label
	l.order = append(l.order, faultStep{label: label, head: printable(st.Head)})
}

func (l *faultLabeler) labelOf(seq int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.labels[seq]
}

func (l *faultLabeler) matcher(label string) func(faultproxy.Step) bool {
	return func(st faultproxy.Step) bool { return l.labelOf(st.Seq) == label }
}

// steps returns the steps labelled since reset, outside setup traffic.
func (l *faultLabeler) steps() []faultStep {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order)
}

// printable keeps the printable ASCII of b, other bytes as '.', runs of
// them collapsed.
func printable(b []byte) string {
	var sb strings.Builder
	dot := false
	for _, c := range b {
		if c >= 0x20 && c <= 0x7e {
			sb.WriteByte(c)
			dot = false
		} else if !dot {
			sb.WriteByte('.')
			dot = true
		}
	}
	return sb.String()
}

// phasedStore tells the labeler which store call is running.
type phasedStore[Tx any] struct {
	inner idempotency.KeyStore[Tx]
	lab   *faultLabeler
}

func (s *phasedStore[Tx]) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[Tx], *backend.Record, error) {
	s.lab.set(phaseReserve)
	defer s.lab.set("")
	txn, rec, err := s.inner.Reserve(ctx, r)
	if txn != nil {
		txn = &phasedTxn[Tx]{inner: txn, lab: s.lab}
	}
	return txn, rec, err
}

func (s *phasedStore[Tx]) Purge(ctx context.Context, limit int) (int, error) {
	return s.inner.Purge(ctx, limit)
}

// IsConflict passes the wrapped store's classification on.
func (s *phasedStore[Tx]) IsConflict(err error) bool {
	cc, ok := s.inner.(backend.ConflictClassifier)
	return ok && cc.IsConflict(err)
}

type phasedTxn[Tx any] struct {
	inner backend.Txn[Tx]
	lab   *faultLabeler
}

func (t *phasedTxn[Tx]) Tx() Tx { return t.inner.Tx() }

func (t *phasedTxn[Tx]) Complete(ctx context.Context, resp idempotency.Response) error {
	t.lab.set(phaseComplete)
	defer t.lab.set("")
	return t.inner.Complete(ctx, resp)
}

func (t *phasedTxn[Tx]) Rollback(ctx context.Context) error {
	t.lab.set(phaseRollback)
	defer t.lab.set("")
	return t.inner.Rollback(ctx)
}
