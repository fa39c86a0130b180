// Tool calls through the official openai npm SDK (tests/e2e/tool_calls_e2e_test.cc): tool_choice
// "required" and a named function, streamed (raw chunks, and the SDK's own stream helper that
// accumulates delta.tool_calls) and not, then a conversation carrying the call and its result.
// Every answer must be a call whose arguments parse as a JSON object. Prints one JSON line per
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
console.log(JSON.stringify({ summary: true, calls }));
