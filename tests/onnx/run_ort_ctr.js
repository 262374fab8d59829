// Runs a click-log model exported by `dtrain export` in onnxruntime (tests/onnx/package.json's
// onnxruntime-node, CPU) over the inputs scripts/ctr_features.py feeds wrote (DIR/feeds.json and a
// raw file per input), in batches of 1, then 7, then 64 examples (the batch dimension is symbolic),
// and writes the probabilities as float32.
//   node run_ort_ctr.js MODEL.onnx DIR PROBS.f32
'use strict';
const fs = require('fs');
const path = require('path');
const loadOrt = require('./ort.js');

async function main() {
  const [model, dir, out] = process.argv.slice(2);
  const ort = loadOrt();
  const session = await ort.InferenceSession.create(model, {executionProviders: ['cpu'], intraOpNumThreads: 2,
                                                              interOpNumThreads: 1});
  const feeds = JSON.parse(fs.readFileSync(path.join(dir, 'feeds.json'), 'utf8')).map((f) => {
    const raw = fs.readFileSync(path.join(dir, f.file));
    const buf = raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength);
    const data = f.type === 'int64' ? new BigInt64Array(buf) : new Float32Array(buf);
    return {...f, data, per: f.shape.slice(1).reduce((a, b) => a * b, 1)};
  });
  const names = feeds.map((f) => f.name).sort().join();
  if (names !== [...session.inputNames].sort().join())
    throw new Error(`the model's inputs are ${session.inputNames} but the feeds are ${names}`);
  const n = feeds[0].shape[0], probs = [];
  for (let at = 0, k = 0; at < n; k++) {
    const m = Math.min(n - at, k === 0 ? 1 : k === 1 ? 7 : 64);
    const run = {};
    for (const f of feeds)
      run[f.name] = new ort.Tensor(f.type, f.data.subarray(at * f.per, (at + m) * f.per), [m, ...f.shape.slice(1)]);
    const r = await session.run(run);
    const p = r.probabilities;
    if (p.dims.join() !== [m, 1].join()) throw new Error(`probabilities are ${p.dims}, not [${m}, 1]`);
    probs.push(Buffer.from(p.data.buffer, p.data.byteOffset, p.data.byteLength));
    at += m;
  }
  fs.writeFileSync(out, Buffer.concat(probs));
}

main().catch((e) => { console.error(`run_ort_ctr.js: ${e.message}`); process.exit(1); });
