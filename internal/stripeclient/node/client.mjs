// The official Stripe Node SDK against an idemhttp server, as a
// third-party retrying client would use it. The Go test (stripe_test.go)
// starts the servers and the fault proxies, writes the plan on stdin and
// checks what this prints: one JSON line per call, then a summary line.
//
// Plan (JSON on stdin):
//   faulty  base URL of the proxy that injects faults (load scenario)
//   clean   base URL of a proxy of the same server without faults
//   patient base URL of a server whose Guard waits 10s for a held key
//   down    base URL of a server whose store is closed
//   calls   number of calls of the load scenario
//   concurrency  calls of the load scenario in flight at once
//
// Each line: {scenario, i, key, ok, id, idEcho, status, type, rawType,
// code, attempts}: ok with the customer's id, or the error the SDK threw.
import Stripe from 'stripe';

const plan = JSON.parse(await readStdin());

const clients = [];
function client(base, opts = {}) {
  const u = new URL(base);
  const s = new Stripe(opts.apiKey ?? 'sk_test_stripeclient', {
    host: u.hostname,
    port: Number(u.port),
    protocol: u.protocol.replace(':', ''),
    timeout: 10000,
    telemetry: false,
    ...(opts.maxNetworkRetries !== undefined ? {maxNetworkRetries: opts.maxNetworkRetries} : {}),
  });
  s.attempts = new Map(); // idempotency key -> attempts sent
  s.on('request', (ev) => {
    const k = ev.idempotency_key ?? '';
    s.attempts.set(k, (s.attempts.get(k) ?? 0) + 1);
  });
  clients.push(s);
  return s;
}

// create calls customers.create and reports it as one line.
async function create(stripe, scenario, i, key, params) {
  const line = {scenario, i, key};
  const before = stripe.attempts.get(key) ?? 0;
  try {
    const c = await stripe.customers.create(params, {idempotencyKey: key});
    Object.assign(line, {
      ok: true,
      id: c.id ?? null,
      idEcho: c.lastResponse?.idempotencyKey ?? null,
      status: c.lastResponse?.statusCode ?? null,
    });
  } catch (e) {
    Object.assign(line, {
      ok: false,
      type: e.type ?? e.constructor?.name ?? String(e),
      rawType: e.rawType ?? null,
      code: e.code ?? null,
      status: e.statusCode ?? null,
      idEcho: e.headers?.['idempotency-key'] ?? null,
      message: String(e.message ?? e).slice(0, 200),
    });
  }
  line.attempts = (stripe.attempts.get(key) ?? 0) - before; // this call's, not an earlier call's with the key
  console.log(JSON.stringify(line));
  return line;
}

const run = Date.now().toString(36);
const key = (name, i) => `${name}-${run}-${i}`;

// Load: every call its own key, through the faulty proxy with the SDK's
// default retries (2).
const faulty = client(plan.faulty);
const loaded = [];
let next = 0;
async function worker() {
  for (let i = next++; i < plan.calls; i = next++) {
    loaded.push(await create(faulty, 'load', i, key('load', i), {name: `customer-${i}`, email: `c${i}@example.com`,
      metadata: {order: String(i), note: 'a b&c=d'}}));
  }
}
await Promise.all(Array.from({length: plan.concurrency}, worker));

// The key of every tenth call that succeeded, sent again through the
// faults with another name: a 422 (or a connection error), never a result.
const reused = loaded.filter((l) => l.ok && l.i % 10 === 0);
await Promise.all(reused.map((l) => create(faulty, 'reuse-under-faults', l.i, l.key, {name: `other-${l.i}`})));

// Every call the faults failed, sent again with its key and parameters
// without faults: its one customer, created now or replayed.
const clean = client(plan.clean);
for (const l of loaded.filter((l) => !l.ok)) {
  await create(clean, 'reconcile', l.i, l.key, {name: `customer-${l.i}`, email: `c${l.i}@example.com`,
    metadata: {order: String(l.i), note: 'a b&c=d'}});
}

// Errors, through the same server without faults: each must throw.
await create(clean, 'first', 0, key('reuse', 0), {name: 'first'});
await create(clean, 'reuse', 0, key('reuse', 0), {name: 'second'});
await create(clean, 'bad-key', 0, 'k'.repeat(300), {name: 'bad-key'});
await create(client(plan.clean, {apiKey: 'sk_test_revoked'}), 'unauthorized', 0, key('auth', 0), {name: 'auth'});
await create(clean, 'no-response', 0, key('silent', 0), {name: 'silent'});
await create(client(plan.down), 'store-down', 0, key('down', 0), {name: 'down'});

// A key held by a slow first call (4 s): the second call, sent once the
// first holds the key, gets 409 from a Guard that waits 150 ms, and the SDK
// gives up after its retries; a Guard that waits 10 s answers it with the
// first call's result.
for (const [scenario, base] of [['held', plan.clean], ['held-patient', plan.patient]]) {
  const s = client(base);
  const k = key(scenario, 0);
  const first = create(s, scenario + '-first', 0, k, {name: 'slow'});
  const held = await fetch(`${base}/test/held/${encodeURIComponent(k)}`);
  if (held.status !== 204) throw new Error(`${scenario}: the first call never held its key (${held.status})`);
  await create(s, scenario, 1, k, {name: 'slow'});
  await first;
  await create(s, scenario + '-after', 2, k, {name: 'slow'});
}

let attempts = 0;
for (const s of clients) for (const n of s.attempts.values()) attempts += n;
console.log(JSON.stringify({summary: true, attempts}));

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return Buffer.concat(chunks).toString('utf8');
}
