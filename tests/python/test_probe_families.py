"""Probe of Hugging Face families whose attention the loaders had not been
checked against: each checkpoint is written under the names its family
saves (module prefix, tensor names, config.json keys) and run by `mha run`
with no flag but --prefix and --causal (and --heads where the family's
layout has no head count the CLI reads), against a float64 numpy oracle
written from the family's modeling code. Each family either gives its
numbers or is refused with a message naming what is not supported."""
import json

import numpy as np
import pytest

from io_helpers import mha, write_safetensors
from test_probe_hf_layouts import rotate  # RoPE at positions 0..T-1, halves or interleaved

T = 7


def rnd(rs, *shape):
    return (rs.randn(*shape) / np.sqrt(shape[-1])).astype(np.float32)


def heads(a, n):
    return a.reshape(a.shape[0], n, -1).transpose(1, 0, 2)


def layer_norm(a, w, eps):
    """LayerNorm over the last dim without bias (w broadcasts per head)"""
    m = a.mean(-1, keepdims=True)
    return (a - m) / np.sqrt(((a - m) ** 2).mean(-1, keepdims=True) + eps) * w


def attention(q, k, v, wo, bo=0.0, scale=None, window=None, slopes=None):
    """causal softmax attention of (h, T, d) heads; GQA by repeating k, v;
    scale (default 1/sqrt(d)), a sliding window of `window` keys, ALiBi"""
    k, v = np.repeat(k, q.shape[0] // k.shape[0], 0), np.repeat(v, q.shape[0] // v.shape[0], 0)
    s = q @ k.transpose(0, 2, 1) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    i, j = np.arange(T)[:, None], np.arange(T)[None]
    if slopes is not None:
        s = s - slopes[:, None, None] * (i - j)
    s = np.where((j > i) | (j <= i - (window or T + 1)), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    z = (p / p.sum(-1, keepdims=True)) @ v
    return z.transpose(1, 0, 2).reshape(T, -1) @ wo.T + bo


def save(tmp_path, tensors, config, D):
    write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps(config))
    x = np.random.RandomState(9).randn(T, D).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return x.astype(np.float64)


def run(tmp_path, tensors, config, prefix, D, *flags, check=True):
    """(x, Y) of `mha run`, or (x, the CompletedProcess) when check is False"""
    x = save(tmp_path, tensors, config, D)
    (tmp_path / "y.npy").unlink(missing_ok=True)
    r = mha("run", "--weights", tmp_path, "--prefix", prefix, "--input", tmp_path / "x.npy",
            "--output", tmp_path / "y.npy", "--causal", *flags, check=check)
    return x, np.load(tmp_path / "y.npy") if check else r


def refused(r, tmp_path, *words):
    assert r.returncode != 0 and not (tmp_path / "y.npy").exists(), r.stdout + r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def close(y, want):
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-5 * np.abs(want).max())


# ------------------------------------------------------------------ Phi


def phi(rs, D, H, qk_layernorm=False):
    p = "model.layers.0.self_attn."
    w = {n: rnd(rs, D, D) for n in ("q_proj", "k_proj", "v_proj", "dense")}
    b = {n: rnd(rs, 1, D)[0] for n in w}
    t = {p + n + ".weight": w[n] for n in w}
    t.update({p + n + ".bias": b[n] for n in b})
    if qk_layernorm:  # nn.LayerNorm(head_dim): weight and bias
        for n in ("q_layernorm", "k_layernorm"):
            t[p + n + ".weight"], t[p + n + ".bias"] = rnd(rs, 1, D // H)[0] + 1, rnd(rs, 1, D // H)[0]
    return w, b, t


def test_phi2_dense_bias_partial_rotary(tmp_path):
    """Phi-1.5 / Phi-2 (model_type phi): q/k/v_proj and `dense`, all with
    bias; rotate_half on partial_rotary_factor x head_dim dims (0.4 of 10)."""
    D, H = 40, 4
    w, b, t = phi(np.random.RandomState(0), D, H)
    cfg = {"model_type": "phi", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H,
           "partial_rotary_factor": 0.4, "rope_theta": 10000.0, "qk_layernorm": False, "layer_norm_eps": 1e-5}
    q, k, v = (heads(save(tmp_path, t, cfg, D) @ w[n].T + b[n], H) for n in ("q_proj", "k_proj", "v_proj"))
    want = attention(rotate(q, 4, 1e4, "halves"), rotate(k, 4, 1e4, "halves"), v, w["dense"], b["dense"])
    close(run(tmp_path, t, cfg, "model.layers.0", D)[1], want)
    del cfg["rope_theta"]  # PhiConfig's default 10000: the family rotates without the key
    close(run(tmp_path, t, cfg, "model.layers.0", D)[1], want)


def test_phi_qk_layernorm_with_bias_is_refused(tmp_path):
    D, H = 40, 4
    _, _, t = phi(np.random.RandomState(1), D, H, qk_layernorm=True)
    cfg = {"model_type": "phi", "hidden_size": D, "num_attention_heads": H, "partial_rotary_factor": 0.4,
           "rope_theta": 10000.0, "qk_layernorm": True}
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "q_layernorm", "bias")


# ------------------------------------------------- per-head q/k LayerNorm


def llama_like(rs, D, H, G, bias=False, p="model.layers.0.self_attn."):
    w = {n: rnd(rs, D * (G if n in ("k_proj", "v_proj") else H) // H, D) for n in ("q_proj", "k_proj", "v_proj")}
    w["o_proj"] = rnd(rs, D, D)
    b = {n: (rnd(rs, 1, w[n].shape[0])[0] if bias and n != "o_proj" else 0.0) for n in w}
    t = {p + n + ".weight": w[n] for n in w}
    t.update({p + n + ".bias": b[n] for n in w if bias and n != "o_proj"})
    return w, b, t


def test_cohere_use_qk_norm_is_a_per_head_layer_norm(tmp_path):
    """Cohere with use_qk_norm: CohereLayerNorm over each head's d dims with
    a (h, d) weight (k: (h_kv, d)), no bias, eps layer_norm_eps, before the
    interleaved rotary of the whole head."""
    D, H, G, eps = 32, 4, 2, 0.1
    rs = np.random.RandomState(2)
    w, _, t = llama_like(rs, D, H, G)
    p = "model.layers.0.self_attn."
    qn, kn = rnd(rs, H, D // H) + 1, rnd(rs, G, D // H) + 1
    t[p + "q_norm.weight"], t[p + "k_norm.weight"] = qn, kn
    cfg = {"model_type": "cohere", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e4, "use_qk_norm": True, "layer_norm_eps": eps}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q = rotate(layer_norm(heads(x @ w["q_proj"].T, H), qn[:, None], eps), 8, 1e4, "interleaved")
    k = rotate(layer_norm(heads(x @ w["k_proj"].T, G), kn[:, None], eps), 8, 1e4, "interleaved")
    close(y, attention(q, k, heads(x @ w["v_proj"].T, G), w["o_proj"]))
    del t[p + "q_norm.weight"], t[p + "k_norm.weight"]  # use_qk_norm without the norms: refused
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "use_qk_norm")


def stablelm(rs, D, H, G, prefix="model.layers.0.self_attn."):
    w, b, t = llama_like(rs, D, H, G, bias=True, p=prefix)
    qn, kn = rnd(rs, H, D // H) + 1, rnd(rs, G, D // H) + 1
    for i in range(H):
        t[prefix + f"q_layernorm.norms.{i}.weight"] = qn[i]
    for i in range(G):
        t[prefix + f"k_layernorm.norms.{i}.weight"] = kn[i]
    return w, b, t, qn, kn


def stablelm_oracle(x, w, b, qn, kn, H, G, r, eps):
    q = rotate(layer_norm(heads(x @ w["q_proj"].T + b["q_proj"], H), qn[:, None], eps), r, 1e4, "halves")
    k = rotate(layer_norm(heads(x @ w["k_proj"].T + b["k_proj"], G), kn[:, None], eps), r, 1e4, "halves")
    return attention(q, k, heads(x @ w["v_proj"].T + b["v_proj"], G), w["o_proj"])


def test_stablelm2_qk_layernorm_per_head(tmp_path):
    """StableLM 2 (12B) with qk_layernorm: one nn.LayerNorm(head_dim,
    bias=False) per head (q_layernorm.norms.N.weight), eps layer_norm_eps,
    before rotate_half on partial_rotary_factor 0.25 of the head, q/k/v
    biases (use_qkv_bias)."""
    D, H, G, eps = 64, 4, 2, 0.1
    w, b, t, qn, kn = stablelm(np.random.RandomState(3), D, H, G)
    cfg = {"model_type": "stablelm", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "partial_rotary_factor": 0.25, "rope_theta": 10000, "qk_layernorm": True, "use_qkv_bias": True,
           "layer_norm_eps": eps}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    close(y, stablelm_oracle(x, w, b, qn, kn, H, G, 4, eps))


def test_persimmon_qk_layernorm_with_bias_is_refused(tmp_path):
    """Persimmon: query_key_value (per head q, k, v rows) + dense, and q/k
    nn.LayerNorm(head_dim) with bias: refused, not run without them."""
    D, H = 32, 4
    rs = np.random.RandomState(4)
    p = "model.layers.0.self_attn."
    t = {p + "query_key_value.weight": rnd(rs, 3 * D, D), p + "query_key_value.bias": rnd(rs, 1, 3 * D)[0],
         p + "dense.weight": rnd(rs, D, D), p + "dense.bias": rnd(rs, 1, D)[0]}
    for n in ("q_layernorm", "k_layernorm"):
        t[p + n + ".weight"], t[p + n + ".bias"] = rnd(rs, 1, D // H)[0] + 1, rnd(rs, 1, D // H)[0]
    cfg = {"model_type": "persimmon", "hidden_size": D, "num_attention_heads": H, "rope_theta": 25000.0,
           "partial_rotary_factor": 0.5, "qk_layernorm": True, "layer_norm_eps": 1e-5}
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "q_layernorm", "bias")


# ------------------------------------------------------------- GPT-Neo


@pytest.mark.parametrize("layer", [0, 1])
def test_gpt_neo_unscaled_scores_and_local_layers(tmp_path, layer):
    """GPT-Neo: no 1/sqrt(d) on the scores; num_heads; attention_types
    [[["global", "local"], N]]: odd layers see window_size keys."""
    D, H, W = 32, 4, 3
    rs = np.random.RandomState(5)
    t, ws = {}, []
    for n in range(2):
        p = f"transformer.h.{n}.attn.attention."
        w = {m: rnd(rs, D, D) for m in ("q_proj", "k_proj", "v_proj", "out_proj")}
        t.update({p + m + ".weight": w[m] for m in w})
        t[p + "out_proj.bias"] = bo = rnd(rs, 1, D)[0]
        ws.append((w, bo))
    cfg = {"model_type": "gpt_neo", "hidden_size": D, "num_heads": H, "num_layers": 2, "window_size": W,
           "attention_types": [[["global", "local"], 1]], "attention_layers": ["global", "local"]}
    x, y = run(tmp_path, t, cfg, f"transformer.h.{layer}", D)
    w, bo = ws[layer]
    q, k, v = (heads(x @ w[m].T, H) for m in ("q_proj", "k_proj", "v_proj"))
    close(y, attention(q, k, v, w["out_proj"], bo, scale=1.0, window=W if layer == 1 else None))


# ------------------------------------------------- fused c_attn, gpt2 names


def test_qwen1_c_attn_blocks_not_read_as_gpt_bigcode(tmp_path):
    """Qwen (v1, model_type qwen): c_attn is nn.Linear (3E, E) holding
    [q; k; v] blocks, GPT-BigCode's per-head rows in shape; with its
    config.json it is refused (or would give Qwen's numbers), never run
    with the rows misread."""
    D, H = 32, 4
    rs = np.random.RandomState(6)
    p = "transformer.h.0.attn."
    wq, wk, wv, wo = (rnd(rs, D, D) for _ in range(4))
    t = {p + "c_attn.weight": np.concatenate([wq, wk, wv]), p + "c_attn.bias": np.zeros(3 * D, np.float32),
         p + "c_proj.weight": wo}
    cfg = {"model_type": "qwen", "hidden_size": D, "num_attention_heads": H, "kv_channels": D // H,
           "rotary_emb_base": 10000, "rotary_pct": 1.0, "seq_length": 64}
    x, r = run(tmp_path, t, cfg, "transformer.h.0", D, "--heads", H, check=False)
    if r.returncode == 0:
        q, k = (rotate(heads(x @ a.T, H), 8, 1e4, "halves") for a in (wq, wk))
        close(np.load(tmp_path / "y.npy"), attention(q, k, heads(x @ wv.T, H), wo))
    else:
        refused(r, tmp_path, "qwen")


@pytest.mark.parametrize("scaled", [True, False])
def test_jais_alibi_and_scale_by_d(tmp_path, scaled):
    """Jais: GPT-2's Conv1D c_attn / c_proj (with biases), ALiBi
    (position_embedding_type alibi) and, with mup_scale_qk_dot_by_d, the
    scores divided by d instead of sqrt(d) (not at all with
    scale_attn_weights false)."""
    D, H = 32, 4
    rs = np.random.RandomState(7)
    p = "transformer.h.0.attn."
    ca, ba, cp, bp = rnd(rs, D, 3 * D), rnd(rs, 1, 3 * D)[0], rnd(rs, D, D), rnd(rs, 1, D)[0]
    t = {p + "c_attn.weight": ca, p + "c_attn.bias": ba, p + "c_proj.weight": cp, p + "c_proj.bias": bp}
    cfg = {"model_type": "jais", "n_embd": D, "n_head": H, "position_embedding_type": "alibi",
           "mup_scale_qk_dot_by_d": True, "scale_attn_weights": scaled}
    x, r = run(tmp_path, t, cfg, "transformer.h.0", D, "--heads", H, check=False)
    assert r.returncode == 0, r.stderr
    qkv = x @ ca + ba
    q, k, v = (heads(qkv[:, i * D:(i + 1) * D], H) for i in range(3))
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    close(np.load(tmp_path / "y.npy"), attention(q, k, v, cp.T, bp, scale=1.0 / (D // H) if scaled else 1.0,
                                                 slopes=slopes))


# ChatGLM 2/3's query_key_value blocks (refused here before): test_families_more.py


# ------------------------------------------------------- what already fits


def test_starcoder2_bias_gqa_sliding_window(tmp_path):
    """Starcoder 2: q/k/v/o_proj with biases (use_bias), GQA, rotate_half
    with rope_theta, sliding_window on every layer."""
    D, H, G, W = 32, 4, 2, 3
    w, b, t = llama_like(np.random.RandomState(9), D, H, G, bias=True)
    p = "model.layers.0.self_attn."
    t[p + "o_proj.bias"] = bo = rnd(np.random.RandomState(10), 1, D)[0]
    cfg = {"model_type": "starcoder2", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e5, "sliding_window": W, "use_bias": True}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q = rotate(heads(x @ w["q_proj"].T + b["q_proj"], H), 8, 1e5, "halves")
    k = rotate(heads(x @ w["k_proj"].T + b["k_proj"], G), 8, 1e5, "halves")
    close(y, attention(q, k, heads(x @ w["v_proj"].T + b["v_proj"], G), w["o_proj"], bo, window=W))


@pytest.mark.parametrize("bias", [False, True])
def test_internlm2_wqkv_rows_per_kv_group(tmp_path, bias):
    """InternLM2: wqkv's rows per kv group g are [the q heads of g, k_g,
    v_g] (its rearrange "(h gs d)", gs = 2 + h / h_kv), megatron's; wo; no
    rope_theta key means Hugging Face's 10000, rotate_half."""
    D, H, G = 32, 4, 2
    rs = np.random.RandomState(14)
    d, rep = D // H, H // G
    wq, wk, wv, wo = rnd(rs, D, D), rnd(rs, G * d, D), rnd(rs, G * d, D), rnd(rs, D, D)
    bq, bk, bv = (rnd(rs, 1, n)[0] * bias for n in (D, G * d, G * d))
    rows = np.concatenate([np.concatenate([wq[g * rep * d:(g + 1) * rep * d], wk[g * d:(g + 1) * d],
                                           wv[g * d:(g + 1) * d]]) for g in range(G)])
    brows = np.concatenate([np.concatenate([bq[g * rep * d:(g + 1) * rep * d], bk[g * d:(g + 1) * d],
                                            bv[g * d:(g + 1) * d]]) for g in range(G)])
    p = "model.layers.1.attention."
    t = {p + "wqkv.weight": rows, p + "wo.weight": wo}
    if bias:
        t[p + "wqkv.bias"], t[p + "wo.bias"] = brows, np.zeros(D, np.float32)
    cfg = {"model_type": "internlm2", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "bias": bias}
    x, y = run(tmp_path, t, cfg, "model.layers.1", D)
    q, k = rotate(heads(x @ wq.T + bq, H), d, 1e4, "halves"), rotate(heads(x @ wk.T + bk, G), d, 1e4, "halves")
    close(y, attention(q, k, heads(x @ wv.T + bv, G), wo))


# --------------------------------------------- layouts no reader takes


def fused(rs, D, H, G):
    """[every q head; every k head; every v head] rows (out, in): Phi-3's
    qkv_proj, Baichuan's W_pack, MPT's and DBRX's Wqkv"""
    d = D // H
    wq, wk, wv, wo = rnd(rs, D, D), rnd(rs, G * d, D), rnd(rs, G * d, D), rnd(rs, D, D)
    return (wq, wk, wv, wo), np.concatenate([wq, wk, wv])


@pytest.mark.parametrize("scale", [None, 0.2])
def test_mpt_wqkv_alibi_softmax_scale(tmp_path, scale):
    """MPT: Wqkv [q; k; v] and out_proj (no_bias), ALiBi from
    attn_config (alibi_bias_max 8: the paper's slopes), softmax_scale;
    qk_ln and another alibi_bias_max refused; attn_config.clip_qkv clamps
    q, k, v as OLMo's does (half the projections' largest value here)."""
    D, H = 32, 4
    (wq, wk, wv, wo), qkv = fused(np.random.RandomState(15), D, H, H)
    p = "transformer.blocks.0.attn."
    t = {p + "Wqkv.weight": qkv, p + "out_proj.weight": wo}
    ac = {"alibi": True, "alibi_bias_max": 8, "qk_ln": False, "clip_qkv": None, "softmax_scale": scale,
          "attn_type": "multihead_attention"}
    cfg = {"model_type": "mpt", "d_model": D, "n_heads": H, "no_bias": True, "attn_config": ac}
    x, y = run(tmp_path, t, cfg, "transformer.blocks.0", D)
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    close(y, attention(*(heads(x @ w.T, H) for w in (wq, wk, wv)), wo, scale=scale, slopes=slopes))
    for bad, word in (({"qk_ln": True}, "qk_ln"), ({"alibi_bias_max": 16}, "alibi_bias_max"),
                      ({"clip_qkv": 0}, "clip_qkv")):
        _, r = run(tmp_path, t, dict(cfg, attn_config=dict(ac, **bad)), "transformer.blocks.0", D, check=False)
        refused(r, tmp_path, word)
    c = 0.5 * max(np.abs(x @ w.T).max() for w in (wq, wk, wv))
    _, y = run(tmp_path, t, dict(cfg, attn_config=dict(ac, clip_qkv=c)), "transformer.blocks.0", D)
    clamped = (heads(np.clip(x @ w.T, -c, c), H) for w in (wq, wk, wv))
    close(y, attention(*clamped, wo, scale=scale, slopes=slopes))


def test_dbrx_wqkv_gqa_rope_theta_in_attn_config(tmp_path):
    """DBRX: Wqkv [q; k; v] with attn_config.kv_n_heads kv heads, out_proj,
    rotate_half with attn_config.rope_theta; its clip_qkv (8 in DBRX's
    configs) clamps q, k, v before the rotation."""
    D, H, G = 32, 4, 2
    (wq, wk, wv, wo), qkv = fused(np.random.RandomState(16), D, H, G)
    p = "transformer.blocks.0.norm_attn_norm.attn."
    t = {p + "Wqkv.weight": qkv, p + "out_proj.weight": wo}
    ac = {"kv_n_heads": G, "rope_theta": 5e5, "clip_qkv": None}
    cfg = {"model_type": "dbrx", "d_model": D, "n_heads": H, "attn_config": ac}
    x, y = run(tmp_path, t, cfg, "transformer.blocks.0", D)
    q, k = rotate(heads(x @ wq.T, H), 8, 5e5, "halves"), rotate(heads(x @ wk.T, G), 8, 5e5, "halves")
    close(y, attention(q, k, heads(x @ wv.T, G), wo))
    c = 0.5 * max(np.abs(x @ w.T).max() for w in (wq, wk, wv))
    _, y = run(tmp_path, t, dict(cfg, attn_config=dict(ac, clip_qkv=c)), "transformer.blocks.0", D)
    q, k = (rotate(heads(np.clip(x @ w.T, -c, c), n), 8, 5e5, "halves") for w, n in ((wq, H), (wk, G)))
    close(y, attention(q, k, heads(np.clip(x @ wv.T, -c, c), G), wo))


def test_baichuan_w_pack_needs_the_position_encoding_named(tmp_path):
    """Baichuan: W_pack [q; k; v], o_proj; config.json does not say whether
    the layer rotates (7B) or uses ALiBi (13B): refused without --rope or
    --alibi, then each as that model computes it."""
    D, H = 32, 4
    (wq, wk, wv, wo), qkv = fused(np.random.RandomState(17), D, H, H)
    p = "model.layers.0.self_attn."
    t = {p + "W_pack.weight": qkv, p + "o_proj.weight": wo}
    cfg = {"model_type": "baichuan", "hidden_size": D, "num_attention_heads": H}
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "baichuan", "--alibi")
    x, y = run(tmp_path, t, cfg, "model.layers.0", D, "--rope", "halves")
    q, k = (rotate(heads(x @ w.T, H), 8, 1e4, "halves") for w in (wq, wk))
    close(y, attention(q, k, heads(x @ wv.T, H), wo))
    x, y = run(tmp_path, t, cfg, "model.layers.0", D, "--alibi")
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    close(y, attention(*(heads(x @ w.T, H) for w in (wq, wk, wv)), wo, slopes=slopes))


def test_phi_msft_mixer_wqkv_rotary_dim(tmp_path):
    """Phi-2 as first published (model_type phi-msft): mixer.Wqkv [q; k; v]
    and mixer.out_proj with biases, rotate_half on rotary_dim dims."""
    D, H = 40, 4
    rs = np.random.RandomState(18)
    (wq, wk, wv, wo), qkv = fused(rs, D, H, H)
    bqkv, bo = rnd(rs, 1, 3 * D)[0], rnd(rs, 1, D)[0]
    p = "transformer.h.0.mixer."
    t = {p + "Wqkv.weight": qkv, p + "Wqkv.bias": bqkv, p + "out_proj.weight": wo, p + "out_proj.bias": bo}
    cfg = {"model_type": "phi-msft", "n_embd": D, "n_head": H, "rotary_dim": 4}
    x, y = run(tmp_path, t, cfg, "transformer.h.0", D)
    q, k, v = (heads(x @ w.T + bqkv[i * D:(i + 1) * D], H) for i, w in enumerate((wq, wk, wv)))
    close(y, attention(rotate(q, 4, 1e4, "halves"), rotate(k, 4, 1e4, "halves"), v, wo, bo))


# CodeGen's qkv_proj blocks (refused here before): test_families_more.py


def test_library_load_reads_the_per_head_layer_norms(tmp_path):
    """mha.Layer.load without config.json (no rotary, which only the config
    gives): StableLM's norms.N and Cohere's (h, d) q_norm.weight are a
    LayerNorm of each head with their families' default eps 1e-5, not
    dropped (StableLM) nor read as OLMo 2's RMSNorm over the whole width
    (Cohere); the head-parallel shard of mha-mpi reads the same."""
    import mha as lib
    D, H, G = 64, 4, 2
    rs = np.random.RandomState(12)
    w, b, t, qn, kn = stablelm(rs, D, H, G)
    for n in ("q_proj", "k_proj"):  # small q and k: the eps (1e-5, not the library's 1e-6) matters
        p = "model.layers.0.self_attn." + n
        w[n], b[n] = w[n] * 0.003, b[n] * 0.003
        t[p + ".weight"], t[p + ".bias"] = w[n], b[n]
    write_safetensors(tmp_path / "slm.safetensors", t)
    x = np.random.RandomState(13).randn(1, T, D).astype(np.float32)
    L = lib.Layer.load(tmp_path / "slm.safetensors", n_heads=H)
    assert L.config["qk_norm"] == "layer" and L.config["qk_norm_per_head"] == 1
    want = stablelm_oracle(x[0].astype(np.float64), w, b, qn, kn, H, G, 0, 1e-5)
    close(L.forward(x, causal=True)[0], want)
    p = "model.layers.0.self_attn."
    w, _, t = llama_like(rs, D, H, G)
    qn, kn = rnd(rs, H, D // H) + 1, rnd(rs, G, D // H) + 1
    t[p + "q_norm.weight"], t[p + "k_norm.weight"] = qn, kn
    write_safetensors(tmp_path / "cohere.safetensors", t)
    L = lib.Layer.load(tmp_path / "cohere.safetensors", n_heads=H)
    assert L.config["qk_norm"] == "layer" and not L.config["qk_norm_whole"], L.config
    xd = x[0].astype(np.float64)
    q, k = layer_norm(heads(xd @ w["q_proj"].T, H), qn[:, None], 1e-5), layer_norm(heads(xd @ w["k_proj"].T, G), kn[:, None], 1e-5)
    close(L.forward(x, causal=True)[0], attention(q, k, heads(xd @ w["v_proj"].T, G), w["o_proj"]))
