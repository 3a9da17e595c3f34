// Drives an OpenAI-compatible server with the official OpenAI Node client
// (npm `openai`, 4.x) and zod, the way an application would: structured
// outputs through `client.beta.chat.completions.parse` with
// `zodResponseFormat`, forced tool calls (`tool_choice: "required"`) through
// `client.chat.completions.create` with hand-written JSON Schema tools and
// through `parse` with `zodFunction` tools. The OpenAI client test
// (tests/integration/openai_client_test.cpp) runs it against the router and
// against a colocated agent and compares the two outputs.
//
//   NODE_PATH=DEST/node_modules node openai_client_check.cjs BASE_URL
//
// Every request is greedy or seeded, so its output is reproducible. Prints
// one JSON object, with nothing that differs from run to run (no ids, no
// timestamps):
// {"parse": [{"case", "finish_reason", "content", "refusal", "parsed",
//             "valid", "issues", "error"}],
//  "batch": {"whole": [{"index", "text", "finish_reason"}], "streamed":
//            [{"index", "text"}], "error"},
//  "tools": [{"case", "finish_reason", "content", "tool_calls": [{"name",
//             "arguments", "valid", "issues"}], "error"}],
//  "parse_tools": [{... as "tools", each call also with "parsed_arguments"}]}
// "valid" is zod's safeParse of the parsed object (or of the arguments,
// JSON-parsed) against the schema the request offered; "error" is null or
// {"name", "message", "status"} when the client threw (zod refusing the
// content inside parse, LengthFinishReasonError, an HTTP error...).
// Exits 0 when it could run (whatever the answers), 2 on bad usage.
"use strict";

const { OpenAI } = require("openai");
const { zodFunction, zodResponseFormat } = require("openai/helpers/zod");
const { z } = require("zod");

const kModel = "tiny";

// Bounded in every direction, so the tiny model finishes well within
// max_tokens: an enum, a small integer range, a boolean, a short string.
// The properties are not in alphabetical order, as in most real schemas:
// the output must keep the schema's order wherever the request went.
// (zod's max() counts UTF-16 code units where JSON Schema's maxLength
// counts code points: a string at the bound with a character outside the
// Basic Multilingual Plane is valid to the server and too long for zod.)
const Trip = z
  .object({
    city: z.enum(["Oslo", "Rome", "Lima"]),
    days: z.number().int().min(1).max(7),
    umbrella: z.boolean(),
    note: z.string().max(12),
  })
  .strict();

const WeatherArgs = z
  .object({
    city: z.enum(["Oslo", "Rome", "Lima"]),
    days: z.number().int().min(1).max(7),
  })
  .strict();

const TimerArgs = z
  .object({
    minutes: z.number().int().min(1).max(90),
    label: z.string().max(10),
  })
  .strict();

const kArgumentSchemas = { get_weather: WeatherArgs, set_timer: TimerArgs };

// The same two functions as a client without zod writes them.
const kJsonTools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather forecast for a city",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", enum: ["Oslo", "Rome", "Lima"] },
          days: { type: "integer", minimum: 1, maximum: 7 },
        },
        required: ["city", "days"],
        additionalProperties: false,
      },
    },
  },
  {
    type: "function",
    function: {
      name: "set_timer",
      description: "Starts a kitchen timer",
      parameters: {
        type: "object",
        properties: {
          minutes: { type: "integer", minimum: 1, maximum: 90 },
          label: { type: "string", maxLength: 10 },
        },
        required: ["minutes", "label"],
        additionalProperties: false,
      },
    },
  },
];

const kZodTools = [
  zodFunction({
    name: "get_weather",
    description: "The weather forecast for a city",
    parameters: WeatherArgs,
  }),
  zodFunction({ name: "set_timer", description: "Starts a kitchen timer", parameters: TimerArgs }),
];

// Prompts long enough (past the router's 16-token threshold) to be
// disaggregated.
const kTripPrompts = [
  "Plan a short trip for me: pick a city, the number of days, whether to pack an umbrella and a note.",
  "I have a free week in spring and would like to travel somewhere with good food; suggest a plan.",
  "Where should I go for a long weekend, and do I need an umbrella there? Keep the note brief.",
  "My friend wants to see old churches and museums; choose a destination and the length of the stay.",
];
const kToolPrompts = [
  "What will the weather be like in Rome over the next three days? I am packing tonight.",
  "Please start a timer for the pasta, it needs about eleven minutes and call it pasta.",
  "Check the forecast for Lima for the coming week before I book the flights there.",
];

// Greedy, then seeded with temperature 1.
function sampling(i) {
  return i === 0 ? { temperature: 0 } : { temperature: 1, seed: 100 + i };
}

function messagesFor(prompt) {
  return [
    { role: "system", content: "You are a helpful travel assistant. Answer in JSON only." },
    { role: "user", content: prompt },
  ];
}

function describeError(e) {
  return {
    name: e && e.constructor ? e.constructor.name : typeof e,
    message: String(e && e.message !== undefined ? e.message : e),
    status: e && e.status !== undefined ? e.status : null,
  };
}

function check(schema, value) {
  const result = schema.safeParse(value);
  return { valid: result.success, issues: result.success ? [] : result.error.issues };
}

// The calls of a message, with the arguments checked against the offered
// function's zod schema (an unknown name is invalid).
function recordCalls(message, withParsed) {
  return (message.tool_calls || []).map((call) => {
    const record = { name: call.function.name, arguments: call.function.arguments };
    const schema = kArgumentSchemas[call.function.name];
    let outcome;
    if (schema === undefined) {
      outcome = { valid: false, issues: [`${call.function.name} was not offered`] };
    } else {
      try {
        outcome = check(schema, JSON.parse(call.function.arguments));
      } catch (e) {
        outcome = { valid: false, issues: [`arguments are not JSON: ${e.message}`] };
      }
    }
    if (withParsed) {
      record.parsed_arguments =
        call.function.parsed_arguments === undefined ? null : call.function.parsed_arguments;
      // What zod produced inside parse must pass zod again.
      if (outcome.valid && schema !== undefined) outcome = check(schema, record.parsed_arguments);
    }
    record.valid = outcome.valid;
    record.issues = outcome.issues;
    return record;
  });
}

async function parseCases(client) {
  const records = [];
  for (let i = 0; i < kTripPrompts.length; ++i) {
    const record = { case: i, finish_reason: null, content: null, refusal: null, parsed: null };
    try {
      const completion = await client.beta.chat.completions.parse({
        model: kModel,
        messages: messagesFor(kTripPrompts[i]),
        response_format: zodResponseFormat(Trip, "trip"),
        max_tokens: 200,
        ...sampling(i),
      });
      const choice = completion.choices[0];
      record.finish_reason = choice.finish_reason;
      record.content = choice.message.content;
      record.refusal = choice.message.refusal === undefined ? null : choice.message.refusal;
      record.parsed = choice.message.parsed === undefined ? null : choice.message.parsed;
      Object.assign(record, check(Trip, record.parsed));
      record.error = null;
    } catch (e) {
      Object.assign(record, { valid: false, issues: [], error: describeError(e) });
    }
    records.push(record);
  }
  return records;
}

async function toolCases(client, withZod) {
  const records = [];
  for (let i = 0; i < kToolPrompts.length; ++i) {
    const record = { case: i, finish_reason: null, content: null, tool_calls: [] };
    const request = {
      model: kModel,
      messages: messagesFor(kToolPrompts[i]),
      tools: withZod ? kZodTools : kJsonTools,
      tool_choice: "required",
      parallel_tool_calls: false,
      max_tokens: 200,
      ...sampling(i),
    };
    try {
      const completion = withZod
        ? await client.beta.chat.completions.parse(request)
        : await client.chat.completions.create(request);
      const choice = completion.choices[0];
      record.finish_reason = choice.finish_reason;
      record.content = choice.message.content === undefined ? null : choice.message.content;
      record.tool_calls = recordCalls(choice.message, withZod);
      record.error = null;
    } catch (e) {
      record.error = describeError(e);
    }
    records.push(record);
  }
  return records;
}

// A batch of prompts through `client.completions.create` (a list of
// prompts, n = 2), whole and streamed: each choice's index, text and
// finish_reason, in the order received (a stream's texts put together by
// index).
async function batchCases(client) {
  const request = {
    model: kModel,
    prompt: ["The river carried", "Seven stones", [5, 6, 7, 8]],
    n: 2,
    max_tokens: 6,
    temperature: 1.0,
    seed: 5,
  };
  const record = { whole: null, streamed: null, error: null };
  try {
    const whole = await client.completions.create(request);
    record.whole = whole.choices.map((c) => ({
      index: c.index,
      text: c.text,
      finish_reason: c.finish_reason,
    }));
    const stream = await client.completions.create({ ...request, stream: true });
    const texts = {};
    for await (const chunk of stream) {
      for (const c of chunk.choices) texts[c.index] = (texts[c.index] || "") + c.text;
    }
    record.streamed = Object.keys(texts)
      .map(Number)
      .sort((a, b) => a - b)
      .map((index) => ({ index, text: texts[index] }));
  } catch (e) {
    record.error = describeError(e);
  }
  return record;
}

async function main() {
  if (process.argv.length !== 3) {
    process.stderr.write("usage: node openai_client_check.cjs BASE_URL\n");
    return 2;
  }
  const client = new OpenAI({
    baseURL: process.argv[2] + "/v1",
    apiKey: "unused",
    maxRetries: 0,
    timeout: 120 * 1000,
  });
  const result = {
    parse: await parseCases(client),
    tools: await toolCases(client, false),
    parse_tools: await toolCases(client, true),
    batch: await batchCases(client),
  };
  process.stdout.write(JSON.stringify(result) + "\n");
  return 0;
}

main().then(
  (status) => process.exit(status),
  (e) => {
    process.stderr.write(`openai_client_check: ${e && e.stack ? e.stack : e}\n`);
    process.exit(1);
  },
);
