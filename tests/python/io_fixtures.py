"""Fixtures for tests/io_cli_test.sh: random checkpoints in every layout,
built from one set of (in, out) weights with numpy and written with the
independent safetensors writer in io_helpers.py; corrupted checkpoints;
bad files; and an allclose check.

    python3 io_fixtures.py make DIR        write every fixture into DIR
    python3 io_fixtures.py close A.npy B.npy [TOL]   exit 1 unless allclose
    python3 io_fixtures.py is_png FILE
"""
import json
import struct
import sys

import numpy as np

from io_helpers import write_safetensors

RNG = np.random.RandomState(1234)


def rand(*shape, amp=0.5):
    return (RNG.uniform(-amp, amp, size=shape)).astype(np.float32)


def weights(d_model, h, h_kv, d):
    """Native (in, out) weights; d_k = d_v = d."""
    return {
        "w_q": rand(d_model, h * d), "w_k": rand(d_model, h_kv * d),
        "w_v": rand(d_model, h_kv * d), "w_o": rand(h * d, d_model),
        "b_q": rand(h * d), "b_k": rand(h_kv * d), "b_v": rand(h_kv * d), "b_o": rand(d_model),
    }


def native_meta(h, h_kv, d):
    lab = lambda n: ",".join(str(i) for i in range(n))
    return {"n_heads": h, "n_kv_heads": h_kv, "d_k": d, "d_v": d,
            "labels_q": lab(h), "labels_k": lab(h_kv), "labels_v": lab(h_kv), "labels_o": lab(h)}


def hf(w):
    return {"model.layers.0.self_attn.q_proj.weight": w["w_q"].T,
            "model.layers.0.self_attn.k_proj.weight": w["w_k"].T,
            "model.layers.0.self_attn.v_proj.weight": w["w_v"].T,
            "model.layers.0.self_attn.o_proj.weight": w["w_o"].T,
            "model.layers.0.self_attn.q_proj.bias": w["b_q"],
            "model.layers.0.self_attn.k_proj.bias": w["b_k"],
            "model.layers.0.self_attn.v_proj.bias": w["b_v"],
            "model.layers.0.self_attn.o_proj.bias": w["b_o"]}


def gpt2(w):
    return {"h.0.attn.c_attn.weight": np.concatenate([w["w_q"], w["w_k"], w["w_v"]], axis=1),
            "h.0.attn.c_attn.bias": np.concatenate([w["b_q"], w["b_k"], w["b_v"]]),
            "h.0.attn.c_proj.weight": w["w_o"], "h.0.attn.c_proj.bias": w["b_o"]}


def megatron(w, h, h_kv, d):
    """Fused (out, in) rows per kv group g: q heads of g, k_g, v_g."""
    rep = h // h_kv
    q, k, v = w["w_q"].T, w["w_k"].T, w["w_v"].T
    rows, bias = [], []
    for g in range(h_kv):
        rows += [q[g * rep * d:(g + 1) * rep * d], k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
        bias += [w["b_q"][g * rep * d:(g + 1) * rep * d], w["b_k"][g * d:(g + 1) * d],
                 w["b_v"][g * d:(g + 1) * d]]
    return {"layers.0.self_attention.query_key_value.weight": np.concatenate(rows),
            "layers.0.self_attention.query_key_value.bias": np.concatenate(bias),
            "layers.0.self_attention.dense.weight": w["w_o"].T,
            "layers.0.self_attention.dense.bias": w["b_o"]}


def wrong_megatron_reader(fused, fused_b, h, h_kv, d):
    """A broken converter: it splits the fused rows correctly per group but
    assumes query head r belongs to kv group r % h_kv (the repeat-vs-
    repeat_interleave mistake), so it writes the q heads of group g at
    positions g, g + h_kv, ... Returns native (in, out) w_q, b_q."""
    rep = h // h_kv
    wq = np.zeros((fused.shape[1], h * d), np.float32)
    bq = np.zeros(h * d, np.float32)
    for g in range(h_kv):
        base = g * (rep + 2) * d
        for j in range(rep):
            src = slice(base + j * d, base + (j + 1) * d)
            pos = g + j * h_kv
            wq[:, pos * d:(pos + 1) * d] = fused[src].T
            bq[pos * d:(pos + 1) * d] = fused_b[src]
    return wq, bq


def raw_safetensors(path, header_json, data):
    h = header_json.encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def make(d):
    D, h, h_kv, dh, B, T = 16, 4, 2, 4, 2, 6
    w = weights(D, h, h_kv, dh)
    write_safetensors(d + "/native.safetensors", w, native_meta(h, h_kv, dh))
    write_safetensors(d + "/hf.safetensors", hf(w))
    # hf with W_O's row blocks 0 and 1 swapped (o_proj's column blocks)
    bad_o = dict(w, w_o=w["w_o"].reshape(h, dh, D)[[1, 0, 2, 3]].reshape(h * dh, D))
    write_safetensors(d + "/hf_bad_o.safetensors", hf(bad_o))
    # gpt-oss-style sink logits beside the hf names, good and with W_O's blocks swapped
    sinks = {"model.layers.0.self_attn.sinks": np.array([1.5, -1.0, 0.5, 2.0], np.float32)}
    write_safetensors(d + "/hf_sinks.safetensors", dict(hf(w), **sinks))
    write_safetensors(d + "/hf_sinks_bad_o.safetensors", dict(hf(bad_o), **sinks))
    fused = hf(w)  # Phi-3: q, k, v rows stacked in one qkv_proj
    P = "model.layers.0.self_attn."
    fused[P + "qkv_proj.weight"] = np.concatenate([fused.pop(P + n + "_proj.weight") for n in "qkv"])
    fused[P + "qkv_proj.bias"] = np.concatenate([fused.pop(P + n + "_proj.bias") for n in "qkv"])
    write_safetensors(d + "/phi3.safetensors", fused)
    # OPT / BART / Whisper / GPT-J name the output projection out_proj
    write_safetensors(d + "/opt.safetensors", {k.replace("o_proj", "out_proj"): v for k, v in hf(w).items()})
    mg = megatron(w, h, h_kv, dh)
    write_safetensors(d + "/megatron.safetensors", mg)
    wm = weights(D, h, h, dh)  # GPT-2 has no GQA
    write_safetensors(d + "/mha_native.safetensors", wm, native_meta(h, h, dh))
    write_safetensors(d + "/gpt2.safetensors", gpt2(wm))
    # a whole GPT-2 model's names: blocks h.0 (other weights) and h.1 (wm),
    # each with an MLP whose c_proj.weight also ends in "c_proj.weight"
    model = {"wte.weight": rand(50, D), "wpe.weight": rand(T, D)}
    for b, wb in enumerate([weights(D, h, h, dh), wm]):
        model.update({k.replace("h.0.", f"h.{b}."): v for k, v in gpt2(wb).items()})
        model[f"h.{b}.attn.bias"] = np.tril(np.ones((1, 1, T, T), np.float32))  # GPT-2's causal buffer
        model[f"h.{b}.mlp.c_fc.weight"], model[f"h.{b}.mlp.c_proj.weight"] = rand(D, 4 * D), rand(4 * D, D)
    write_safetensors(d + "/gpt2_model.safetensors", model)
    # the same model sharded as Hugging Face saves large ones: block 1's
    # attention split between the two shards, an index naming each
    # tensor's shard
    names = list(model)
    cut = names.index("h.1.attn.c_proj.weight")
    shard = {"gpt2-00001-of-00002.safetensors": names[:cut], "gpt2-00002-of-00002.safetensors": names[cut:]}
    for f, ns in shard.items():
        write_safetensors(d + "/" + f, {n: model[n] for n in ns}, {"format": "pt"})
    with open(d + "/gpt2.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": {n: f for f, ns in shard.items() for n in ns}}, f)
    # the weights as numpy arrays, for tests/mha_oracle.py (never read by libmha)
    np.savez(d + "/weights_gqa.npz", **w)
    np.savez(d + "/weights_mha.npz", **wm)
    x = RNG.randn(B, T, D).astype(np.float32)
    np.save(d + "/x.npy", x)
    np.save(d + "/x2d.npy", x[0])
    np.save(d + "/x_f16.npy", x.astype(np.float16))
    np.save(d + "/kv.npy", RNG.randn(B, T + 2, D).astype(np.float32))
    # PyTorch-meaning masks
    causal = np.triu(np.ones((T, T), bool), 1)  # True above the diagonal: not allowed
    np.save(d + "/causal_bool.npy", causal)
    np.save(d + "/causal_float.npy", np.where(causal, -np.inf, 0).astype(np.float32))
    kpm = np.zeros((B, T), bool)
    kpm[1, -2:] = True
    np.save(d + "/kpm.npy", kpm)
    # the wrong fused-layout conversion (GQA groups scrambled)
    fused = mg["layers.0.self_attention.query_key_value.weight"]
    fused_b = mg["layers.0.self_attention.query_key_value.bias"]
    wq, bq = wrong_megatron_reader(fused, fused_b, h, h_kv, dh)
    bad = dict(w)
    bad["w_q"], bad["b_q"] = wq, bq
    write_safetensors(d + "/wrong_fused.safetensors", bad, native_meta(h, h_kv, dh))
    # not a permutation: W_O slightly rescaled
    scaled = dict(w)
    scaled["w_o"] = (w["w_o"] * 1.1).astype(np.float32)
    write_safetensors(d + "/scaled.safetensors", scaled, native_meta(h, h_kv, dh))
    # ALiBi slopes of heads 0 and 1 swapped alone: labels_s disagrees with labels_q
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    write_safetensors(d + "/alibi.safetensors", dict(w, alibi_slopes=slopes),
                      dict(native_meta(h, h_kv, dh), alibi="1", labels_s="0,1,2,3"))
    write_safetensors(d + "/alibi_s.safetensors", dict(w, alibi_slopes=slopes[[1, 0, 2, 3]]),
                      dict(native_meta(h, h_kv, dh), alibi="1", labels_s="1,0,2,3"))
    # twin: query heads 0 and 1 identical (one kv group), so Z^(0) = Z^(1)
    twin = dict(w)
    twin["w_q"], twin["b_q"] = w["w_q"].copy(), w["b_q"].copy()
    twin["w_q"][:, dh:2 * dh], twin["b_q"][dh:2 * dh] = w["w_q"][:, :dh], w["b_q"][:dh]
    write_safetensors(d + "/twin.safetensors", twin, native_meta(h, h_kv, dh))
    # silent: head 3's W_O rows are zero, so it contributes nothing
    silent = dict(w)
    silent["w_o"] = w["w_o"].copy()
    silent["w_o"][3 * dh:] = 0
    write_safetensors(d + "/silent.safetensors", silent, native_meta(h, h_kv, dh))
    # bad files
    good = open(d + "/native.safetensors", "rb").read()
    open(d + "/truncated.safetensors", "wb").write(good[:len(good) - 10])
    open(d + "/hugeheader.safetensors", "wb").write(struct.pack("<Q", 1 << 40) + good[8:])
    raw_safetensors(d + "/overlap.safetensors",
                    '{"w_q":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                    '"w_k":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12))
    raw_safetensors(d + "/dup.safetensors",
                    '{"w_q":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                    '"w_q":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8))
    raw_safetensors(d + "/i32.safetensors",
                    '{"w_q":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}', bytes(4))
    bad_shape = dict(w)
    bad_shape["w_o"] = rand(h * dh, D - 1)
    write_safetensors(d + "/badshape.safetensors", bad_shape, native_meta(h, h_kv, dh))
    both = dict(w)
    both.update(hf(w))
    write_safetensors(d + "/ambiguous.safetensors", both, native_meta(h, h_kv, dh))
    nan_x = x.copy()
    nan_x[1, 2, 3] = np.nan
    np.save(d + "/x_nan.npy", nan_x)
    np.save(d + "/x_f64.npy", x.astype(np.float64))
    np.save(d + "/x_wide.npy", RNG.randn(T, D + 1).astype(np.float32))
    np.save(d + "/x_fortran.npy", np.asfortranarray(x[0]))
    np.save(d + "/mask_badshape.npy", np.zeros((T, T + 1), bool))
    nan_w = dict(w)
    nan_w["w_v"] = w["w_v"].copy()
    nan_w["w_v"][0, 1] = np.inf
    write_safetensors(d + "/inf_weight.safetensors", nan_w, native_meta(h, h_kv, dh))
    # int8 weights without their scales (a bitsandbytes-style hf file): not
    # weights of their raw integers
    i8 = hf(w)
    q = "model.layers.0.self_attn.q_proj.weight"
    i8[q] = np.clip(np.round(i8[q] * 127), -127, 127).astype(np.int8)
    write_safetensors(d + "/hf_int8.safetensors", i8)
    # a native int8 file (weights_dtype int8, scales (groups, N): one group
    # of 32 inputs, W_O's restarting at each head's rows), valid; then with
    # one code -128, outside the symmetric [-127, 127] the scales are for
    i8n = dict(w)
    for m, groups in (("w_q", 1), ("w_k", 1), ("w_v", 1), ("w_o", h)):
        i8n[m] = np.clip(np.round(w[m] * 127), -127, 127).astype(np.int8)
        i8n[m + "_scale"] = np.full((groups, w[m].shape[1]), 1 / 127, np.float32)
    i8_meta = {**native_meta(h, h_kv, dh), "weights_dtype": "int8", "int8_scales": "per_32_inputs"}
    write_safetensors(d + "/native_int8.safetensors", i8n, i8_meta)
    i8n["w_k"] = i8n["w_k"].copy()
    i8n["w_k"][0, 0] = -128
    write_safetensors(d + "/int8_code_128.safetensors", i8n, i8_meta)
    # metadata n_heads "0" (a bad value, not a missing one); a uint8 w_q
    write_safetensors(d + "/nheads_0.safetensors", w, dict(native_meta(h, h_kv, dh), n_heads="0"))
    for key in ("n_kv_heads", "d_k", "d_v"):  # sizes as well: "0" was read as absent
        write_safetensors(d + f"/{key}_0.safetensors", w, {**native_meta(h, h_kv, dh), key: "0"})
    for name, v in (("space", " 4"), ("plus", "+4")):  # strtol would take both
        write_safetensors(d + f"/nheads_{name}.safetensors", w, dict(native_meta(h, h_kv, dh), n_heads=v))
    u8 = dict(w)
    u8["w_q"] = np.zeros(w["w_q"].shape, np.uint8)
    write_safetensors(d + "/u8_wq.safetensors", u8, native_meta(h, h_kv, dh))
    # B * h = 1048577 * 4096 wraps a 32-bit int to 4096: a (4096, 1, 1)
    # attn_mask must still be refused
    wide = {"w_q": rand(1, 4096), "w_k": rand(1, 4096), "w_v": rand(1, 4096), "w_o": rand(4096, 1)}
    write_safetensors(d + "/wide_heads.safetensors", wide, {"n_heads": "4096"})
    np.save(d + "/x_wide_batch.npy", np.zeros((1048577, 1, 1), np.float32))
    np.save(d + "/mask_wrap.npy", np.zeros((4096, 1, 1), bool))
    np.save(d + "/dy_bad.npy", np.zeros((B, T, D - 1), np.float32))


def main():
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2])
    elif cmd == "close":
        a, b = np.load(sys.argv[2]), np.load(sys.argv[3])
        tol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5
        if a.shape != b.shape or not np.allclose(a, b, atol=tol, rtol=0):
            diff = np.abs(a - b).max() if a.shape == b.shape else "shape %s vs %s" % (a.shape, b.shape)
            print("not close: %s" % diff)
            sys.exit(1)
    elif cmd == "is_png":
        with open(sys.argv[2], "rb") as f:
            sys.exit(0 if f.read(8) == b"\x89PNG\r\n\x1a\n" else 1)
    elif cmd == "meta":
        with open(sys.argv[2], "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            print(json.loads(f.read(n)).get("__metadata__", {}).get(sys.argv[3], ""))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
