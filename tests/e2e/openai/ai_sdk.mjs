// Vercel's AI SDK (`ai` with `@ai-sdk/openai-compatible`) against pd-router
// (tests/e2e/tool_calls_e2e_test.cc): another client we did not write. generateText and
// streamText, generateObject with a JSON schema (response_format json_schema), and a forced
// tool (tool_choice naming it), generated and streamed; the SDK parses every answer itself.
// Prints one JSON line per object or call ({how, name, arguments}) for the C++ test to validate
// against the tool's schema, then a summary line.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, jsonSchema, streamText, tool } from "ai";

const provider = createOpenAICompatible({
  name: "pdserve",
  baseURL: process.env.PD_OPENAI_BASE,
  apiKey: "unused",
  supportsStructuredOutputs: true,
});
const model = provider.chatModel(process.env.PD_OPENAI_MODEL);
const weather = JSON.parse(process.env.PD_SCHEMA);
const prompt = "What is the weather in Paris?";
const common = { model, prompt, temperature: 0, maxOutputTokens: 120, maxRetries: 0 };
let answers = 0;

function report(how, name, args) {
  if (typeof args !== "object" || args === null || Array.isArray(args)) {
    throw new Error(`${how}: not an object: ${JSON.stringify(args)}`);
  }
  console.log(JSON.stringify({ how, name, arguments: args }));
  answers++;
}

// Plain text, generated and streamed: the same greedy text.
const text = await generateText(common);
let streamed = "";
for await (const piece of streamText(common).textStream) streamed += piece;
if (text.text.length === 0 || streamed !== text.text) {
  throw new Error(`streamText ${JSON.stringify(streamed)} != generateText ${JSON.stringify(text.text)}`);
}
console.log(JSON.stringify({ ai_sdk_text: text.text, finish: text.finishReason, usage: text.usage }));

// Structured output: the SDK parses (and validates) the object.
const object = await generateObject({ ...common, schema: jsonSchema(weather), schemaName: "get_weather" });
report("ai_sdk.generateObject", "get_weather", object.object);

// A forced tool, generated and streamed.
const tools = { get_weather: tool({ description: "The weather", inputSchema: jsonSchema(weather) }) };
const toolChoice = { type: "tool", toolName: "get_weather" };
const called = await generateText({ ...common, tools, toolChoice });
if (called.toolCalls.length !== 1) throw new Error(`toolCalls: ${JSON.stringify(called.toolCalls)}`);
report("ai_sdk.tool", called.toolCalls[0].toolName, called.toolCalls[0].input);
const stream = streamText({ ...common, tools, toolChoice });
const streamedCalls = await stream.toolCalls;
if (streamedCalls.length !== 1) throw new Error(`streamed toolCalls: ${JSON.stringify(streamedCalls)}`);
report("ai_sdk.tool.stream", streamedCalls[0].toolName, streamedCalls[0].input);
console.log(JSON.stringify({ summary: true, ai_sdk: answers }));
