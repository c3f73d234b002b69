// tinyllm.js: replays the dispatches tinyllm's WGSL runtime recorded for one step (manifest.json) on WebGPU.
// No framework, no network: `read(name)` gives the site's files (fetch in a page, the file system under Node).

export const FORMAT = 'tinyllm-webgpu-1';
const MASK = -1e30; // an empty cache slot's key bias (tinyllm/models/generation.py MASKED)

// ---- files ----
export function parseSafetensors(buffer) {
  const view = new DataView(buffer);
  const n = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, n)));
  const out = {};
  for (const [name, entry] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [begin, end] = entry.data_offsets;
    out[name] = {dtype: entry.dtype, shape: entry.shape, bytes: new Uint8Array(buffer, 8 + n + begin, end - begin)};
  }
  return {tensors: out, metadata: header.__metadata__ || {}};
}

// A safetensors file of Float32 tensors {name: {shape, data: Float32Array}} with string metadata.
export function writeSafetensors(tensors, metadata) {
  const header = {};
  let offset = 0;
  const names = Object.keys(tensors).sort();
  for (const name of names) {
    const t = tensors[name];
    header[name] = {dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + t.data.byteLength]};
    offset += t.data.byteLength;
  }
  if (metadata) header.__metadata__ = metadata;
  let text = JSON.stringify(header);
  text += ' '.repeat((8 - ((8 + new TextEncoder().encode(text).length) % 8)) % 8); // data 8-byte aligned
  const head = new TextEncoder().encode(text);
  const out = new Uint8Array(8 + head.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(head.length), true);
  out.set(head, 8);
  let at = 8 + head.length;
  for (const name of names) {
    const d = tensors[name].data;
    out.set(new Uint8Array(d.buffer, d.byteOffset, d.byteLength), at);
    at += d.byteLength;
  }
  return out;
}

// ---- the device ----
const LIMITS = ['maxStorageBuffersPerShaderStage', 'maxStorageBufferBindingSize', 'maxBufferSize',
  'maxComputeWorkgroupStorageSize', 'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX',
  'maxComputeWorkgroupSizeY', 'maxComputeWorkgroupSizeZ', 'maxComputeWorkgroupsPerDimension'];

// A device that offers what the recorded kernels need (manifest.needs), asking the adapter for its largest limits
// (the defaults, 8 storage buffers a stage, are fewer than fused kernels bind).
export async function openDevice(gpu, needs, adapterOptions) {
  if (!gpu) throw new Error('WebGPU is not available here (navigator.gpu is missing): open the page in a browser ' +
    'with WebGPU enabled (Chrome/Edge 113+, or chromium --enable-unsafe-webgpu)');
  let adapter = await gpu.requestAdapter(adapterOptions);
  if (!adapter && !adapterOptions) adapter = await gpu.requestAdapter({featureLevel: 'compatibility'});
  if (!adapter) throw new Error('WebGPU: no adapter (requestAdapter returned null): the browser has WebGPU ' +
    'turned off or no GPU it supports (on Linux, Chrome needs --enable-unsafe-webgpu or chrome://flags)');
  const requiredLimits = {};
  for (const k of LIMITS) if (adapter.limits[k] !== undefined) requiredLimits[k] = adapter.limits[k];
  for (const k of ['maxStorageBuffersPerShaderStage', 'maxStorageBufferBindingSize', 'maxBufferSize']) {
    if (needs[k] > (adapter.limits[k] || 0)) {
      throw new Error(`WebGPU: the kernels need ${k} = ${needs[k]}, this adapter offers ${adapter.limits[k]}`);
    }
  }
  const requiredFeatures = [];
  if (needs.shaderF16) {
    if (!adapter.features.has('shader-f16')) throw new Error('WebGPU: the kernels compute in float16 (shader-f16), ' +
      'which this adapter lacks');
    requiredFeatures.push('shader-f16');
  }
  const device = await adapter.requestDevice({requiredLimits, requiredFeatures});
  return {adapter, device};
}

// ---- the recorded program ----
export class Program {
  // device: a GPUDevice; manifest; kernels: WGSL texts; weights: parseSafetensors' tensors; state: ArrayBuffer
  constructor(device, manifest, kernels, weights, state) {
    this.device = device;
    this.manifest = manifest;
    const U = globalThis.GPUBufferUsage;
    this.buffers = manifest.buffers.map((b, i) => {
      const buffer = device.createBuffer({size: b.nbytes, usage: U.STORAGE | U.COPY_SRC | U.COPY_DST,
        label: `buffer ${i}`});
      if (b.weight !== undefined) {
        const w = weights[b.weight];
        if (!w) throw new Error(`weights.safetensors has no tensor ${b.weight} (buffer ${i})`);
        device.queue.writeBuffer(buffer, 0, w.bytes);
      } else if (b.state !== undefined) {
        device.queue.writeBuffer(buffer, 0, new Uint8Array(state, b.state[0], b.state[1]));
      }
      return buffer;
    });
    const pipelines = new Map(); // (kernel, read-only flags) -> [pipeline, layout], as the WGSL runtime keys them
    const modules = kernels.map((code, k) => device.createShaderModule({code, label: manifest.kernels[k]}));
    this.modules = modules;
    this.steps = manifest.dispatches.map(([k, bufs, ro, groups]) => {
      const key = `${k}:${ro.join('')}`;
      let hit = pipelines.get(key);
      if (!hit) {
        const layout = device.createBindGroupLayout({entries: ro.map((r, binding) => ({binding,
          visibility: globalThis.GPUShaderStage.COMPUTE, buffer: {type: r ? 'read-only-storage' : 'storage'}}))});
        const pipeline = device.createComputePipeline({compute: {module: modules[k], entryPoint: 'main'},
          layout: device.createPipelineLayout({bindGroupLayouts: [layout]})});
        hit = [pipeline, layout];
        pipelines.set(key, hit);
      }
      const group = device.createBindGroup({layout: hit[1], entries: bufs.map((b, binding) => ({binding,
        resource: {buffer: this.buffers[b]}}))});
      return [hit[0], group, groups];
    });
    this.pipelineCount = pipelines.size;
    this.weights = weights;
  }

  // Throws the first WGSL compilation error, naming its kernel file and line (a browser's compiler may refuse
  // what wgpu-py's accepted).
  async check() {
    for (const [k, module] of this.modules.entries()) {
      const info = module.getCompilationInfo ? await module.getCompilationInfo() : {messages: []};
      const bad = info.messages.find((m) => m.type === 'error');
      if (bad) throw new Error(`${this.manifest.kernels[k]}:${bad.lineNum}:${bad.linePos}: ${bad.message}`);
    }
  }

  // Copies `before` [[from, to, nbytes]], the recorded dispatches (one compute pass), copies `after`; one submit.
  run(after = [], before = []) {
    const encoder = this.device.createCommandEncoder();
    const copy = ([from, to, nbytes]) => encoder.copyBufferToBuffer(this.buffers[from], 0, this.buffers[to], 0, nbytes);
    before.forEach(copy);
    const pass = encoder.beginComputePass();
    for (const [pipeline, group, groups] of this.steps) {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(groups[0], groups[1], groups[2]);
    }
    pass.end();
    after.forEach(copy);
    this.device.queue.submit([encoder.finish()]);
  }

  writeInt(buffer, value) {
    this.device.queue.writeBuffer(this.buffers[buffer], 0, new Int32Array([value]));
  }

  write(buffer, typedArray) {
    this.device.queue.writeBuffer(this.buffers[buffer], 0, typedArray);
  }

  // `count` float32 values of buffer `buffer` from element `offset`, once the GPU is done. One staging buffer per
  // size is kept (a decode step reads the same logits every time); reads are awaited one after another.
  async readFloats(buffer, offset, count) {
    const U = globalThis.GPUBufferUsage;
    const nbytes = count * 4;
    this.staging ??= new Map();
    let staging = this.staging.get(nbytes);
    if (!staging) {
      staging = this.device.createBuffer({size: nbytes, usage: U.MAP_READ | U.COPY_DST});
      this.staging.set(nbytes, staging);
    }
    const encoder = this.device.createCommandEncoder();
    encoder.copyBufferToBuffer(this.buffers[buffer], offset * 4, staging, 0, nbytes);
    this.device.queue.submit([encoder.finish()]);
    await staging.mapAsync(globalThis.GPUMapMode.READ);
    const out = new Float32Array(staging.getMappedRange().slice(0));
    staging.unmap();
    return out;
  }
}

// ---- tokenizers ----
export function makeTokenizer(table) {
  if (table.kind === 'char') {
    const chars = Array.from(table.vocab);
    const ids = new Map(chars.map((c, i) => [c, i]));
    return {
      nVocab: chars.length,
      encode(text) {
        return Array.from(text).map((c) => {
          if (!ids.has(c)) throw new Error(`the character ${JSON.stringify(c)} is not in the model's vocabulary`);
          return ids.get(c);
        });
      },
      decode: (tokens) => tokens.map((t) => chars[t]).join(''),
    };
  }
  if (table.kind === 'bpe') return bpeTokenizer(table);
  return { // kind "ids": token ids separated by spaces
    nVocab: table.n_vocab,
    encode: (text) => text.trim().split(/\s+/).filter(Boolean).map(Number),
    decode: (tokens) => tokens.map((t) => `${t} `).join(''),
  };
}

// GPT-2's split pattern (tinyllm/tokenizer.py GPT2_PATTERN) in JavaScript's syntax
const GPT2_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

// A byte-level BPE (tinyllm.tokenizer.Tokenizer): text cut by the split pattern, each chunk's UTF-8 bytes merged
// pairwise, the adjacent pair whose concatenation has the lowest id first (tiktoken's rule). Bytes are kept as
// Latin-1 strings, one character per byte, so that they can be Map keys.
function bpeTokenizer(table) {
  const latin1 = (hex) => hex.match(/../g)?.map((h) => String.fromCharCode(parseInt(h, 16))).join('') ?? '';
  const bytesOf = new Map(); // id -> bytes
  const ranks = new Map(); // bytes -> id
  for (const [id, hex] of Object.entries(table.tokens)) {
    bytesOf.set(Number(id), latin1(hex));
    ranks.set(latin1(hex), Number(id));
  }
  for (const [text, id] of Object.entries(table.special)) {
    bytesOf.set(id, String.fromCharCode(...new TextEncoder().encode(text)));
  }
  const merge = (chunk) => {
    let parts = Array.from(chunk);
    for (;;) {
      let best = -1;
      let bestRank = Infinity;
      for (let i = 0; i + 1 < parts.length; i++) {
        const r = ranks.get(parts[i] + parts[i + 1]);
        if (r !== undefined && r < bestRank) [best, bestRank] = [i, r];
      }
      if (best < 0) break;
      parts = [...parts.slice(0, best), parts[best] + parts[best + 1], ...parts.slice(best + 2)];
    }
    return parts.map((p) => ranks.get(p));
  };
  const utf8 = (text) => String.fromCharCode(...new TextEncoder().encode(text));
  const toBytes = (tokens) => Uint8Array.from(tokens.flatMap((t) => Array.from(bytesOf.get(t) ?? '',
    (c) => c.charCodeAt(0))));
  return {
    nVocab: Math.max(...bytesOf.keys()) + 1,
    encode(text) {
      const chunks = table.pattern === 'gpt2' ? text.match(GPT2_SPLIT) ?? [] : (text ? [text] : []);
      return chunks.flatMap((chunk) => merge(utf8(chunk)));
    },
    decode: (tokens) => new TextDecoder().decode(toBytes(tokens)),
    // a decoder for a stream of tokens: the bytes of a character split across tokens wait until it is whole
    stream() {
      const decoder = new TextDecoder();
      return (tokens) => decoder.decode(toBytes(tokens), {stream: true});
    },
  };
}

// ---- sampling (tinyllm.sampling's temperature, top-k, top-p), seeded ----
export function rng(seed) { // mulberry32: a small seeded PRNG, uniform in [0, 1)
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function argmax(logits) {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
}

// temperature 0: argmax; else softmax(logits / temperature) kept to the top_k likeliest, then to the fewest whose
// probability reaches top_p (the token that crosses it included), renormalised and drawn with `random`.
export function sample(logits, {temperature = 1, topK = 0, topP = 1}, random) {
  if (temperature === 0) return argmax(logits);
  const order = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a]);
  const keep = topK > 0 ? order.slice(0, topK) : order;
  const top = logits[keep[0]];
  let probs = keep.map((i) => Math.exp((logits[i] - top) / temperature));
  let total = probs.reduce((s, p) => s + p, 0);
  probs = probs.map((p) => p / total);
  let n = probs.length;
  if (topP < 1) {
    let sum = 0;
    for (n = 0; n < probs.length && sum < topP; n++) sum += probs[n];
  }
  total = probs.slice(0, n).reduce((s, p) => s + p, 0);
  let u = random() * total;
  for (let j = 0; j < n; j++) {
    u -= probs[j];
    if (u < 0) return keep[j];
  }
  return keep[n - 1];
}

// ---- generation: the decode step against the key/value caches ----
export class Generator {
  constructor(program) {
    this.program = program;
    this.plan = program.manifest.generate;
    this.block = program.manifest.model.config.block_size ?? program.manifest.model.config.max_position_embeddings;
    this.reset();
  }

  // Empty caches: zeros, each key slot's mask bias (its last component) MASKED.
  reset() {
    for (const c of this.plan.caches) {
      const data = new Float32Array(c.shape.reduce((a, b) => a * b, 1));
      if (c.masked_last) {
        const last = c.shape[c.shape.length - 1];
        for (let i = last - 1; i < data.length; i += last) data[i] = c.mask ?? MASK;
      }
      this.program.device.queue.writeBuffer(this.program.buffers[c.buffer], 0, data);
    }
    this.length = 0;
  }

  // The next-token logits after `token` at position this.length (the step writes its key and value there).
  async step(token) {
    if (this.length >= this.block) throw new Error(`the context is full: ${this.block} tokens (block_size)`);
    const {inputs, copies, logits} = this.plan;
    this.program.writeInt(inputs.token, token);
    this.program.writeInt(inputs.pos, this.length);
    this.program.run(copies);
    this.length += 1;
    return this.program.readFloats(logits.buffer, logits.offset, logits.count);
  }

  // Feed `prompt` (ids), then sample `maxNew` tokens; onToken(id) as each is drawn. Returns the new ids.
  async generate(prompt, maxNew, options = {}, onToken = () => {}) {
    if (!prompt.length) throw new Error('the prompt is empty: give at least one token');
    this.reset();
    const random = rng(options.seed ?? 0);
    let logits;
    for (const t of prompt) logits = await this.step(t);
    const out = [];
    for (let i = 0; i < maxNew; i++) {
      const t = sample(logits, options, random);
      out.push(t);
      onToken(t);
      if (i + 1 === maxNew || this.length >= this.block) break;
      logits = await this.step(t);
    }
    return out;
  }
}


// ---- training: forward, backward, clipping and AdamW of examples/gpt.py, on batches of the corpus ----
export function warmupCosine(step, {warmup_iters: warmup, max_iters: max, min_lr_ratio: low}) {
  if (!max) return 1; // a constant learning rate
  if (step < warmup) return (step + 1) / (warmup + 1);
  if (step >= max) return low;
  const progress = (step - warmup) / Math.max(1, max - warmup);
  return low + 0.5 * (1 + Math.cos(Math.PI * progress)) * (1 - low);
}

export class Trainer {
  constructor(program, corpus, seed = 1337) {
    this.program = program;
    this.plan = program.manifest.train;
    this.corpus = corpus;
    this.random = rng(seed);
    this.t = 0; // optimizer steps taken
  }

  // Batch rows start at `offsets` (batch_size of them), or at random places of the corpus.
  batch(offsets) {
    const {batch_size: B, block_size: T} = this.plan;
    const top = this.corpus.length - T - 1;
    offsets ??= Array.from({length: B}, () => Math.floor(this.random() * top));
    const x = new Int32Array(B * T);
    const y = new Int32Array(B * T);
    offsets.forEach((at, b) => {
      x.set(this.corpus.subarray(at, at + T), b * T);
      y.set(this.corpus.subarray(at + 1, at + 1 + T), b * T);
    });
    return {x, y};
  }

  // One step; returns its loss (read back: the page charts every step).
  async step(offsets) {
    const plan = this.plan;
    this.t += 1;
    const factor = warmupCosine(this.t - 1, plan.schedule);
    const {x, y} = this.batch(offsets);
    this.program.write(plan.inputs.x, x);
    this.program.write(plan.inputs.y, y);
    for (const [buffer, g, name] of plan.host) { // AdamW._host_step's values, for step t
      const {lr: base, betas: [b1, b2], weight_decay: wd} = plan.groups[g];
      const lr = base * factor;
      const value = name === 'step_size' ? lr / (1 - b1 ** this.t)
        : name === 'bias2' ? 1 / Math.sqrt(1 - b2 ** this.t) : 1 - lr * wd;
      this.program.write(buffer, new Float32Array([value]));
    }
    this.program.run(plan.copy_out, plan.copy_in);
    return (await this.program.readFloats(plan.loss.buffer, plan.loss.offset, 1))[0];
  }

  // {name: Float32Array} of the parameters as they are now.
  async parameters() {
    const out = {};
    for (const h of this.plan.homes) {
      if (h.kind !== 'param') continue;
      out[h.name] = await this.program.readFloats(h.buffer, 0, h.shape.reduce((a, b) => a * b, 1));
    }
    return out;
  }

  // A checkpoint file as tinyllm.models.pretrained.write_checkpoint writes it (examples/sample.py loads it):
  // the model's state dict, AdamW's moments, the step.
  async checkpoint() {
    const plan = this.plan;
    const tensors = {};
    const homes = new Map(plan.homes.map((h) => [h.buffer, h]));
    for (const [name, home] of Object.entries(plan.checkpoint.state_dict)) {
      if (home === null) {
        const w = this.program.weights[name];
        tensors[`model.${name}`] = {shape: w.shape, data: new Float32Array(w.bytes.slice().buffer)};
      } else {
        const h = homes.get(home);
        tensors[`model.${name}`] = {shape: h.shape, data: await this.program.readFloats(home, 0, count(h.shape))};
      }
    }
    const steps = {};
    for (const h of plan.homes) {
      if (h.kind === 'param') continue;
      tensors[`optim.${h.name}.${h.kind}`] = {shape: h.shape, data: await this.program.readFloats(h.buffer, 0,
        count(h.shape))};
      steps[h.name] = this.t;
    }
    const metadata = {...plan.checkpoint.metadata, step: String(this.t), adam_steps: JSON.stringify(steps)};
    if (metadata.tokenizer === null) delete metadata.tokenizer;
    return writeSafetensors(tensors, metadata);
  }
}

const count = (shape) => shape.reduce((a, b) => a * b, 1);

// ---- loading a site ----
// read(name) -> Promise<ArrayBuffer>; returns {manifest, program, tokenizer, adapter, device}.
export async function loadSite(gpu, read, adapterOptions) {
  const text = (name) => read(name).then((b) => new TextDecoder().decode(b));
  const manifest = JSON.parse(await text('manifest.json'));
  if (manifest.format !== FORMAT) throw new Error(`manifest.json is ${manifest.format}, this driver reads ${FORMAT}`);
  const [kernels, weights, state] = await Promise.all([Promise.all(manifest.kernels.map(text)),
    read(manifest.weights), read(manifest.state)]);
  const {adapter, device} = await openDevice(gpu, manifest.needs, adapterOptions);
  device.addEventListener?.('uncapturederror', (e) => console.error('WebGPU error:', e.error.message));
  const program = new Program(device, manifest, kernels, parseSafetensors(weights).tensors, state);
  await program.check();
  const corpus = manifest.train ? new Int32Array(await read(manifest.train.corpus)) : null;
  return {manifest, program, corpus, tokenizer: makeTokenizer(manifest.tokenizer), adapter, device};
}

// ---- the page ----
async function fetchFile(name) {
  const response = await fetch(name);
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
  return response.arrayBuffer();
}

// Wires index.html's controls. What the page did is kept on `document.body.dataset` (generated, tokensPerS,
// losses) for tests that drive a headless browser.
export async function mountPage(document) {
  const $ = (id) => document.getElementById(id);
  const status = (text, bad) => {
    $('status').textContent = text;
    $('status').className = bad ? 'error' : '';
  };
  const body = document.body;
  let site;
  try {
    site = await loadSite(globalThis.navigator?.gpu, fetchFile);
  } catch (e) {
    status(`cannot run: ${e.message}`, true);
    body.dataset.error = e.message;
    return;
  }
  const {manifest, program, tokenizer, adapter} = site;
  const info = adapter.info || {};
  status(`${manifest.dispatches.length} dispatches of ${manifest.kernels.length} kernels on ` +
    `${[info.vendor, info.architecture, info.description].filter(Boolean).join(' ') || 'WebGPU'}`);
  body.dataset.ready = '1';
  if (manifest.step === 'generate') mountGenerate($, status, body, program, tokenizer);
  else mountTrain($, status, body, program, site.corpus);
}

function mountGenerate($, status, body, program, tokenizer) {
  $('generate').hidden = false;
  const gen = new Generator(program);
  const button = $('run-generate');
  button.disabled = false;
  button.onclick = async () => {
    button.disabled = true;
    try {
      const prompt = tokenizer.encode($('prompt').value);
      const options = {temperature: Number($('temperature').value), topK: Number($('top-k').value),
        topP: Number($('top-p').value), seed: Number($('seed').value)};
      $('output').textContent = $('prompt').value;
      const start = performance.now();
      const piece = tokenizer.stream ? tokenizer.stream() : (t) => tokenizer.decode(t);
      const tokens = await gen.generate(prompt, Number($('max-new').value), options, (t) => {
        $('output').textContent += piece([t]);
      });
      const perS = (prompt.length + tokens.length - 1) / ((performance.now() - start) / 1000);
      status(`${tokens.length} tokens, ${perS.toFixed(1)} steps/s (prompt included)`);
      body.dataset.generated = tokenizer.decode(tokens);
      body.dataset.tokensPerS = perS.toFixed(2);
    } catch (e) {
      status(e.message, true);
      body.dataset.error = e.message;
    }
    button.disabled = false;
  };
}

function drawChart(canvas, losses) {
  const ctx = canvas.getContext('2d');
  const {width: w, height: h} = canvas;
  ctx.clearRect(0, 0, w, h);
  if (losses.length < 2) return;
  const top = Math.max(...losses);
  const low = Math.min(...losses);
  const span = top - low || 1;
  ctx.strokeStyle = '#36c';
  ctx.beginPath();
  losses.forEach((loss, i) => {
    const x = 10 + (i / (losses.length - 1)) * (w - 20);
    const y = 10 + ((top - loss) / span) * (h - 20);
    if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = '#333';
  ctx.fillText(`loss ${top.toFixed(3)}`, 12, 20);
  ctx.fillText(`${low.toFixed(3)}`, 12, h - 12);
}

function mountTrain($, status, body, program, corpus) {
  $('train').hidden = false;
  const trainer = new Trainer(program, corpus);
  const losses = [];
  const button = $('run-train');
  button.disabled = false;
  button.onclick = async () => {
    button.disabled = true;
    try {
      const steps = Number($('steps').value);
      const start = performance.now();
      for (let i = 0; i < steps; i++) {
        losses.push(await trainer.step());
        $('loss').textContent = `step ${trainer.t}: loss ${losses[losses.length - 1].toFixed(4)}`;
        drawChart($('chart'), losses);
      }
      const perS = steps / ((performance.now() - start) / 1000);
      status(`${trainer.t} steps, ${perS.toFixed(2)} steps/s`);
      body.dataset.losses = JSON.stringify(losses);
      body.dataset.stepsPerS = perS.toFixed(3);
      $('download').disabled = false;
    } catch (e) {
      status(e.message, true);
      body.dataset.error = e.message;
    }
    button.disabled = false;
  };
  $('download').onclick = async () => {
    const bytes = await trainer.checkpoint();
    const link = document.createElement('a');
    link.href = URL.createObjectURL(new Blob([bytes], {type: 'application/octet-stream'}));
    link.download = 'ckpt.safetensors'; // examples/sample.py --ckpt-dir reads DIR/ckpt.safetensors
    link.click();
    URL.revokeObjectURL(link.href);
  };
}
