// One process of the proxy's Node fleet test (cmd/sluice, TestNodeFleet):
// CONCURRENCY workers each make CALLS calls through the sluice proxy at
// SLUICE_PROXY with the official OpenAI and Anthropic SDKs, unmodified but
// for their base URL and their retries; even workers call OpenAI's chat
// completions, odd ones Anthropic's messages; every other call streams.
// It prints "ready" on stderr once loaded and starts at a line on stdin.
// It prints one JSON line: the calls that succeeded, those that failed and
// why, the tokens the responses reported, its first start and last end,
// and how long its event loop was held up (how late a 10 ms timer fired,
// in ms: the longest, and the sum of the times it came a period or more
// late): a machine too busy to run the process makes them long.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const base = process.env.SLUICE_PROXY;
const calls = Number(process.env.CALLS);
const concurrency = Number(process.env.CONCURRENCY);
const maxRetries = 10;
const openai = new OpenAI({ apiKey: 'sk-fleet-openai', baseURL: base + '/openai/v1', maxRetries });
const anthropic = new Anthropic({ apiKey: 'sk-ant-fleet', baseURL: base + '/anthropic', maxRetries });
const messages = [{ role: 'user', content: 'Say hello to every worker of the fleet, briefly.' }];

async function openaiCall(stream) {
  if (!stream) {
    const r = await openai.chat.completions.create({ model: 'gpt-test', max_tokens: 16, messages });
    return r.usage.total_tokens;
  }
  const s = await openai.chat.completions.create({
    model: 'gpt-test', max_tokens: 16, messages, stream: true, stream_options: { include_usage: true },
  });
  let tokens = 0;
  for await (const chunk of s) {
    if (chunk.usage) tokens = chunk.usage.total_tokens;
  }
  return tokens;
}

async function anthropicCall(stream) {
  if (!stream) {
    const r = await anthropic.messages.create({ model: 'claude-test', max_tokens: 16, messages });
    return r.usage.input_tokens + r.usage.output_tokens;
  }
  const s = await anthropic.messages.create({ model: 'claude-test', max_tokens: 16, messages, stream: true });
  let input = 0, output = 0;
  for await (const ev of s) {
    if (ev.type === 'message_start') input = ev.message.usage.input_tokens;
    if (ev.type === 'message_delta') output = ev.usage.output_tokens;
  }
  return input + output;
}

// Ready: the SDKs are loaded. The calls start when stdin says go, at once
// in every process of the fleet.
console.error('ready');
await new Promise((resolve) => process.stdin.once('data', resolve));
const result = { ok: 0, failed: 0, errors: [], calls: [], openaiTokens: 0, anthropicTokens: 0, start: Date.now(), end: 0, stall: 0, stalled: 0 };
let tick = performance.now();
const watch = setInterval(() => {
  const now = performance.now();
  const late = Math.max(now - tick - 10, 0);
  result.stall = Math.max(result.stall, Math.round(late));
  if (late >= 10) result.stalled += late;
  tick = now;
}, 10);
async function worker(w) {
  for (let k = 0; k < calls; k++) {
    const stream = k % 2 === 1;
    const t0 = Date.now();
    try {
      if (w % 2 === 0) result.openaiTokens += await openaiCall(stream);
      else result.anthropicTokens += await anthropicCall(stream);
      result.ok++;
      result.calls.push([w % 2 === 0 ? 'openai' : 'anthropic', stream, t0 - result.start, Date.now() - t0]);
    } catch (e) {
      result.failed++;
      if (result.errors.length < 5) result.errors.push(String(e));
    }
  }
}
await Promise.all(Array.from({ length: concurrency }, (_, w) => worker(w)));
result.end = Date.now();
clearInterval(watch);
result.stalled = Math.round(result.stalled);
console.log(JSON.stringify(result));
