// Drives headless Chromium through the DevTools protocol over a pipe (--remote-debugging-pipe: no WebSocket, no
// npm package, any Node from 18 on) for tests/test_export_web_browser.py:
//   node chromium.mjs '{"url": ..., "script": JS expression, "until": JS expression, "screenshot": path,
//                       "timeout_s": 120, "flags": [...], "binary": "chromium"}'
// Opens `url`, waits until the page is ready (or failed), asks navigator.gpu for an adapter, evaluates `script`
// (e.g. a click), waits until `until` is truthy, saves a screenshot, and prints one JSON line:
// {adapter, ready, result (the value of `until`), dataset (document.body.dataset as JSON), console: [...]}.
import {spawn} from 'node:child_process';
import {mkdtempSync, writeFileSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';

const args = JSON.parse(process.argv[2]);
const profile = mkdtempSync(join(tmpdir(), 'tinyllm-chromium-'));
// fd 3: what Chromium reads (our commands), fd 4: what it writes (answers, events); messages end with a NUL byte
const browser = spawn(args.binary || 'chromium', ['--headless=new', '--no-sandbox', '--no-first-run',
  '--remote-debugging-pipe', `--user-data-dir=${profile}`, ...(args.flags || []), 'about:blank'],
{stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe']});
let stderr = '';
browser.stderr.on('data', (d) => { stderr += d; });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const deadline = Date.now() + (args.timeout_s || 120) * 1000;

async function finish(out, code = 0) {
  const exited = new Promise((r) => browser.once('exit', r));
  browser.kill();
  await Promise.race([exited, sleep(5000)]);
  try {
    rmSync(profile, {recursive: true, force: true});
  } catch { /* a profile Chromium still writes to: left in the temp dir */ }
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
}
browser.on('error', (e) => finish({error: `cannot start ${args.binary || 'chromium'}: ${e.message}`}, 1));

let next = 0;
let session;
const waiting = new Map();
const consoleLines = [];
let pending = Buffer.alloc(0);
browser.stdio[4].on('data', (chunk) => {
  pending = Buffer.concat([pending, chunk]);
  let end;
  while ((end = pending.indexOf(0)) >= 0) {
    const msg = JSON.parse(pending.subarray(0, end).toString('utf8'));
    pending = pending.subarray(end + 1);
    if (msg.id && waiting.has(msg.id)) {
      waiting.get(msg.id)(msg);
      waiting.delete(msg.id);
    } else if (msg.method === 'Runtime.consoleAPICalled') {
      consoleLines.push(msg.params.args.map((a) => a.value ?? a.description).join(' '));
    } else if (msg.method === 'Runtime.exceptionThrown') {
      consoleLines.push(`exception: ${msg.params.exceptionDetails.exception?.description}`);
    }
  }
});
const send = (method, params = {}, sessionId = session) => new Promise((resolve) => {
  const id = ++next;
  waiting.set(id, resolve);
  browser.stdio[3].write(JSON.stringify({id, method, params, ...(sessionId ? {sessionId} : {})}) + '\0');
});
const evaluate = async (expression) => {
  const r = await send('Runtime.evaluate', {expression, awaitPromise: true, returnByValue: true});
  return r.result?.result?.value;
};
async function until(expression) {
  while (Date.now() < deadline) {
    const v = await evaluate(expression);
    if (v) return v;
    await sleep(250);
  }
  return null;
}
const timer = setTimeout(() => finish({error: `no answer within ${args.timeout_s || 120} s: ${stderr.slice(-2000)}`},
  1), (args.timeout_s || 120) * 1000 + 5000);

const {result: {targetId}} = await send('Target.createTarget', {url: 'about:blank'}, null);
session = (await send('Target.attachToTarget', {targetId, flatten: true}, null)).result.sessionId;
await send('Runtime.enable');
await send('Page.enable');
const out = {console: consoleLines};
const probe = `(async () => {
  if (!navigator.gpu) return 'no navigator.gpu';
  const a = await navigator.gpu.requestAdapter();
  return a ? ['adapter', a.info?.vendor, a.info?.architecture, a.info?.description].join(' ') : 'no adapter';
})()`;
if (args.url) {
  await send('Page.navigate', {url: args.url});
  await until('document.readyState === "complete"');
  out.adapter = await evaluate(probe); // (navigator.gpu exists in secure contexts only: http://127.0.0.1 is one)
  const ready = 'document.body && (document.body.dataset.ready || document.body.dataset.error)';
  out.ready = await until(args.ready || ready);
  if (args.script && out.ready === '1') {
    await evaluate(args.script);
    out.result = await until(args.until);
  }
  out.dataset = await evaluate('JSON.stringify(document.body.dataset)');
  if (args.screenshot) {
    const shot = await send('Page.captureScreenshot', {format: 'png'});
    writeFileSync(args.screenshot, Buffer.from(shot.result.data, 'base64'));
  }
}
clearTimeout(timer);
await finish(out);
