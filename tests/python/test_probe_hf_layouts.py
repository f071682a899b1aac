"""Checkpoints saved the way Hugging Face architectures save them, with the
config.json they ship, run by `mha run` with no flag but --prefix and
--causal, against numpy written from each architecture's modeling code:
what model_type implies (GPT-J's interleaved rotary_dim, GPT-NeoX's
rotary_pct in a megatron-layout file, Falcon's multi_query without
rope_theta, BLOOM's ALiBi, a Llama config without rope_theta) and the
q/k RMSNorm's eps (rms_norm_eps) and Gemma 3's (1 + weight); OLMo 1's,
DBRX's and MPT's clip_qkv."""
import json

import numpy as np
import pytest

from io_helpers import mha, write_safetensors

T, D, H = 6, 32, 4


def rnd(rs, *shape):
    return (rs.randn(*shape) / np.sqrt(shape[-1])).astype(np.float32)


def heads(a, n):
    return a.reshape(a.shape[0], n, -1).transpose(1, 0, 2)


def rotate(x, r, theta, pairing, factor=1.0):
    """RoPE of positions 0..T-1 on the first r dims: rotate_half (halves)
    or GPT-J's rotate_every_two (interleaved); linear scaling by factor."""
    f = np.outer(np.arange(x.shape[1]) / factor, 1.0 / theta ** (np.arange(0, r, 2) / r))
    a, rest = x[..., :r], x[..., r:]
    if pairing == "halves":
        c, s = np.cos(np.concatenate([f, f], -1)), np.sin(np.concatenate([f, f], -1))
        rot = np.concatenate([-a[..., r // 2:], a[..., :r // 2]], -1)
    else:
        c, s = np.repeat(np.cos(f), 2, -1), np.repeat(np.sin(f), 2, -1)
        rot = np.stack([-a[..., 1::2], a[..., 0::2]], -1).reshape(a.shape)
    return np.concatenate([a * c + rot * s, rest], -1)


def attention(q, k, v, wo, bo=0.0, slopes=None):
    """causal softmax attention of (h, T, d) heads, k/v repeated for GQA"""
    k, v = np.repeat(k, q.shape[0] // k.shape[0], 0), np.repeat(v, q.shape[0] // v.shape[0], 0)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    i, j = np.arange(T)[:, None], np.arange(T)[None]
    if slopes is not None:
        s = s - slopes[:, None, None] * (i - j)
    s = np.where(j > i, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    z = (p / p.sum(-1, keepdims=True)) @ v
    return z.transpose(1, 0, 2).reshape(T, -1) @ wo.T + bo


def run(tmp_path, tensors, config, prefix, *flags):
    write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps(config))
    x = np.random.RandomState(9).randn(T, D).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mha("run", "--weights", tmp_path, "--prefix", prefix, "--input", tmp_path / "x.npy",
        "--output", tmp_path / "y.npy", "--causal", *flags)
    return x.astype(np.float64), np.load(tmp_path / "y.npy")


def per_head_rows(q, k, v, n):
    """fused rows [q_h; k_h; v_h] per head (GPT-NeoX, BLOOM)"""
    return np.concatenate([np.concatenate([a.reshape(n, -1, *a.shape[1:])[h] for a in (q, k, v)]) for h in range(n)])


def test_gptj_config_rotary_dim_is_interleaved(tmp_path):
    rs = np.random.RandomState(0)
    wq, wk, wv, wo = (rnd(rs, D, D) for _ in range(4))
    p = "transformer.h.0.attn."
    t = {p + "q_proj.weight": wq, p + "k_proj.weight": wk, p + "v_proj.weight": wv, p + "out_proj.weight": wo}
    cfg = {"model_type": "gptj", "n_embd": D, "n_head": H, "rotary_dim": 4, "n_positions": 64}
    x, y = run(tmp_path, t, cfg, "transformer.h.0", "--heads", H)  # the flag a user passes: no rotary before
    q, k = (rotate(heads(x @ w.T, H), 4, 10000.0, "interleaved") for w in (wq, wk))
    np.testing.assert_allclose(y, attention(q, k, heads(x @ wv.T, H), wo), atol=2e-5)


def test_gpt_neox_config_rotary_pct_in_megatron_layout(tmp_path):
    rs = np.random.RandomState(1)
    wq, wk, wv, wo = (rnd(rs, D, D) for _ in range(4))
    bq, bk, bv, bo = (rnd(rs, 1, D)[0] for _ in range(4))
    p = "gpt_neox.layers.0.attention."
    t = {p + "query_key_value.weight": per_head_rows(wq, wk, wv, H),
         p + "query_key_value.bias": per_head_rows(bq, bk, bv, H), p + "dense.weight": wo, p + "dense.bias": bo}
    cfg = {"model_type": "gpt_neox", "hidden_size": D, "num_attention_heads": H, "rotary_pct": 0.25,
           "rotary_emb_base": 10000}
    x, y = run(tmp_path, t, cfg, "gpt_neox.layers.0", "--heads", H)
    q, k = (rotate(heads(x @ w.T + b, H), 2, 10000.0, "halves") for w, b in ((wq, bq), (wk, bk)))
    np.testing.assert_allclose(y, attention(q, k, heads(x @ wv.T + bv, H), wo, bo), atol=2e-5)


@pytest.mark.parametrize("model_type", ["falcon", "RefinedWebModel"])  # the latter: Falcon's first configs
def test_falcon_multi_query_config_without_rope_theta(tmp_path, model_type):
    rs = np.random.RandomState(2)
    wq, wk, wv, wo = rnd(rs, D, D), rnd(rs, D // H, D), rnd(rs, D // H, D), rnd(rs, D, D)
    p = "transformer.h.0.self_attention."
    t = {p + "query_key_value.weight": np.concatenate([wq, wk, wv]), p + "dense.weight": wo}
    cfg = {"model_type": model_type, "hidden_size": D, "n_head": H, "multi_query": True, "alibi": False,
           "new_decoder_architecture": False, "bias": False}
    x, y = run(tmp_path, t, cfg, "transformer.h.0")
    q, k = rotate(heads(x @ wq.T, H), 8, 1e4, "halves"), rotate(heads(x @ wk.T, 1), 8, 1e4, "halves")
    np.testing.assert_allclose(y, attention(q, k, heads(x @ wv.T, 1), wo), atol=2e-5)


def test_bloom_config_means_alibi(tmp_path):
    rs = np.random.RandomState(3)
    wq, wk, wv, wo = (rnd(rs, D, D) for _ in range(4))
    p = "h.0.self_attention."
    t = {p + "query_key_value.weight": per_head_rows(wq, wk, wv, H), p + "dense.weight": wo}
    x, y = run(tmp_path, t, {"model_type": "bloom", "hidden_size": D, "n_head": H}, "h.0", "--heads", H)
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    want = attention(heads(x @ wq.T, H), heads(x @ wk.T, H), heads(x @ wv.T, H), wo, slopes=slopes)
    np.testing.assert_allclose(y, want, atol=2e-5)


def llama(rs, norm=None, kv=H):
    p = "model.layers.0.self_attn."
    w = {n: rnd(rs, D * (kv if n in "kv" else H) // H, D) for n in ("q", "k", "v")}
    w["o"] = rnd(rs, D, D)
    t = {p + n + "_proj.weight": w[n] for n in w}
    if norm is not None:
        t[p + "q_norm.weight"], t[p + "k_norm.weight"] = norm
    return w, t


def test_llama_config_without_rope_theta_rotates(tmp_path):
    """Older Llama configs have no rope_theta: Hugging Face's default 10000."""
    w, t = llama(np.random.RandomState(4))
    x, y = run(tmp_path, t, {"model_type": "llama", "hidden_size": D, "num_attention_heads": H}, "model.layers.0")
    q, k = (rotate(heads(x @ w[n].T, H), 8, 1e4, "halves") for n in "qk")
    np.testing.assert_allclose(y, attention(q, k, heads(x @ w["v"].T, H), w["o"]), atol=2e-5)


def rms(a, w, eps):
    return a / np.sqrt((a * a).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("model_type,offset,eps", [("qwen3", 1.0, 1e-1), ("gemma3_text", 0.0, 1e-6)])
def test_qk_norm_eps_and_gemma3_one_plus_weight(tmp_path, model_type, offset, eps):
    """Qwen 3 normalizes with config.json's rms_norm_eps; Gemma 3's stored
    norm weights are offsets from 1 (Gemma3RMSNorm: x_normed * (1 + w))."""
    rs = np.random.RandomState(5)
    qn, kn = (rs.randn(D // H).astype(np.float32) * 0.3 for _ in range(2))
    w, t = llama(rs, (qn + offset, kn + offset))
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "head_dim": D // H,
           "rope_theta": 1e4, "rms_norm_eps": eps, "query_pre_attn_scalar": D // H, "sliding_window": None}
    x, y = run(tmp_path, t, cfg, "model.layers.0")
    q, k = (rotate(rms(heads(x @ w[n].T, H), 1 + g, eps), 8, 1e4, "halves") for n, g in (("q", qn), ("k", kn)))
    np.testing.assert_allclose(y, attention(q, k, heads(x @ w["v"].T, H), w["o"]), atol=2e-5)


def windowed(q, k, v, wo, window):
    """attention() with Hugging Face's sliding window: query i sees keys
    i - window + 1 .. i"""
    s = q @ np.repeat(k, q.shape[0] // k.shape[0], 0).transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    i, j = np.arange(T)[:, None], np.arange(T)[None]
    s = np.where((j > i) | (j <= i - window), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    z = (p / p.sum(-1, keepdims=True)) @ np.repeat(v, q.shape[0] // v.shape[0], 0)
    return z.transpose(1, 0, 2).reshape(T, -1) @ wo.T


def two_layers(rs, norm=None, kv=H):
    w0, t = llama(rs, norm, kv)
    w1, t1 = llama(rs, norm, kv)
    t.update({k.replace("layers.0", "layers.1"): a for k, a in t1.items()})
    return (w0, w1), t


@pytest.mark.parametrize("layer", [0, 1])
def test_sliding_window_per_layer_from_config(tmp_path, layer):
    """Gemma 2 slides on even layers; Gemma 3 on all but every
    sliding_window_pattern-th, with rope_local_base_freq and no
    rope_scaling there; Mistral on all; gpt-oss by layer_types."""
    rs = np.random.RandomState(6)
    zero = np.zeros(D // H, np.float32)
    ws, t = two_layers(rs, (zero, zero))
    # (query_pre_attn_scalar = head_dim and no soft-cap: else their config classes' 256 and 50)
    cases = [({"model_type": "gemma2", "query_pre_attn_scalar": D // H, "attn_logit_softcapping": None}, layer == 0,
              1e4, 1),
             ({"model_type": "gemma3_text", "sliding_window_pattern": 2, "rope_theta": 1e6, "query_pre_attn_scalar": D // H,
               "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
              layer == 0, 1e4 if layer == 0 else 1e6, 1 if layer == 0 else 8),
             ({"model_type": "mistral"}, True, 1e4, 1),
             ({"model_type": "gpt_oss", "layer_types": ["sliding_attention", "full_attention"]}, layer == 0, 1e4, 1)]
    for extra, slides, theta, factor in cases:
        cfg = {"hidden_size": D, "num_attention_heads": H, "head_dim": D // H, "rope_theta": 1e4, "sliding_window": 2}
        cfg.update(extra)
        # Gemma 3's q/k norm: zero offsets, so 1 + 0; the others have none
        tt = t if extra["model_type"] == "gemma3_text" else {k: a for k, a in t.items() if "_norm" not in k}
        x, y = run(tmp_path, tt, cfg, f"model.layers.{layer}")
        w = ws[layer]
        q, k = (heads(x @ w[n].T, H) for n in "qk")
        if extra["model_type"] == "gemma3_text":
            q, k = rms(q, 1.0, 1e-6), rms(k, 1.0, 1e-6)
        q, k = (rotate(a, 8, theta, "halves", factor) for a in (q, k))
        want = windowed(q, k, heads(x @ w["v"].T, H), w["o"], 2 if slides else T)
        np.testing.assert_allclose(y, want, atol=2e-5, err_msg=str(extra))


def test_sliding_layers_without_a_layer_number_are_refused(tmp_path):
    _, t = llama(np.random.RandomState(7))
    write_safetensors(tmp_path / "model.safetensors", t)
    cfg = {"model_type": "gemma2", "hidden_size": D, "num_attention_heads": H, "head_dim": D // H, "rope_theta": 1e4,
           "sliding_window": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    np.save(tmp_path / "x.npy", np.zeros((T, D), np.float32))
    r = mha("run", "--weights", tmp_path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--causal",
            check=False)
    assert r.returncode != 0 and "sliding_window" in r.stderr and "--prefix" in r.stderr, r.stderr
    assert not (tmp_path / "y.npy").exists()


def test_gptj_fp16_masked_bias_buffer_is_not_a_weight(tmp_path):
    """Older GPT-J / GPT-NeoX checkpoints store the buffers attn.bias (the
    causal mask, bool) and attn.masked_bias (-1e9: -inf in fp16) inside the
    attention module; the layer loads, and a NaN in a weight is still refused."""
    rs = np.random.RandomState(8)
    wq, wk, wv, wo = (rnd(rs, D, D).astype(np.float16) for _ in range(4))
    p = "transformer.h.0.attn."
    t = {p + "bias": np.tril(np.ones((1, 1, 8, 8), bool)), p + "masked_bias": np.array(-np.inf, np.float16),
         p + "q_proj.weight": wq, p + "k_proj.weight": wk, p + "v_proj.weight": wv, p + "out_proj.weight": wo}
    cfg = {"model_type": "gptj", "n_embd": D, "n_head": H, "rotary_dim": 4}
    x, y = run(tmp_path, t, cfg, "transformer.h.0")
    q, k = (rotate(heads(x @ w.T.astype(np.float64), H), 4, 10000.0, "interleaved") for w in (wq, wk))
    np.testing.assert_allclose(y, attention(q, k, heads(x @ wv.T.astype(np.float64), H), wo.astype(np.float64)),
                               atol=2e-5)
    t[p + "q_proj.weight"] = wq.copy()
    t[p + "q_proj.weight"][1, 2] = np.nan
    write_safetensors(tmp_path / "model.safetensors", t)
    r = mha("run", "--weights", tmp_path, "--prefix", "transformer.h.0", "--input", tmp_path / "x.npy",
            "--output", tmp_path / "nan.npy", check=False)
    assert r.returncode != 0 and "transformer.h.0.attn.q_proj.weight[34] = nan" in r.stderr, r.stderr


@pytest.mark.parametrize("layer", [0, 1])
def test_gemma3_multimodal_text_config(tmp_path, layer):
    """Gemma 3 4B+ (and LLaVA, Mistral 3) nest the language model's settings
    in text_config; its layers are language_model.model.layers.N."""
    rs = np.random.RandomState(10)
    qn, kn = (rs.randn(D // H).astype(np.float32) * 0.3 for _ in range(2))
    ws, t = two_layers(rs, (qn, kn), kv=2)
    t = {"language_model." + k: a for k, a in t.items()}
    t["vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight"] = rnd(rs, 48, 48)
    text = {"model_type": "gemma3_text", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": 2,
            "head_dim": D // H, "query_pre_attn_scalar": 2, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
            "sliding_window": 2, "sliding_window_pattern": 2, "rms_norm_eps": 1e-6}
    cfg = {"model_type": "gemma3", "text_config": text,
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 48, "num_attention_heads": 6}}
    x, y = run(tmp_path, t, cfg, f"language_model.model.layers.{layer}")
    w, theta = ws[layer], (1e4, 1e6)[layer]
    q = rotate(rms(heads(x @ w["q"].T, H), 1 + qn, 1e-6), 8, theta, "halves")
    k = rotate(rms(heads(x @ w["k"].T, 2), 1 + kn, 1e-6), 8, theta, "halves")
    want = windowed(q * np.sqrt(8 / 2), k, heads(x @ w["v"].T, 2), w["o"], (2, T)[layer])
    np.testing.assert_allclose(y, want, atol=2e-5)


def test_head_count_of_another_models_config_names_config_json(tmp_path):
    """A BERT-base config.json (12 heads) beside a 32-wide Llama layer: the
    refusal says the 12 came from config.json, not from the user."""
    _, t = llama(np.random.RandomState(11))
    write_safetensors(tmp_path / "model.safetensors", t)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768,
                                                      "num_attention_heads": 12}))
    np.save(tmp_path / "x.npy", np.zeros((T, D), np.float32))
    np.save(tmp_path / "y.npy", np.ones(1, np.float32))
    r = mha("run", "--weights", tmp_path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", check=False)
    assert r.returncode == 1 and "heads of 12" in r.stderr and "12 heads from the config.json" in r.stderr, r.stderr
    assert np.load(tmp_path / "y.npy").tolist() == [1.0]
    # a malformed tensor beside a right config.json is the tensor's fault: no word of config.json
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": D,
                                                      "num_attention_heads": H}))
    t["model.layers.0.self_attn.o_proj.weight"] = np.zeros((16, 2 * D), np.float32)
    write_safetensors(tmp_path / "model.safetensors", t)
    r = mha("run", "--weights", tmp_path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", check=False)
    assert r.returncode == 1 and "has shape (16, 64)" in r.stderr and "config.json" not in r.stderr, r.stderr


def test_no_rope_layers(tmp_path):
    """SmolLM 3's no_rope_layers: a 0 entry is a layer without rotary
    (NoPE) despite rope_theta."""
    rs = np.random.RandomState(12)
    ws, t = two_layers(rs)
    t = {k: a for k, a in t.items() if "_norm" not in k}
    cfg = {"model_type": "smollm3", "hidden_size": D, "num_attention_heads": H, "rope_theta": 1e4,
           "no_rope_layers": [1, 0]}
    for layer in (0, 1):
        x, y = run(tmp_path, t, cfg, f"model.layers.{layer}")
        q, k = (heads(x @ ws[layer][n].T, H) for n in "qk")
        if layer == 0:
            q, k = rotate(q, 8, 1e4, "halves"), rotate(k, 8, 1e4, "halves")
        np.testing.assert_allclose(y, attention(q, k, heads(x @ ws[layer]["v"].T, H), ws[layer]["o"]), atol=2e-5)


def test_clip_qkv_olmo_top_level_and_mpt_dbrx_attn_config(tmp_path):
    """OLMo 1's clip_qkv (top level) and DBRX's / MPT's attn_config.clip_qkv:
    q, k, v = (x W^T).clamp(-c, c) before RoPE (modeling_olmo, modeling_dbrx);
    about half the projections are clamped here. --clip-qkv overrides the
    file; a bound that is not > 0 is refused naming the key."""
    rs = np.random.RandomState(14)
    w, t = llama(rs)
    c = 0.5
    x, y = run(tmp_path, t, {"model_type": "olmo", "hidden_size": D, "num_attention_heads": H, "rope_theta": 1e4,
                             "clip_qkv": c}, "model.layers.0")
    q, k, v = (np.clip(heads(x @ w[n].T, H), -c, c) for n in "qkv")
    assert 0.3 < np.mean(np.abs(heads(x @ w["q"].T, H)) > c) < 0.8
    want = attention(rotate(q, 8, 1e4, "halves"), rotate(k, 8, 1e4, "halves"), v, w["o"])
    np.testing.assert_allclose(y, want, atol=2e-5)
    unclamped = attention(*(rotate(heads(x @ w[n].T, H), 8, 1e4, "halves") for n in "qk"), heads(x @ w["v"].T, H),
                          w["o"])
    assert np.abs(want - unclamped).max() > 1e-2
    # mha convert writes it into the native file, which runs without config.json
    mha("convert", "--from", "hf", "--prefix", "model.layers.0", "--to", "native", tmp_path / "model.safetensors",
        tmp_path / "olmo.safetensors")
    mha("run", "--weights", tmp_path / "olmo.safetensors", "--input", tmp_path / "x.npy", "--output",
        tmp_path / "y_native.npy", "--causal")
    np.testing.assert_allclose(np.load(tmp_path / "y_native.npy"), want, atol=2e-5)
    # DBRX / MPT keep it in attn_config (no rotary here: the file gives no theta)
    x, y = run(tmp_path, t, {"model_type": "mpt", "d_model": D, "n_heads": H, "attn_config": {"clip_qkv": c}},
               "model.layers.0")
    q, k, v = (np.clip(heads(x @ w[n].T, H), -c, c) for n in "qkv")
    np.testing.assert_allclose(y, attention(q, k, v, w["o"]), atol=2e-5)
    # the flag wins over the file
    x, y = run(tmp_path, t, {"model_type": "mpt", "d_model": D, "n_heads": H, "attn_config": {"clip_qkv": c}},
               "model.layers.0", "--clip-qkv", 0.25)
    q, k, v = (np.clip(heads(x @ w[n].T, H), -0.25, 0.25) for n in "qkv")
    np.testing.assert_allclose(y, attention(q, k, v, w["o"]), atol=2e-5)
    for cfg, key in (({"clip_qkv": 0}, "clip_qkv is out of range"),
                     ({"model_type": "mpt", "attn_config": {"clip_qkv": -1.0}}, "attn_config.clip_qkv is out of range"),
                     ({"model_type": "dbrx", "attn_config": {"clip_qkv": "8"}}, "attn_config.clip_qkv is not a number")):
        (tmp_path / "config.json").write_text(json.dumps({"hidden_size": D, "num_attention_heads": H, **cfg}))
        r = mha("run", "--weights", tmp_path, "--prefix", "model.layers.0", "--input", tmp_path / "x.npy",
                "--output", tmp_path / "clip.npy", check=False)
        assert r.returncode == 1 and key in r.stderr and not (tmp_path / "clip.npy").exists(), r.stderr


def test_yarn_without_truncation_is_refused(tmp_path):
    """gpt-oss declares rope_scaling.truncate = false: Hugging Face then keeps
    YaRN's ramp ends unrounded, which mha does not implement; refused, not
    run with the rounded ramp."""
    _, t = llama(np.random.RandomState(13))
    write_safetensors(tmp_path / "model.safetensors", t)
    yarn = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 4096, "truncate": False}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "hidden_size": D,
                                                      "num_attention_heads": H, "rope_theta": 150000.0,
                                                      "rope_scaling": yarn}))
    np.save(tmp_path / "x.npy", np.zeros((T, D), np.float32))
    r = mha("run", "--weights", tmp_path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", check=False)
    assert r.returncode == 1 and "rope_scaling.truncate is false" in r.stderr, r.stderr
    assert not (tmp_path / "y.npy").exists()
    yarn["truncate"] = True
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "hidden_size": D,
                                                      "num_attention_heads": H, "rope_theta": 150000.0,
                                                      "rope_scaling": yarn}))
    mha("run", "--weights", tmp_path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")


@pytest.mark.parametrize("config,prefix", [
    ({"model_type": "distilbert", "dim": D, "n_heads": H}, "distilbert.transformer.layer.0.attention"),
    ({"model_type": "bart", "d_model": D, "encoder_attention_heads": H, "decoder_attention_heads": 2 * H},
     "model.encoder.layers.0.self_attn"),
    ({"model_type": "whisper", "d_model": D, "encoder_attention_heads": 2 * H, "decoder_attention_heads": H},
     "model.decoder.layers.0.encoder_attn")])
def test_encoder_head_count_names(tmp_path, config, prefix):
    """DistilBERT's n_heads, BART's and Whisper's encoder_/decoder_attention_heads
    (the side the prefix names) give the head count: no --heads needed."""
    rs = np.random.RandomState(14)
    names = ("q_lin", "k_lin", "v_lin", "out_lin") if "distil" in prefix else ("q_proj", "k_proj", "v_proj", "out_proj")
    w = [rnd(rs, D, D) for _ in names]
    t = {f"{prefix}.{n}.weight": a for n, a in zip(names, w)}
    t.update({f"{prefix}.{n}.bias": np.zeros(D, np.float32) for n in names})
    x, y = run(tmp_path, t, config, prefix)
    np.testing.assert_allclose(y, attention(*(heads(x @ a.T, H) for a in w[:3]), w[3]), atol=2e-5)


@pytest.mark.parametrize("layer", [0, 3])
def test_cohere_rotates_interleaved_and_cohere2_globals_have_no_rope(tmp_path, layer):
    """Cohere's rotate_half pairs dims 2i and 2i+1 (GPT-J's pairing, the
    whole head); Cohere 2 rotates and slides on all but every
    sliding_window_pattern-th layer, whose attention is global without
    position encoding; Cohere's per-head q/k LayerNorm is refused."""
    rs = np.random.RandomState(14)
    w, t = llama(rs, None, H)
    t = {k.replace("layers.0", f"layers.{layer}"): a for k, a in t.items() if "_norm" not in k}
    base = {"hidden_size": D, "num_attention_heads": H, "rope_theta": 1e4}
    x, y = run(tmp_path, t, dict(base, model_type="cohere"), f"model.layers.{layer}")
    q, k = (rotate(heads(x @ w[n].T, H), 8, 1e4, "interleaved") for n in "qk")
    np.testing.assert_allclose(y, attention(q, k, heads(x @ w["v"].T, H), w["o"]), atol=2e-5)
    cfg2 = dict(base, model_type="cohere2", sliding_window=2, sliding_window_pattern=4)
    x, y = run(tmp_path, t, cfg2, f"model.layers.{layer}")
    q, k = (heads(x @ w[n].T, H) for n in "qk")
    if layer == 0:  # a sliding layer: rotated, window 2; layer 3 is global and NoPE
        q, k = rotate(q, 8, 1e4, "interleaved"), rotate(k, 8, 1e4, "interleaved")
    np.testing.assert_allclose(y, windowed(q, k, heads(x @ w["v"].T, H), w["o"], 2 if layer == 0 else T), atol=2e-5)
    (tmp_path / "config.json").write_text(json.dumps(dict(base, model_type="cohere", use_qk_norm=True)))
    r = mha("run", "--weights", tmp_path, "--prefix", f"model.layers.{layer}", "--input", tmp_path / "x.npy",
            "--output", tmp_path / "norm.npy", check=False)
    assert r.returncode == 1 and "use_qk_norm" in r.stderr and not (tmp_path / "norm.npy").exists(), r.stderr
