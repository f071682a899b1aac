#!/usr/bin/python3
"""peer_ort.py — ONNX Runtime as a peer: builds two ONNX models from the
weights and inputs bench_mha dumped (--dump DIR) with python3-onnx, and
times them in onnxruntime-node (bench/ort/run_ort.js) on the same threads:

- layer: MatMul projections (Q from x; K, V from kv or x), the Q/K/V bias
  as com.microsoft.MultiHeadAttention's bias input, MultiHeadAttention
  (num_heads = h, unidirectional = 1 when causal), MatMul + Add for O.
  Checked against libmha's output (y.f32) before timing.
- attention: MultiHeadAttention alone on Q, K, V projected here in numpy
  (float64, rounded to float32), checked against softmax(Q K^T/sqrt(d_k)) V
  computed here in float64.

Prints RESULT lines (kind=prefill / attn_only, impl=ort) for report.py.
    peer_ort.py --dir DIR --name P1 --B 4 --T 512 [--S 2048] --d 768 --h 12
                [--causal] --threads 2 --reps 5 --budget 15
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def load(d, name, shape):
    return np.fromfile(os.path.join(d, name + ".f32"), dtype="<f4").reshape(shape)


def mha_node(inputs, out, h, causal):
    return helper.make_node("MultiHeadAttention", inputs, [out], domain="com.microsoft",
                            num_heads=h, unidirectional=1 if causal else 0)


def save(graph, path):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.save(model, path)


def layer_model(a, w, path):
    """x (B,T,d) [kv (B,S,d)] -> y (B,T,d)."""
    d = a.d
    S = a.S or a.T
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [a.B, a.T, d])]
    src = "x"
    if a.S:
        ins.append(helper.make_tensor_value_info("kv", TensorProto.FLOAT, [a.B, S, d]))
        src = "kv"
    inits = [numpy_helper.from_array(w[k], k) for k in ("w_q", "w_k", "w_v", "w_o", "b_o")]
    inits.append(numpy_helper.from_array(np.concatenate([w["b_q"], w["b_k"], w["b_v"]]), "b_qkv"))
    nodes = [helper.make_node("MatMul", ["x", "w_q"], ["q"]),
             helper.make_node("MatMul", [src, "w_k"], ["k"]),
             helper.make_node("MatMul", [src, "w_v"], ["v"]),
             mha_node(["q", "k", "v", "b_qkv"], "z", a.h, a.causal),
             helper.make_node("MatMul", ["z", "w_o"], ["zo"]),
             helper.make_node("Add", ["zo", "b_o"], ["y"])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [a.B, a.T, d])]
    save(helper.make_graph(nodes, "mha_layer", ins, out, inits), path)


def attn_model(a, path):
    """q (B,T,d), k, v (B,S,d) -> z (B,T,d)."""
    S = a.S or a.T
    ins = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [a.B, a.T, a.d]),
           helper.make_tensor_value_info("k", TensorProto.FLOAT, [a.B, S, a.d]),
           helper.make_tensor_value_info("v", TensorProto.FLOAT, [a.B, S, a.d])]
    out = [helper.make_tensor_value_info("z", TensorProto.FLOAT, [a.B, a.T, a.d])]
    save(helper.make_graph([mha_node(["q", "k", "v"], "z", a.h, a.causal)], "mha_attention", ins, out), path)


def attention64(q, k, v, h, causal):
    """softmax(q k^T / sqrt(d_k)) v per head in float64; q (B,T,d), k, v (B,S,d)."""
    B, T, d = q.shape
    S, dk = k.shape[1], d // h
    z = np.empty((B, T, d))
    for b in range(B):
        for r in range(h):
            sl = slice(r * dk, (r + 1) * dk)
            s = q[b, :, sl] @ k[b, :, sl].T / np.sqrt(dk)
            if causal:
                s[np.triu_indices(T, 1, S)] = -np.inf
            s = np.exp(s - s.max(axis=1, keepdims=True))
            z[b, :, sl] = (s / s.sum(axis=1, keepdims=True)) @ v[b, :, sl]
    return z


def run_node(spec, path):
    with open(path, "w") as f:
        json.dump(spec, f)
    r = subprocess.run(["node", os.path.join(HERE, "ort", "run_ort.js"), path],
                       capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
    return r.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", required=True)
    for k in ("B", "T", "d", "h", "threads", "reps"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--S", type=int, default=0)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--budget", type=float, default=15)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(HERE, "ort", "node_modules", "onnxruntime-node")):
        print(f'RESULT kind=prefill impl=ort name={a.name} error="onnxruntime-node is not installed '
              f'(scripts/setup.sh test installs it into bench/ort/node_modules)"')
        return 1
    d, S = a.d, a.S or a.T
    w = {k: load(a.dir, k, (d, d)) for k in ("w_q", "w_k", "w_v", "w_o")}
    w.update({k: load(a.dir, k, (d,)) for k in ("b_q", "b_k", "b_v", "b_o")})
    x = load(a.dir, "x", (a.B, a.T, d))
    kv = load(a.dir, "kv", (a.B, S, d)) if a.S else x
    shape = (f"B={a.B} T={a.T} S={S} d_model={d} h={a.h} causal={int(a.causal)} "
             f"cross={int(bool(a.S))} threads={a.threads}")
    common = {"threads": a.threads, "reps": a.reps, "budget": a.budget}

    # the layer, checked against libmha's y
    layer_path = os.path.join(a.dir, "layer.onnx")
    layer_model(a, w, layer_path)
    inputs = [{"name": "x", "file": os.path.join(a.dir, "x.f32"), "dims": [a.B, a.T, d]}]
    if a.S:
        inputs.append({"name": "kv", "file": os.path.join(a.dir, "kv.f32"), "dims": [a.B, S, d]})
    rc = run_node(dict(common, model=layer_path, inputs=inputs,
                       expect={"file": os.path.join(a.dir, "y.f32"), "tol": 1e-3},
                       result=f"RESULT kind=prefill impl=ort name={a.name} {shape}"),
                  os.path.join(a.dir, "layer.json"))

    # attention alone, on projections computed here
    x64, kv64 = x.astype(np.float64), kv.astype(np.float64)
    q = x64 @ w["w_q"] + w["b_q"]
    k = kv64 @ w["w_k"] + w["b_k"]
    v = kv64 @ w["w_v"] + w["b_v"]
    files = {}
    for n_, t in (("q", q), ("k", k), ("v", v)):
        files[n_] = os.path.join(a.dir, f"attn_{n_}.f32")
        t.astype("<f4").tofile(files[n_])
    qf, kf, vf = (np.fromfile(files[n_], dtype="<f4").reshape(t.shape).astype(np.float64)
                  for n_, t in (("q", q), ("k", k), ("v", v)))
    z = attention64(qf, kf, vf, a.h, a.causal)
    z.astype("<f4").tofile(os.path.join(a.dir, "attn_z.f32"))
    attn_path = os.path.join(a.dir, "attention.onnx")
    attn_model(a, attn_path)
    inputs = [{"name": "q", "file": files["q"], "dims": [a.B, a.T, d]},
              {"name": "k", "file": files["k"], "dims": [a.B, S, d]},
              {"name": "v", "file": files["v"], "dims": [a.B, S, d]}]
    rc |= run_node(dict(common, model=attn_path, inputs=inputs,
                        expect={"file": os.path.join(a.dir, "attn_z.f32"), "tol": 1e-4},
                        result=f"RESULT kind=attn_only impl=ort name={a.name} {shape}"),
                   os.path.join(a.dir, "attention.json"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
