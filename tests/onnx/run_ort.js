// Runs an ONNX model exported by `dtrain export` in onnxruntime (the onnxruntime-node package of
// tests/onnx/package.json, CPU execution provider) over a file of float32 NHWC inputs, in batches
// of varied sizes (the batch dimension is symbolic), and writes the logits and probabilities as
// float32 files. With --bench SECONDS it instead times inference and prints images/s.
//   node run_ort.js MODEL.onnx INPUT.f32 LOGITS.f32 PROBS.f32 [--batch B] [--threads T]
//   node run_ort.js MODEL.onnx INPUT.f32 --bench SECONDS [--batch B] [--threads T]
'use strict';
const fs = require('fs');
const loadOrt = require('./ort.js');

function option(args, name, dflt) {
  const i = args.indexOf(name);
  if (i < 0) return dflt;
  const v = Number(args[i + 1]);
  args.splice(i, 2);
  return v;
}

async function main() {
  const args = process.argv.slice(2);
  const batch = option(args, '--batch', 0), threads = option(args, '--threads', 0);
  const bench = option(args, '--bench', 0);
  const ort = loadOrt();
  const opts = {executionProviders: ['cpu'], graphOptimizationLevel: 'all'};
  if (threads > 0) Object.assign(opts, {intraOpNumThreads: threads, interOpNumThreads: 1});
  const session = await ort.InferenceSession.create(args[0], opts);
  const input = session.inputNames[0];
  const meta = session.inputMetadata ? session.inputMetadata[0] : null;
  const raw = fs.readFileSync(args[1]);
  const x = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
  const shape = JSON.parse(fs.readFileSync(args[1] + '.json', 'utf8')); // [n, h, w, c]
  const [n, h, w, c] = shape, per = h * w * c;
  if (meta && meta.shape && meta.shape.slice(1).join() !== [h, w, c].join())
    throw new Error(`the model's input is ${meta.shape} but the inputs are ${shape}`);
  const run = async (at, m) => {
    const t = new ort.Tensor('float32', x.subarray(at * per, (at + m) * per), [m, h, w, c]);
    return session.run({[input]: t});
  };
  if (bench > 0) return timeIt(run, n, batch || 64, bench);
  // batches of 1, then 7, then `batch` (or the rest): the symbolic batch at work
  const logits = [], probs = [];
  for (let at = 0, k = 0; at < n; k++) {
    const m = Math.min(n - at, k === 0 ? 1 : k === 1 ? 7 : batch || 64);
    const out = await run(at, m);
    logits.push(Buffer.from(out.logits.data.buffer, out.logits.data.byteOffset, out.logits.data.byteLength));
    probs.push(Buffer.from(out.probabilities.data.buffer, out.probabilities.data.byteOffset,
                           out.probabilities.data.byteLength));
    at += m;
  }
  fs.writeFileSync(args[2], Buffer.concat(logits));
  fs.writeFileSync(args[3], Buffer.concat(probs));
}

// images/s over the inputs in batches, repeated for about `seconds` after one warm-up pass
async function timeIt(run, n, batch, seconds) {
  const pass = async () => { for (let at = 0; at < n; at += batch) await run(at, Math.min(batch, n - at)); };
  await pass();
  let images = 0;
  const t0 = process.hrtime.bigint();
  let secs = 0;
  while (secs < seconds) {
    await pass();
    images += n;
    secs = Number(process.hrtime.bigint() - t0) / 1e9;
  }
  console.log(`onnxruntime ${(images / secs).toFixed(1)} images/s (${images} images in ${secs.toFixed(2)} s)`);
}

main().catch((e) => { console.error(`run_ort.js: ${e.message}`); process.exit(1); });
