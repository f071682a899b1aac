// run_ort.js — times one ONNX model in ONNX Runtime (onnxruntime-node, CPU)
// after checking its output against the expected one; prints RESULT lines
// for bench/report.py. Run by bench/peer_ort.py, which builds the model.
//
//   node bench/ort/run_ort.js SPEC.json
// SPEC: {model, inputs: [{name, file, dims}], expect: {file, tol},
//        threads, reps, budget, result: "RESULT kind=... (prefix)"}
// Files are raw little-endian float32.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

function readF32(file) {
  const b = fs.readFileSync(file);
  return new Float32Array(b.buffer, b.byteOffset, b.length / 4);
}

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const session = await ort.InferenceSession.create(spec.model, {
    intraOpNumThreads: spec.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  });
  const feeds = {};
  for (const inp of spec.inputs) feeds[inp.name] = new ort.Tensor('float32', readF32(inp.file), inp.dims);
  // The check, on the warm-up run: max |ort - expected| against tol.
  const out = await session.run(feeds);
  const got = out[session.outputNames[0]].data;
  const want = readF32(spec.expect.file);
  let err = got.length === want.length ? 0 : Infinity, scale = 0;
  for (let i = 0; i < want.length && err !== Infinity; i++) {
    const d = Math.abs(got[i] - want[i]);
    if (!(d <= err)) err = Number.isNaN(d) ? Infinity : d;
    scale = Math.max(scale, Math.abs(want[i]));
  }
  const ok = err <= spec.expect.tol;
  let line = `${spec.result} ort_version=${ort.env.versions.common} check_max_err=${err.toExponential(3)}` +
             ` check_scale=${scale.toExponential(3)} check_ok=${ok ? 1 : 0}`;
  if (!ok) {
    console.log(`${line} error="ORT output differs from the expected output by ${err} (tolerance ${spec.expect.tol})"`);
    process.exit(1);
  }
  const times = [];
  const t_end = process.hrtime.bigint() + BigInt(Math.round(spec.budget * 1e9));
  while (times.length < spec.reps && (times.length === 0 || process.hrtime.bigint() < t_end)) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - t0) * 1e-9);
  }
  const s = [...times].sort((a, b) => a - b), n = s.length;
  const median = n % 2 ? s[(n - 1) / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  line += ` median_s=${median.toFixed(6)} min_s=${s[0].toFixed(6)} runs=${n} times_s=${times.map(t => t.toFixed(6)).join(',')}`;
  console.log(line);
}

main().catch(e => {
  console.log(`RESULT kind=error impl=ort error="${String(e.message || e).replace(/["\n]/g, "'")}"`);
  process.exit(1);
});
