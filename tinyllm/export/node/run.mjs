// Runs an exported tinyllm site under Node with the `webgpu` package (Dawn), for the parity tests and timings.
//   node run.mjs SITE_DIR '{"mode": "logits", "tokens": [1, 2, 3]}'
// Prints one JSON line. The Vulkan backend is tried first; where it gives no adapter (Debian 12's lavapipe lacks
// features Dawn requires of Vulkan) Dawn's OpenGL ES backend on Mesa's llvmpipe (EGL, surfaceless) is used, in
// WebGPU's compatibility mode. TINYLLM_DAWN_BACKEND=vulkan|opengles forces one.
import {readFile} from 'node:fs/promises';
import {join} from 'node:path';
import {pathToFileURL} from 'node:url';
import {create, globals} from 'webgpu';

Object.assign(globalThis, globals);
const [site, argsText] = process.argv.slice(2);
const args = JSON.parse(argsText || '{}');
const driver = await import(pathToFileURL(join(site, 'tinyllm.js')).href);
const read = async (name) => {
  const b = await readFile(join(site, name));
  return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
};

// The first backend that gives an adapter: one Dawn instance per backend tried, the failed ones kept alive (a
// second instance made after dropping the first one hangs in dawn.node 0.6.2).
const instances = [];
async function open() {
  const forced = process.env.TINYLLM_DAWN_BACKEND;
  const tries = forced ? [forced] : ['vulkan', 'opengles'];
  for (const backend of tries) {
    if (backend === 'opengles') process.env.EGL_PLATFORM ??= 'surfaceless';
    const gpu = create([`backend=${backend}`]);
    instances.push(gpu);
    const options = backend === 'opengles' ? {featureLevel: 'compatibility'} : undefined;
    if (await gpu.requestAdapter(options)) return {backend, ...(await driver.loadSite(gpu, read, options))};
  }
  throw new Error(`no WebGPU adapter from Dawn's ${tries.join(' or ')} backend`);
}

const site_ = await open();
const {program, manifest, backend, adapter} = site_;
let errors = [];
program.device.addEventListener?.('uncapturederror', (e) => errors.push(e.error.message));
const out = {backend, adapter: [adapter.info.vendor, adapter.info.architecture, adapter.info.description].join(' '),
  dispatches: manifest.dispatches.length, kernels: manifest.kernels.length, pipelines: program.pipelineCount};
if (args.mode === 'logits') {
  const gen = new driver.Generator(program);
  out.logits = [];
  for (const t of args.tokens) out.logits.push(Array.from(await gen.step(t)));
} else if (args.mode === 'generate') {
  const gen = new driver.Generator(program);
  await gen.generate(args.prompt, 2, args.options); // warm: pipelines compiled, buffers touched
  const start = performance.now();
  out.tokens = await gen.generate(args.prompt, args.max_new, args.options);
  const seconds = (performance.now() - start) / 1000;
  out.seconds = seconds;
  out.tokens_per_s = (args.prompt.length + out.tokens.length - 1) / seconds; // every step, prompt's included
} else if (args.mode === 'tokenize') { // the page's tokenizer: ids of each text, and the text they decode to
  const {makeTokenizer} = driver;
  const tok = makeTokenizer(manifest.tokenizer);
  out.ids = args.texts.map((t) => tok.encode(t));
  out.decoded = out.ids.map((ids) => tok.decode(ids));
} else if (args.mode === 'sample') { // the page's sampler alone: how often each token is drawn
  const random = driver.rng(args.options.seed ?? 0);
  const logits = Float32Array.from(args.logits);
  out.counts = new Array(logits.length).fill(0);
  for (let i = 0; i < args.draws; i++) out.counts[driver.sample(logits, args.options, random)] += 1;
} else if (args.mode === 'train') {
  const trainer = new driver.Trainer(program, site_.corpus);
  out.losses = [];
  const start = performance.now();
  for (let i = 0; i < args.steps; i++) out.losses.push(await trainer.step(args.offsets?.[i]));
  out.seconds = (performance.now() - start) / 1000;
  if (args.params) {
    out.params = {};
    for (const [name, data] of Object.entries(await trainer.parameters())) out.params[name] = Array.from(data);
  }
  if (args.checkpoint) {
    const {writeFile} = await import('node:fs/promises');
    await writeFile(args.checkpoint, await trainer.checkpoint());
  }
}
await program.device.queue.onSubmittedWorkDone();
out.errors = [...new Set(errors)].slice(0, 5); // the first few distinct ones
// exit once the line is written: stdout to a pipe is asynchronous, and process.exit would cut it short
process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
