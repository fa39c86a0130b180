// Structured output through the official openai npm SDK (tests/e2e/structured_output_e2e_test.cc):
// response_format json_schema (strict) and json_object, streamed and not; every finished answer
// must parse as JSON. Prints one JSON line per answer for the C++ test to validate against its
// schema (python3-jsonschema), then a summary line.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.PD_OPENAI_BASE, apiKey: "unused" });
const model = process.env.PD_OPENAI_MODEL;
const schema = JSON.parse(process.env.PD_SCHEMA);
const prompts = ["Once upon a time", "Lily and Ben", "The cat sat"];
let answers = 0;
for (const [i, prompt] of prompts.entries()) {
  const stream = i % 2 === 1;
  const request = {
    model,
    messages: [{ role: "user", content: prompt }],
    max_tokens: 300,
    temperature: 0,
    response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
  };
  let content = "";
  let finish = null;
  if (stream) {
    const s = await client.chat.completions.create({ ...request, stream: true });
    for await (const chunk of s) {
      const c = chunk.choices[0];
      if (c?.delta?.content) content += c.delta.content;
      if (c?.finish_reason) finish = c.finish_reason;
    }
  } else {
    const r = await client.chat.completions.create(request);
    content = r.choices[0].message.content;
    finish = r.choices[0].finish_reason;
  }
  if (finish === "stop") JSON.parse(content);  // throws (exit 1) on anything but JSON
  console.log(JSON.stringify({ prompt, stream, finish, content }));
  answers++;
}
const obj = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: "Tell me about Tom" }],
  max_tokens: 300,
  temperature: 0,
  response_format: { type: "json_object" },
});
if (obj.choices[0].finish_reason === "stop") {
  const parsed = JSON.parse(obj.choices[0].message.content);
  if (typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("not an object");
}
console.log(JSON.stringify({ summary: true, answers, json_object_finish: obj.choices[0].finish_reason }));
