// Tool calls through the official openai npm SDK (tests/e2e/tool_calls_e2e_test.cc): tool_choice
// "required" and a named function, streamed (raw chunks, and the SDK's own stream helper that
// accumulates delta.tool_calls) and not, then a conversation carrying the call and its result.
// Then parallel_tool_calls: true (an array of calls, enforced). Then the legacy functions API (function_call), plain, streamed and with its history. Every
// answer must be a call whose arguments parse as a JSON object. Prints one JSON line per
// call for the C++ test to validate against the tool's schema (python3-jsonschema), then a
// summary line.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.PD_OPENAI_BASE, apiKey: "unused" });
const model = process.env.PD_OPENAI_MODEL;
const weather = JSON.parse(process.env.PD_SCHEMA);
const tools = [
  {
    type: "function",
    function: { name: "get_weather", description: "The weather", parameters: weather, strict: true },
  },
  { type: "function", function: { name: "get_time", description: "The time now" } },
];
const named = { type: "function", function: { name: "get_weather" } };
const messages = [{ role: "user", content: "What is the weather in Paris?" }];

function check(call, how) {
  if (!call.id?.startsWith("call_")) throw new Error(`${how}: bad id ${call.id}`);
  if (call.type !== "function") throw new Error(`${how}: bad type ${call.type}`);
  const args = JSON.parse(call.function.arguments);  // throws (exit 1) on anything but JSON
  if (typeof args !== "object" || Array.isArray(args)) throw new Error(`${how}: not an object`);
  console.log(JSON.stringify({ how, name: call.function.name, arguments: args }));
}

let calls = 0;
const cases = [
  { how: "required", tool_choice: "required", stream: false },
  { how: "required-stream", tool_choice: "required", stream: true },
  { how: "named", tool_choice: named, stream: false },
  { how: "named-stream-helper", tool_choice: named, stream: "helper", parallel_tool_calls: false },
];
for (const c of cases) {
  const request = { model, messages, tools, tool_choice: c.tool_choice, max_tokens: 200, temperature: 0 };
  if (c.parallel_tool_calls !== undefined) request.parallel_tool_calls = c.parallel_tool_calls;
  let message;
  let finish;
  if (c.stream === true) {
    // Raw chunks: a call's first delta carries id, type and name; later ones argument pieces.
    const s = await client.chat.completions.create({ ...request, stream: true });
    const acc = [];
    for await (const chunk of s) {
      const choice = chunk.choices[0];
      if (!choice) continue;
      for (const d of choice.delta?.tool_calls ?? []) {
        if (!acc[d.index]) {
          if (!d.id || d.type !== "function" || !d.function?.name || d.function.arguments !== "") {
            throw new Error(`first tool_calls delta is incomplete: ${JSON.stringify(d)}`);
          }
          acc[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: "" } };
        } else if (d.id || d.function?.name) {
          throw new Error(`a later tool_calls delta repeats id/name: ${JSON.stringify(d)}`);
        }
        acc[d.index].function.arguments += d.function?.arguments ?? "";
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    message = { tool_calls: acc };
  } else if (c.stream === "helper") {
    const s = client.chat.completions.stream(request);
    const done = await s.finalChatCompletion();
    message = done.choices[0].message;
    finish = done.choices[0].finish_reason;
  } else {
    const r = await client.chat.completions.create(request);
    message = r.choices[0].message;
    finish = r.choices[0].finish_reason;
    if (message.content !== null) throw new Error(`content should be null: ${message.content}`);
  }
  if (finish !== "tool_calls") throw new Error(`${c.how}: finish_reason ${finish}`);
  if (message.tool_calls?.length !== 1) throw new Error(`${c.how}: ${JSON.stringify(message)}`);
  if (typeof c.tool_choice === "object" && message.tool_calls[0].function.name !== "get_weather") {
    throw new Error(`${c.how}: called ${message.tool_calls[0].function.name}`);
  }
  check(message.tool_calls[0], c.how);
  calls++;
}

// parallel_tool_calls: true with tool_choice "required": an array of one or more calls, each
// valid, streamed (each call's first delta with its own index) and not.
let parallel = 0;
for (const stream of [false, true]) {
  const how = stream ? "parallel-stream" : "parallel";
  const request = { model, messages, tools, tool_choice: "required", parallel_tool_calls: true,
                    max_tokens: 300, temperature: 0 };
  let list;
  let finish;
  if (stream) {
    const s = await client.chat.completions.create({ ...request, stream: true });
    list = [];
    for await (const chunk of s) {
      const choice = chunk.choices[0];
      if (!choice) continue;
      for (const d of choice.delta?.tool_calls ?? []) {
        if (!list[d.index]) {
          if (d.index !== list.length || !d.id || !d.function?.name) {
            throw new Error(`${how}: bad first delta ${JSON.stringify(d)}`);
          }
          list[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: "" } };
        }
        list[d.index].function.arguments += d.function?.arguments ?? "";
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  } else {
    const r = await client.chat.completions.create(request);
    list = r.choices[0].message.tool_calls;
    finish = r.choices[0].finish_reason;
  }
  // A model that never closes the array (stories260K, greedy, keeps calling) runs to
  // max_tokens: the last call may be cut (finish_reason "length"), the ones before are whole.
  if (finish === "length") {
    list.pop();
    if (list.length < 2) throw new Error(`${how}: cut with ${list.length} whole calls`);
  } else if (finish !== "tool_calls") {
    throw new Error(`${how}: finish_reason ${finish}`);
  }
  if (!(list?.length >= 1)) throw new Error(`${how}: no calls`);
  for (const call of list) {
    check(call, how);
    parallel++;
  }
}

// The history: the assistant's call and the tool's answer go back to the model.
const first = await client.chat.completions.create({
  model, messages, tools, tool_choice: named, max_tokens: 200, temperature: 0 });
const call = first.choices[0].message.tool_calls[0];
const followUp = await client.chat.completions.create({
  model,
  messages: [
    ...messages,
    { role: "assistant", content: null, tool_calls: [call] },
    { role: "tool", tool_call_id: call.id, content: "Sunny, 21 C" },
  ],
  tools,
  tool_choice: "required",
  max_tokens: 200,
  temperature: 0,
});
check(followUp.choices[0].message.tool_calls[0], "history");
calls++;

// The legacy functions API (the SDK still types it): function_call names the function; the
// answer is message.function_call, streamed as delta.function_call; its history (an assistant
// function_call, a "function" message) goes back to the model.
const functions = tools.map((t) => t.function);
const legacyRequest = {
  model, messages, functions, function_call: { name: "get_weather" }, max_tokens: 200, temperature: 0 };
function checkLegacy(fc, finish, how) {
  if (finish !== "function_call") throw new Error(`${how}: finish_reason ${finish}`);
  if (fc?.name !== "get_weather") throw new Error(`${how}: ${JSON.stringify(fc)}`);
  check({ id: "call_legacy", type: "function", function: fc }, how);
  calls++;
}
const legacy = await client.chat.completions.create(legacyRequest);
if (legacy.choices[0].message.tool_calls) throw new Error("legacy answer has tool_calls");
checkLegacy(legacy.choices[0].message.function_call, legacy.choices[0].finish_reason, "legacy");
const legacyStream = await client.chat.completions.create({ ...legacyRequest, stream: true });
const fc = { name: undefined, arguments: "" };
let legacyFinish;
for await (const chunk of legacyStream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  const d = choice.delta?.function_call;
  if (d) {
    if (d.name !== undefined) {
      if (fc.name !== undefined) throw new Error(`name sent twice: ${JSON.stringify(d)}`);
      fc.name = d.name;
    }
    fc.arguments += d.arguments ?? "";
  }
  if (choice.finish_reason) legacyFinish = choice.finish_reason;
}
checkLegacy(fc, legacyFinish, "legacy-stream");
const legacyFollowUp = await client.chat.completions.create({
  ...legacyRequest,
  messages: [
    ...messages,
    { role: "assistant", content: null, function_call: legacy.choices[0].message.function_call },
    { role: "function", name: "get_weather", content: "Sunny, 21 C" },
  ],
});
checkLegacy(legacyFollowUp.choices[0].message.function_call,
            legacyFollowUp.choices[0].finish_reason, "legacy-history");
console.log(JSON.stringify({ summary: true, calls, parallel }));
