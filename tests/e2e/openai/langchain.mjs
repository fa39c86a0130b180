// LangChain's ChatOpenAI against pd-router (tests/e2e/tool_calls_e2e_test.cc): a client we did not
// write, with its own request shapes. withStructuredOutput (response_format json_schema, and the
// function-calling method: a named tool_choice), bindTools with a named and a "required" choice,
// invoked and streamed (LangChain accumulates delta.tool_calls itself). Every answer must come
// back parsed by LangChain; prints one JSON line per answer ({how, name, arguments}) for the C++
// test to validate against the tool's schema, then a summary line.
import { ChatOpenAI } from "@langchain/openai";

const model = process.env.PD_OPENAI_MODEL;
const weather = JSON.parse(process.env.PD_SCHEMA);
const llm = new ChatOpenAI({
  model,
  apiKey: "unused",
  configuration: { baseURL: process.env.PD_OPENAI_BASE },
  temperature: 0,
  maxTokens: 120,
  maxRetries: 0,
});
const question = "What is the weather in Paris?";
const tool = {
  type: "function",
  function: { name: "get_weather", description: "The weather", parameters: weather },
};
let answers = 0;

function report(how, name, args) {
  if (typeof args !== "object" || args === null || Array.isArray(args)) {
    throw new Error(`${how}: not an object: ${JSON.stringify(args)}`);
  }
  console.log(JSON.stringify({ how, name, arguments: args }));
  answers++;
}

// Structured output, both of LangChain's methods: the parsed object comes back.
for (const method of ["jsonSchema", "functionCalling"]) {
  const structured = llm.withStructuredOutput(weather, { name: "get_weather", method });
  report(`langchain.withStructuredOutput.${method}`, "get_weather", await structured.invoke(question));
}

// bindTools: a named choice and "required", invoked and streamed.
for (const choice of ["get_weather", "required"]) {
  const bound = llm.bindTools([tool], { tool_choice: choice });
  const message = await bound.invoke(question);
  if (message.tool_calls?.length !== 1) {
    throw new Error(`bindTools ${choice}: ${JSON.stringify(message.tool_calls)}`);
  }
  const call = message.tool_calls[0];
  if (!call.id) throw new Error(`bindTools ${choice}: no call id`);
  report(`langchain.bindTools.${choice}`, call.name, call.args);

  let acc;
  for await (const chunk of await bound.stream(question)) acc = acc === undefined ? chunk : acc.concat(chunk);
  if (acc?.tool_calls?.length !== 1) {
    throw new Error(`bindTools ${choice} stream: ${JSON.stringify(acc?.tool_call_chunks)}`);
  }
  report(`langchain.bindTools.${choice}.stream`, acc.tool_calls[0].name, acc.tool_calls[0].args);
}
console.log(JSON.stringify({ summary: true, langchain: answers }));
