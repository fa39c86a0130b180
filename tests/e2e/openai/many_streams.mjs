// Opens PD_STREAMS concurrent streaming completions against pd-router's HTTP API and reads each
// to its end (tests/e2e/openai_streams_e2e_test.cc). Prints one JSON line:
// {"done": N, "rate_limited": N, "failed": N, "errors": [...first few]}. A stream counts as done
// when it ended with "data: [DONE]" after a finish_reason; as rate_limited on a 429 with an error
// object. Anything else (other status, broken stream, timeout) is a failure.
const base = process.env.PD_OPENAI_BASE;
const model = process.env.PD_OPENAI_MODEL;
const n = Number(process.env.PD_STREAMS);
const maxTokens = Number(process.env.PD_MAX_TOKENS || '8');
const timeoutMs = Number(process.env.PD_TIMEOUT_MS || '120000');

const start = Date.now();

async function one(i) {
  try {
    return await request(i);
  } catch (e) {
    e.atMs = Date.now() - start;  // when it failed, from the start: tells timeouts apart
    throw e;
  }
}

async function request(i) {
  const res = await fetch(`${base}/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, prompt: `Once upon a time ${i}`, max_tokens: maxTokens,
                           ignore_eos: true, temperature: 0, stream: true }),
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (res.status === 429) {
    const body = await res.json();
    if (!body.error || typeof body.error.message !== 'string') throw new Error('429 without error');
    return 'rate_limited';
  }
  if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
  const text = await res.text();
  if (!text.includes('"finish_reason":"length"') || !text.trimEnd().endsWith('data: [DONE]')) {
    throw new Error(`stream ended early: ${text.slice(-200)}`);
  }
  return 'done';
}

const counts = { done: 0, rate_limited: 0, failed: 0, errors: [] };
const results = await Promise.allSettled(Array.from({ length: n }, (_, i) => one(i)));
for (const r of results) {
  if (r.status === 'fulfilled') {
    counts[r.value] += 1;
  } else {
    counts.failed += 1;
    const c = r.reason && r.reason.cause;
    const cause = c ? ` (${c.code || ''} ${c.message || c}${c.socket ? ' ' + JSON.stringify(c.socket) : ''})` : '';
    if (counts.errors.length < 5) {
      counts.errors.push(`${String(r.reason)}${cause} after ${r.reason && r.reason.atMs} ms`);
    }
  }
}
console.log(JSON.stringify(counts));
process.exit(counts.failed === 0 ? 0 : 1);
