// A conversation through the gateway's /v1/responses as a Vercel AI SDK app has it: the
// default provider (`provider(model)`: the Responses API, store: true) and the whole
// history sent again every turn, so earlier answers go back as item_reference items.
//
// Reads one JSON object on stdin:
//   {baseURL, apiKey, session, models: [...], mode, questions: [...],
//    maxOutputTokens?, temperature?} (the last two: for a real, slow model)
// models: each turn's model ("tool-caller" is given a get_weather tool the app runs, and
// up to three steps: the call, then the answer from its result).
// mode: "generate" (generateText, response.messages appended: not streamed),
//       "stream"   (streamText, response.messages appended),
//       "ui"       (useChat's round trip: UI messages converted by convertToModelMessages,
//                   the answer read back from the UI message stream, streamed).
// Prints one JSON object: {answers, references, inputs}: each turn's answer text, how
// many item_reference items the SDK sent in all, and each request's input item types.
import { createOpenAI } from '@ai-sdk/openai';
import {
  convertToModelMessages,
  generateText,
  jsonSchema,
  readUIMessageStream,
  stepCountIs,
  streamText,
  tool,
} from 'ai';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const { baseURL, apiKey, session, models, mode, questions, maxOutputTokens, temperature } = JSON.parse(
  Buffer.concat(chunks).toString('utf8'),
);

const inputs = [];
// What the SDK sends, seen on its way out (the gateway sees the same bytes).
async function watched(url, init) {
  if (init && typeof init.body === 'string') {
    inputs.push(JSON.parse(init.body).input.map((item) => item.type ?? 'message'));
  }
  return fetch(url, init);
}

const provider = createOpenAI({
  baseURL,
  apiKey,
  headers: { 'X-Session-Id': session },
  fetch: watched,
});

const getWeather = tool({
  description: 'The weather in a city',
  inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' } } }),
  execute: async ({ city }) => `sunny in ${city}`,
});

function options(model, messages) {
  const tools = model === 'tool-caller' ? { get_weather: getWeather } : undefined;
  return {
    model: provider(model), messages, tools, stopWhen: stepCountIs(3), maxRetries: 0,
    maxOutputTokens, temperature,
  };
}

async function turnOfModelMessages(model, messages) {
  if (mode === 'generate') {
    const result = await generateText(options(model, messages));
    return { text: result.text, added: result.response.messages };
  }
  const result = streamText(options(model, messages));
  const text = await result.text;
  return { text, added: (await result.response).messages };
}

async function turnOfUiMessages(model, uiMessages) {
  const messages = await convertToModelMessages(uiMessages);
  const result = streamText(options(model, messages));
  let answer;
  for await (const message of readUIMessageStream({ stream: result.toUIMessageStream() })) {
    answer = message; // the assistant's UI message as useChat keeps it, growing
  }
  const text = answer.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  return { text, added: [answer] };
}

const history = [];
const answers = [];
for (const [n, question] of questions.entries()) {
  const turn = mode === 'ui' ? turnOfUiMessages : turnOfModelMessages;
  history.push(
    mode === 'ui'
      ? { id: `user-${n}`, role: 'user', parts: [{ type: 'text', text: question }] }
      : { role: 'user', content: question },
  );
  const { text, added } = await turn(models[n], history);
  history.push(...added);
  answers.push(text);
}
const references = inputs.flat().filter((type) => type === 'item_reference').length;
console.log(JSON.stringify({ answers, references, inputs }));
