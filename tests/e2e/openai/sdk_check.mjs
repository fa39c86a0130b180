// Drives pd-router's OpenAI HTTP API with the official `openai` Node SDK (tests/e2e/openai_e2e_test.cc
// starts the cluster and runs this). Every check prints "ok <name>"; the first failure throws
// (exit 1) with what differed.
//
// Environment: PD_OPENAI_BASE (http://127.0.0.1:PORT/v1), PD_OPENAI_KEY, PD_OPENAI_MODEL,
// PD_PROMPT, PD_MAX_TOKENS, PD_EXPECTED (greedy completion of PD_PROMPT, from the reference engine).
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const env = (name) => {
  const v = process.env[name];
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
};
const baseURL = env('PD_OPENAI_BASE');
const model = env('PD_OPENAI_MODEL');
const prompt = env('PD_PROMPT');
const maxTokens = Number(env('PD_MAX_TOKENS'));
const expected = env('PD_EXPECTED');
const client = new OpenAI({ baseURL, apiKey: env('PD_OPENAI_KEY'), maxRetries: 0, timeout: 60000 });
const ok = (name) => console.log(`ok ${name}`);

async function expectStatus(name, status, param, fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `${name}: not an APIError: ${e}`);
    assert.equal(e.status, status, `${name}: status ${e.status}: ${e.message}`);
    if (param !== undefined) assert.equal(e.param, param, `${name}: param ${e.param}`);
    assert.ok(e.error && typeof e.error.message === 'string', `${name}: no error object`);
    ok(name);
    return;
  }
  throw new Error(`${name}: the request succeeded`);
}

const models = await client.models.list();
assert.ok(models.data.some((m) => m.id === model), `models: ${JSON.stringify(models.data)}`);
ok('models.list');

const greedy = { model, prompt, max_tokens: maxTokens, temperature: 0 };
const completion = await client.completions.create(greedy);
assert.equal(completion.object, 'text_completion');
assert.equal(completion.choices[0].text, expected);
assert.equal(completion.choices[0].finish_reason, 'length');
assert.equal(completion.usage.completion_tokens, maxTokens);
assert.equal(completion.usage.total_tokens,
             completion.usage.prompt_tokens + completion.usage.completion_tokens);
ok('completions');

let streamed = '';
let finish = null;
let usage = null;
const stream = await client.completions.create({
  ...greedy, stream: true, stream_options: { include_usage: true } });
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    streamed += c.text;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
assert.equal(streamed, expected);
assert.equal(finish, 'length');
assert.ok(usage && usage.completion_tokens === maxTokens, `usage: ${JSON.stringify(usage)}`);
assert.ok(usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens >= 0);
ok('completions.stream');

const messages = [
  { role: 'system', content: 'You tell short stories.' },
  { role: 'user', content: [{ type: 'text', text: 'Tell me about a cat.' }] },
];
const chat = await client.chat.completions.create({ model, messages, max_tokens: maxTokens,
                                                    temperature: 0 });
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices[0].message.role, 'assistant');
const chatText = chat.choices[0].message.content;
assert.ok(chatText.length > 0);
ok('chat');

let chatStreamed = '';
let sawRole = false;
const chatStream = await client.chat.completions.create({
  model, messages, max_completion_tokens: maxTokens, temperature: 0, stream: true });
for await (const chunk of chatStream) {
  for (const c of chunk.choices) {
    if (c.delta.role === 'assistant') sawRole = true;
    if (c.delta.content) chatStreamed += c.delta.content;
  }
}
assert.ok(sawRole, 'no role chunk');
assert.equal(chatStreamed, chatText);
ok('chat.stream');

// n choices: greedy, every one is the expected text; streamed, each under its index.
const three = await client.completions.create({ ...greedy, n: 3 });
assert.equal(three.choices.length, 3);
three.choices.forEach((c, i) => {
  assert.equal(c.index, i);
  assert.equal(c.text, expected, `choice ${i}`);
});
assert.equal(three.usage.completion_tokens, 3 * maxTokens);
assert.equal(three.usage.prompt_tokens, completion.usage.prompt_tokens);
ok('completions.n');

const perChoice = ['', ''];
const finishes = [null, null];
const chatChoices = await client.chat.completions.create({
  model, messages, max_tokens: maxTokens, temperature: 0, n: 2, stream: true });
for await (const chunk of chatChoices) {
  for (const c of chunk.choices) {
    if (c.delta.content) perChoice[c.index] += c.delta.content;
    if (c.finish_reason) finishes[c.index] = c.finish_reason;
  }
}
assert.deepEqual(perChoice, [chatText, chatText]);
assert.ok(finishes.every((f) => f !== null), `finishes: ${finishes}`);
ok('chat.stream.n');

await expectStatus('error.unknown_model', 404, 'model', () =>
  client.completions.create({ ...greedy, model: 'no-such-model' }));
await expectStatus('error.n', 400, 'n', () => client.completions.create({ ...greedy, n: 17 }));
await expectStatus('error.max_tokens', 400, 'max_tokens', () =>
  client.completions.create({ ...greedy, max_tokens: 10_000_000 }));
await expectStatus('error.tool_choice', 400, 'tool_choice.function.name', () =>
  client.chat.completions.create({
    model, messages, tools: [{ type: 'function', function: { name: 'f', parameters: {} } }],
    tool_choice: { type: 'function', function: { name: 'g' } } }));
const stranger = new OpenAI({ baseURL, apiKey: 'not-a-key-of-this-cluster', maxRetries: 0 });
await expectStatus('error.api_key', 401, undefined, () => stranger.completions.create(greedy));

// A client that goes away mid-stream: the router cancels the generation (the test then checks
// the decode worker's metrics).
const controller = new AbortController();
const long = await client.completions.create(
  { model, prompt, max_tokens: 400, temperature: 0, ignore_eos: true, stream: true },
  { signal: controller.signal });
let chunks = 0;
try {
  for await (const chunk of long) {
    if (chunk.choices.length > 0 && ++chunks === 3) {
      controller.abort();  // closes the connection; chunks already parsed are not read
      break;
    }
  }
} catch (e) {
  assert.ok(e.name === 'APIUserAbortError' || e.name === 'AbortError', `abort: ${e}`);
}
assert.equal(chunks, 3);
ok('disconnect');
