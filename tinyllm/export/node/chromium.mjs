// Drives headless Chromium through the DevTools protocol (no npm package: Node's WebSocket) for
// tests/test_export_web_browser.py:
//   node --experimental-websocket chromium.mjs '{"url": ..., "script": JS expression, "until": JS expression,
//                                               "screenshot": path, "timeout_s": 120, "flags": [...]}'
// Opens `url`, waits until `until` is truthy, evaluates `script` (e.g. a click), waits for `until` again, saves
// a screenshot, and prints one JSON line: {adapter, result (the value of `until`), console: [...]}.
import {spawn} from 'node:child_process';
import {mkdtempSync, readFileSync, writeFileSync, existsSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';

const args = JSON.parse(process.argv[2]);
const profile = mkdtempSync(join(tmpdir(), 'tinyllm-chromium-'));
const browser = spawn(args.binary || 'chromium', ['--headless=new', '--no-sandbox', '--no-first-run',
  '--remote-debugging-port=0', `--user-data-dir=${profile}`, ...(args.flags || []), 'about:blank'],
{stdio: ['ignore', 'ignore', 'pipe']});
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

let port;
while (!port) {
  const file = join(profile, 'DevToolsActivePort');
  if (existsSync(file)) port = Number(readFileSync(file, 'utf8').split('\n')[0]);
  if (Date.now() > deadline) await finish({error: `Chromium did not start: ${stderr.slice(-2000)}`}, 1);
  await sleep(100);
}
const pages = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
const ws = new WebSocket(pages.find((p) => p.type === 'page').webSocketDebuggerUrl);
await new Promise((r) => ws.addEventListener('open', r));
let next = 0;
const waiting = new Map();
const consoleLines = [];
ws.addEventListener('message', (e) => {
  const msg = JSON.parse(e.data);
  if (msg.id && waiting.has(msg.id)) {
    waiting.get(msg.id)(msg);
    waiting.delete(msg.id);
  } else if (msg.method === 'Runtime.consoleAPICalled') {
    consoleLines.push(msg.params.args.map((a) => a.value ?? a.description).join(' '));
  } else if (msg.method === 'Runtime.exceptionThrown') {
    consoleLines.push(`exception: ${msg.params.exceptionDetails.exception?.description}`);
  }
});
const send = (method, params = {}) => new Promise((resolve) => {
  const id = ++next;
  waiting.set(id, resolve);
  ws.send(JSON.stringify({id, method, params}));
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
await finish(out);
