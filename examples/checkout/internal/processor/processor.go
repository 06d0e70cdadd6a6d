// Package processor is a card processor stub for the checkout example and
// its tests: an http.Handler that charges amounts, deduplicating on the
// Idempotency-Key header as a payment API does, and counts what it did.
//
// POST /charges with an Idempotency-Key header and a JSON body
// {"amount": <cents>, "reference": "..."}:
//
//   - 201 {"id":"ch_000001","amount":...}: a new charge, counted;
//   - the same key and body again: the first answer, byte for byte, with
//     Idempotent-Replayed: true; never a second charge;
//   - the same key with another body: 422;
//   - the declined amount ([Processor.Decline]): 402 {"error":"card_declined"},
//     stored with the key like a charge, counted as a decline;
//   - [Processor.FailNext]: 503 before anything is recorded;
//   - no key or a bad body: 400.
//
// [Processor.BlockNext] makes the window of a crash between the charge and
// the caller's reading of it: the answer is recorded, then held back.
package processor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// HeaderKey is the request header the processor deduplicates on.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on an answer replayed for a key.
const HeaderReplayed = "Idempotent-Replayed"

// Request is the body of POST /charges.
type Request struct {
	Amount    int64  `json:"amount"`
	Reference string `json:"reference"`
}

// Charge is the body of a 201 answer.
type Charge struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// Processor is the stub. Build it with [New]; it is safe for concurrent use.
type Processor struct {
	mu       sync.Mutex
	decline  map[int64]bool
	fail     int
	block    []*Block
	answers  map[string]*answer // by Idempotency-Key
	charges  int
	declines int
	requests int
}

type answer struct {
	body   []byte // the request's body, to refuse another one with 422
	status int
	reply  []byte
}

// New returns a processor that approves every amount.
func New() *Processor {
	return &Processor{decline: map[int64]bool{}, answers: map[string]*answer{}}
}

// Decline makes the processor decline amount (402) from now on.
func (p *Processor) Decline(amount int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.decline[amount] = true
}

// FailNext makes the next n requests fail with 503, before the processor
// looks at their key: nothing is recorded.
func (p *Processor) FailNext(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail = n
}

// Block holds back the answer of one new charge: see [Processor.BlockNext].
type Block struct {
	recorded chan string
	release  chan struct{}
	once     sync.Once
}

// Recorded is sent the Idempotency-Key of the charge once it is recorded
// and its answer held back.
func (b *Block) Recorded() <-chan string { return b.recorded }

// Release lets the held answer go (if its caller is still there).
func (b *Block) Release() { b.once.Do(func() { close(b.release) }) }

// BlockNext makes the next new charge or decline (not a replay) hold its
// answer back after it is recorded, until the Block is released or the
// caller goes away (its connection closed: the process was killed).
func (p *Processor) BlockNext() *Block {
	b := &Block{recorded: make(chan string, 1), release: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.block = append(p.block, b)
	return b
}

// Charges returns how many charges the processor made.
func (p *Processor) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges
}

// Declines returns how many charges the processor declined.
func (p *Processor) Declines() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.declines
}

// Requests returns how many requests reached POST /charges.
func (p *Processor) Requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests
}

// Answer returns the status and body stored for key: the charge or the
// decline; ok is false if key made none.
func (p *Processor) Answer(key string) (status int, body []byte, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.answers[key]
	if a == nil {
		return 0, nil, false
	}
	return a.status, bytes.Clone(a.reply), true
}

// ServeHTTP serves POST /charges.
func (p *Processor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/charges" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		reply(w, http.StatusBadRequest, errorBody("unreadable body"), false)
		return
	}
	status, out, replayed, block := p.charge(r.Header.Get(HeaderKey), body)
	if block != nil {
		block.recorded <- r.Header.Get(HeaderKey)
		select {
		case <-block.release:
		case <-r.Context().Done():
			return // the caller is gone: its answer is lost
		}
	}
	reply(w, status, out, replayed)
}

// charge decides the answer under the lock; block is the Block to hold it
// back with, if any.
func (p *Processor) charge(key string, body []byte) (status int, out []byte, replayed bool, block *Block) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	if p.fail > 0 {
		p.fail--
		return http.StatusServiceUnavailable, errorBody("try again"), false, nil
	}
	if key == "" {
		return http.StatusBadRequest, errorBody("missing " + HeaderKey), false, nil
	}
	if a := p.answers[key]; a != nil {
		if !bytes.Equal(a.body, body) {
			return http.StatusUnprocessableEntity, errorBody("this key was used with another request"), false, nil
		}
		return a.status, a.reply, true, nil
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil || req.Amount <= 0 {
		return http.StatusBadRequest, errorBody(`want {"amount": <positive cents>, "reference": "..."}`), false, nil
	}
	a := &answer{body: bytes.Clone(body)}
	if p.decline[req.Amount] {
		p.declines++
		a.status, a.reply = http.StatusPaymentRequired, errorBody("card_declined")
	} else {
		p.charges++
		a.status = http.StatusCreated
		a.reply, _ = json.Marshal(Charge{ID: fmt.Sprintf("ch_%06d", p.charges), Amount: req.Amount})
	}
	p.answers[key] = a
	if len(p.block) > 0 {
		block, p.block = p.block[0], p.block[1:]
	}
	return a.status, a.reply, false, block
}

func errorBody(msg string) []byte {
	b, _ := json.Marshal(map[string]string{"error": msg})
	return b
}

func reply(w http.ResponseWriter, status int, body []byte, replayed bool) {
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
