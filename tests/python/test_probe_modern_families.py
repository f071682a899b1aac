"""Probe of the 2025-era Hugging Face families through `mha run`'s
config.json reader: each checkpoint is written under its family's tensor
names with its real config.json keys (small dims), run with no flag but
--prefix and --causal, and compared with a float64 numpy oracle written
from the family's modeling code; a family whose attention the layer cannot
express must be refused with one line naming it, never run silently."""
import json

import numpy as np
import pytest

from io_helpers import mha, write_safetensors
from test_probe_families import T, attention, close, heads, llama_like, refused, rnd, run
from test_probe_hf_layouts import rotate  # RoPE at positions 0..T-1, halves or interleaved

P = "model.layers.%d.self_attn."


def rms(a, w, eps):
    return a / np.sqrt((a * a).mean(-1, keepdims=True) + eps) * w


def layers(rs, n, D, H, G, bias=False, norms=None):
    """n Llama-named layers (q/k/v/o_proj), each with (d_k) q/k norms when
    norms = "head", (h*d_k) ones when "whole" (OLMo 2/3)"""
    ws, t = [], {}
    for i in range(n):
        w, b, ti = llama_like(rs, D, H, G, bias=bias, p=P % i)
        if norms:
            d = D // H
            w["qn"], w["kn"] = (rnd(rs, 1, m)[0] + 1 for m in ((d, d) if norms == "head" else (H * d, G * d)))
            ti[P % i + "q_norm.weight"], ti[P % i + "k_norm.weight"] = w["qn"], w["kn"]
        ws.append((w, b))
        t.update(ti)
    return ws, t


def qkv(x, w, b, H, G):
    return (heads(x @ w[n].T + b[n], m) for n, m in (("q_proj", H), ("k_proj", G), ("v_proj", G)))


# --------------------------------------------------- GLM's interleaved rotary


@pytest.mark.parametrize("model_type", ["glm", "glm4"])
def test_glm_rotates_interleaved_pairs_of_partial_dims(tmp_path, model_type):
    """GLM-4 (glm, glm4): apply_rotary_pos_emb repeats each frequency twice
    (repeat_interleave) and rotates pairs (2i, 2i+1) of the first
    partial_rotary_factor x head_dim dims (GPT-J's pairing); q/k/v biases
    (attention_bias), none on o_proj. Before: rotate_half, silently."""
    D, H, G = 64, 4, 2
    (wb,), t = layers(np.random.RandomState(20), 1, D, H, G, bias=True)
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": D // H, "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "attention_bias": True,
           "rms_norm_eps": 1e-5}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = qkv(x, *wb, H, G)
    close(y, attention(rotate(q, 8, 1e4, "interleaved"), rotate(k, 8, 1e4, "interleaved"), v, wb[0]["o_proj"]))


def test_glm4_moe_rotates_halves_after_its_qk_norm(tmp_path):
    """GLM-4.5 (glm4_moe) takes GPT-NeoX's rotate_half on its partial dims,
    after an RMSNorm of each head (use_qk_norm, Qwen 3's)."""
    D, H, G = 64, 4, 2
    (wb,), t = layers(np.random.RandomState(21), 1, D, H, G, bias=True, norms="head")
    cfg = {"model_type": "glm4_moe", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": D // H, "partial_rotary_factor": 0.5, "rope_theta": 1e6, "use_qk_norm": True,
           "attention_bias": True, "rms_norm_eps": 1e-5}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    w = wb[0]
    q, k, v = qkv(x, *wb, H, G)
    q, k = rotate(rms(q, w["qn"], 1e-5), 8, 1e6, "halves"), rotate(rms(k, w["kn"], 1e-5), 8, 1e6, "halves")
    close(y, attention(q, k, v, w["o_proj"]))


@pytest.mark.parametrize("model_type", ["ernie4_5", "ernie4_5_moe", "helium"])
def test_ernie45_and_helium_rotate_interleaved_pairs(tmp_path, model_type):
    """ERNIE 4.5 and Helium: GLM's apply_rotary_pos_emb (frequency i on
    dims 2i and 2i+1) over the whole head. Before: rotate_half, silently."""
    D, H, G = 32, 4, 2
    (wb,), t = layers(np.random.RandomState(22), 1, D, H, G)
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": D // H, "rope_theta": 500000.0, "use_bias": False, "rms_norm_eps": 1e-5}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = qkv(x, *wb, H, G)
    close(y, attention(rotate(q, 8, 5e5, "interleaved"), rotate(k, 8, 5e5, "interleaved"), v, wb[0]["o_proj"]))


# ------------------------------------------ sliding windows and their rotary


@pytest.mark.parametrize("layer", [0, 3])
def test_exaone4_global_layers_have_no_rope(tmp_path, layer):
    """EXAONE 4 (32B): 3 sliding layers to 1 global one (layer_types);
    with sliding_window set, Exaone4Attention rotates only the sliding
    layers (global NoPE), after its RMSNorm of each head's q and k. Before:
    the global layers rotated, silently."""
    D, H, G, W, eps = 32, 4, 2, 3, 1e-5
    ws, t = layers(np.random.RandomState(23), 4, D, H, G, norms="head")
    cfg = {"model_type": "exaone4", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": D // H, "rope_theta": 1e6, "rms_norm_eps": eps, "sliding_window": W,
           "sliding_window_pattern": "LLLG", "num_hidden_layers": 4,
           "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    x, y = run(tmp_path, t, cfg, "model.layers.%d" % layer, D)
    w, b = ws[layer]
    q, k, v = qkv(x, w, b, H, G)
    q, k = rms(q, w["qn"], eps), rms(k, w["kn"], eps)
    if layer == 0:
        q, k = rotate(q, 8, 1e6, "halves"), rotate(k, 8, 1e6, "halves")
    close(y, attention(q, k, v, w["o_proj"], window=W if layer == 0 else None))
    # without layer_types, the letters of sliding_window_pattern say it (EXAONE 4's own code: L slides)
    del cfg["layer_types"]
    close(run(tmp_path, t, cfg, "model.layers.%d" % layer, D)[1], attention(q, k, v, w["o_proj"],
                                                                            window=W if layer == 0 else None))
    # EXAONE 4.0 1.2B: no sliding_window, every layer global and rotated
    cfg.update(sliding_window=None, sliding_window_pattern=None, layer_types=["full_attention"] * 4)
    x, y = run(tmp_path, t, cfg, "model.layers.%d" % layer, D)
    close(y, attention(rotate(q, 8, 1e6, "halves") if layer else q, rotate(k, 8, 1e6, "halves") if layer else k,
                       v, w["o_proj"]))


def yarn_scaled(tmp_path, t, cfg, layer, D):
    """`mha run` of the same layer under a Llama config with cfg's rotary
    settings and no window: the YaRN reference the layer must (not) equal"""
    ref = {k: cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                               "rope_theta", "rope_scaling", "max_position_embeddings", "rms_norm_eps")}
    return run(tmp_path, t, dict(ref, model_type="llama"), "model.layers.%d" % layer, D)[1]


@pytest.mark.parametrize("layer", [0, 3])
def test_olmo3_sliding_layers_rotate_without_rope_scaling(tmp_path, layer):
    """OLMo 3: layer_types' sliding layers attend through sliding_window
    keys with plain RoPE (Olmo3Model's rotary_embs: rope_type default),
    the full ones with rope_scaling (YaRN); q/k RMSNorm over the whole
    width (OLMo 2's). Before: the sliding layers ran YaRN, silently."""
    D, H, G, W, eps = 32, 4, 4, 3, 1e-6
    ws, t = layers(np.random.RandomState(24), 4, D, H, G, norms="whole")
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4,
            "attention_factor": 1.2}
    cfg = {"model_type": "olmo3", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 5e5, "rope_scaling": yarn, "max_position_embeddings": 32, "rms_norm_eps": eps,
           "sliding_window": W, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    x, y = run(tmp_path, t, cfg, "model.layers.%d" % layer, D)
    if layer == 3:  # the full layer: YaRN, as a Llama layer with the same rope_scaling runs it
        cfg["num_key_value_heads"], cfg["head_dim"] = G, D // H
        close(y, yarn_scaled(tmp_path, t, cfg, layer, D))
        return
    w, b = ws[layer]
    q, k, v = qkv(x, w, b, H, G)
    q = heads(rms(x @ w["q_proj"].T, w["qn"], eps), H)  # one norm over the whole q, then the heads
    k = heads(rms(x @ w["k_proj"].T, w["kn"], eps), G)
    close(y, attention(rotate(q, 8, 5e5, "halves"), rotate(k, 8, 5e5, "halves"), v, w["o_proj"], window=W))


# ------------------------------------------------- what the layer cannot do


def test_hunyuan_qk_norm_after_rope_and_ntk_alpha_are_refused(tmp_path):
    """Hunyuan (hunyuan_v1_dense / _moe): query_layernorm / key_layernorm
    (use_qk_norm) normalize q and k AFTER the rotation: with per-dim
    weights that is not the layer's norm-then-rotate; and its rope_scaling
    alpha (NTK-alpha: the base times alpha^(d/(d-2))) is not a scaling the
    layer knows. Both refused by name; without them it is a Llama layer."""
    D, H, G = 32, 4, 2
    (wb,), t = layers(np.random.RandomState(25), 1, D, H, G)
    w = wb[0]
    p = P % 0
    t[p + "query_layernorm.weight"], t[p + "key_layernorm.weight"] = rnd(np.random.RandomState(26), 2, D // H) + 1
    cfg = {"model_type": "hunyuan_v1_dense", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": D // H, "rope_theta": 1e4, "use_qk_norm": True, "attention_bias": False,
           "rope_scaling": {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                            "mscale_all_dim": 1.0, "type": "dynamic"}}
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "use_qk_norm")
    _, r = run(tmp_path, t, dict(cfg, use_qk_norm=False), "model.layers.0", D, check=False)
    refused(r, tmp_path, "rope_scaling.alpha")
    v5 = dict(cfg, use_qk_norm=False, rope_scaling=None, rope_parameters=dict(cfg["rope_scaling"], rope_theta=1e4))
    _, r = run(tmp_path, t, v5, "model.layers.0", D, check=False)
    refused(r, tmp_path, "rope_parameters.alpha")
    del t[p + "query_layernorm.weight"], t[p + "key_layernorm.weight"]
    x, y = run(tmp_path, t, dict(cfg, use_qk_norm=False, rope_scaling=None, model_type="hunyuan_v1_moe"),
               "model.layers.0", D)
    q, k, v = qkv(x, *wb, H, G)
    close(y, attention(rotate(q, 8, 1e4, "halves"), rotate(k, 8, 1e4, "halves"), v, w["o_proj"]))


def mla(rs, D, H, q_lora):
    """DeepSeek V2/V3's multi-head latent attention (Kimi K2, MiniCPM 3):
    q_a_proj / q_b_proj (or q_proj without q_lora_rank), kv_a_proj_with_mqa,
    kv_b_proj, o_proj"""
    nope, rope, vd, r = 8, 4, 8, 6
    t = {"kv_a_proj_with_mqa.weight": rnd(rs, r + rope, D), "kv_a_layernorm.weight": np.ones(r, np.float32),
         "kv_b_proj.weight": rnd(rs, H * (nope + vd), r), "o_proj.weight": rnd(rs, D, H * vd)}
    if q_lora:
        t.update({"q_a_proj.weight": rnd(rs, 6, D), "q_a_layernorm.weight": np.ones(6, np.float32),
                  "q_b_proj.weight": rnd(rs, H * (nope + rope), 6)})
    else:
        t["q_proj.weight"] = rnd(rs, H * (nope + rope), D)
    cfg = {"hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H, "q_lora_rank": 6 if q_lora else None,
           "kv_lora_rank": r, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": vd,
           "rope_theta": 1e4}
    return {P % 0 + n: a for n, a in t.items()}, cfg


@pytest.mark.parametrize("model_type,q_lora", [("deepseek_v2", False), ("deepseek_v3", True), ("kimi_k2", True),
                                               ("minicpm3", True)])
def test_multi_head_latent_attention_is_refused_by_name(tmp_path, model_type, q_lora):
    D, H = 32, 4
    t, cfg = mla(np.random.RandomState(27), D, H, q_lora)
    _, r = run(tmp_path, t, dict(cfg, model_type=model_type), "model.layers.0", D, check=False)
    refused(r, tmp_path, model_type, "latent")


def qwen3_next(rs, D, H, G, d, p):
    t = {p + "q_proj.weight": rnd(rs, 2 * H * d, D), p + "k_proj.weight": rnd(rs, G * d, D),
         p + "v_proj.weight": rnd(rs, G * d, D), p + "o_proj.weight": rnd(rs, D, H * d),
         p + "q_norm.weight": (0.3 * rs.randn(d)).astype(np.float32),
         p + "k_norm.weight": (0.3 * rs.randn(d)).astype(np.float32)}
    cfg = {"model_type": "qwen3_next", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": d, "partial_rotary_factor": 0.25, "rope_theta": 1e4, "rms_norm_eps": 1e-6,
           "full_attention_interval": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    return t, cfg


def test_qwen3_next_gated_attention(tmp_path):
    """Qwen3-Next (Qwen3NextAttention): q_proj emits, per head, head_dim query
    rows then head_dim gate rows; q/k RMSNorm with (1 + weight) (zero-centred);
    rotate_half on partial_rotary_factor of each head; the heads' output times
    sigmoid(gate) before o_proj. Numpy of that module, float64."""
    D, H, G, d = 32, 4, 2, 16
    rs = np.random.RandomState(28)
    p = P % 3
    t, cfg = qwen3_next(rs, D, H, G, d, p)
    x, y = run(tmp_path, t, cfg, "model.layers.3", D)
    qg = (x @ t[p + "q_proj.weight"].T.astype(np.float64)).reshape(T, H, 2 * d)
    q, gate = qg[..., :d].transpose(1, 0, 2), qg[..., d:].reshape(T, H * d)
    k = heads(x @ t[p + "k_proj.weight"].T.astype(np.float64), G)
    v = heads(x @ t[p + "v_proj.weight"].T.astype(np.float64), G)
    q, k = rms(q, 1.0 + t[p + "q_norm.weight"], 1e-6), rms(k, 1.0 + t[p + "k_norm.weight"], 1e-6)
    q, k = rotate(q, d // 4, 1e4, "halves"), rotate(k, d // 4, 1e4, "halves")
    kk, vv = np.repeat(k, H // G, 0), np.repeat(v, H // G, 0)
    s = q @ kk.transpose(0, 2, 1) / np.sqrt(d)
    s = np.where(np.arange(T)[None] > np.arange(T)[:, None], -np.inf, s)
    pr = np.exp(s - s.max(-1, keepdims=True))
    z = ((pr / pr.sum(-1, keepdims=True)) @ vv).transpose(1, 0, 2).reshape(T, H * d)
    want = (z / (1.0 + np.exp(-gate))) @ t[p + "o_proj.weight"].T.astype(np.float64)
    close(y, want)
    # the same checkpoint read without its gate would be another layer: far from it
    assert np.abs(want - (z @ t[p + "o_proj.weight"].T)).max() > 1e-2
    # `mha convert --to native` keeps the gate, the norms' offset and the rotary: the native file
    # runs alone (no config.json) to the same Y; and in Python, Layer.load reads it whole
    native = tmp_path / "native.safetensors"
    mha("convert", "--prefix", "model.layers.3", tmp_path, native, "--to", "native")
    mha("run", "--weights", native, "--input", tmp_path / "x.npy", "--output", tmp_path / "y2.npy", "--causal")
    close(np.load(tmp_path / "y2.npy"), want)
    # compact weights for decoding: W_G rounded with the others (int8 per 32 inputs, bf16), within their
    # error of the module (the max error relative to max|Y|), and not the fp32 run
    for dtype, bound in (("bf16", 1e-2), ("int8", 2.5e-2)):  # measured 3.6e-3, 9.2e-3 (max, relative)
        mha("run", "--weights", native, "--input", tmp_path / "x.npy", "--output", tmp_path / "y3.npy", "--causal",
            "--weights-dtype", dtype)
        y3 = np.load(tmp_path / "y3.npy")
        err = np.abs(y3 - want).max() / np.abs(want).max()
        assert 0 < err <= bound, (dtype, err)
    # a config asking for the gate beside a q_proj without one; the headwise gate
    t[p + "q_proj.weight"] = t[p + "q_proj.weight"][:H * d]
    _, r = run(tmp_path, t, dict(cfg, model_type="qwen3", attn_output_gate=True), "model.layers.3", D, check=False)
    refused(r, tmp_path, "query and gate")
    _, r = run(tmp_path, t, dict(cfg, headwise_attn_output_gate=True), "model.layers.3", D, check=False)
    refused(r, tmp_path, "headwise_attn_output_gate")


@pytest.mark.parametrize("model_type,word", [("phi3small", "blocksparse"), ("gemma3n_text", "v_norm"),
                                             ("zamba", "zamba"), ("zamba2", "zamba2")])
def test_families_the_layer_cannot_express_are_refused_by_name(tmp_path, model_type, word):
    """Phi-3-small (block-sparse layers, muP's 1/d scale), Gemma 3n (an
    RMSNorm of v, unscaled scores, layers sharing another's K and V),
    Zamba / Zamba 2 (a shared block on [hidden; embeddings] of twice the
    width, LoRA adapters per use): Llama-named q/k/v/o here, so without
    the refusal they would run as Llama layers."""
    D, H = 32, 4
    _, t = layers(np.random.RandomState(29), 1, D, H, H)
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H,
           "rope_theta": 1e4}
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, model_type, word)


# ------------------------------------------------------ hybrid models' scales


@pytest.mark.parametrize("pe", ["nope", "rope"])
def test_granite4_position_embedding_type(tmp_path, pe):
    """Granite 4 (granitemoehybrid): position_embedding_type "nope" means
    no rotary though rope_theta is saved (Granite 4.0's configs);
    attention_multiplier scales the scores. Before: rotated, silently."""
    D, H, G = 32, 4, 2
    (wb,), t = layers(np.random.RandomState(30), 1, D, H, G)
    cfg = {"model_type": "granitemoehybrid", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e4, "position_embedding_type": pe, "attention_multiplier": 0.2,
           "layer_types": ["attention"]}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = qkv(x, *wb, H, G)
    if pe == "rope":
        q, k = rotate(q, 8, 1e4, "halves"), rotate(k, 8, 1e4, "halves")
    close(y, attention(q, k, v, wb[0]["o_proj"], scale=0.2))


def test_falcon_h1_key_multiplier_scales_the_scores(tmp_path):
    """Falcon-H1: FalconH1Attention multiplies k by key_multiplier (the
    scores by it, RoPE being linear); attention_in/out_multiplier act in the
    decoder layer, outside the module. Before: ignored, silently."""
    D, H, G, m = 32, 4, 2, 0.3
    (wb,), t = layers(np.random.RandomState(31), 1, D, H, G)
    cfg = {"model_type": "falcon_h1", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": D // H, "rope_theta": 1e11, "key_multiplier": m, "attention_in_multiplier": 1.0,
           "attention_out_multiplier": 0.9}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = qkv(x, *wb, H, G)
    close(y, attention(rotate(q, 8, 1e11, "halves"), rotate(k * m, 8, 1e11, "halves"), v, wb[0]["o_proj"]))


# ------------------------------------------- transformers 5's rope_parameters


def test_rope_parameters_of_transformers_5(tmp_path):
    """Transformers 5 saves rope_theta, partial_rotary_factor and the
    scaling's keys in one rope_parameters object, no top-level rope_theta.
    Before: not read, so Qwen 3 rotated with 10000 instead of 1e6 and a
    family without a default (Seed-OSS) ran with no rotary, silently."""
    D, H, G = 32, 4, 2
    (wb,), t = layers(np.random.RandomState(32), 1, D, H, G)
    w = wb[0]
    base = {"hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G, "head_dim": D // H}
    for model_type, part in (("qwen3", 1.0), ("seed_oss", 1.0), ("glm4_moe", 0.5)):
        cfg = dict(base, model_type=model_type,
                   rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": part})
        x, y = run(tmp_path, t, cfg, "model.layers.0", D)
        q, k, v = qkv(x, *wb, H, G)
        r = int(8 * part)
        close(y, attention(rotate(q, r, 1e6, "halves"), rotate(k, r, 1e6, "halves"), v, w["o_proj"]))
    # a scaling in rope_parameters runs as the same one in the older rope_scaling
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "attention_factor": 1.3}
    legacy = dict(base, model_type="llama", rope_theta=5e5, rope_scaling=yarn, max_position_embeddings=16)
    _, want = run(tmp_path, t, legacy, "model.layers.0", D)
    cfg = dict(base, model_type="llama", max_position_embeddings=16, rope_parameters=dict(yarn, rope_theta=5e5))
    close(run(tmp_path, t, cfg, "model.layers.0", D)[1], want)
    # Ministral 3's llama_4_scaling_beta 0: nothing (its scaling: test_ministral3_llama_4_scaling_beta)
    zero = dict(cfg, model_type="ministral3", rope_parameters=dict(cfg["rope_parameters"], llama_4_scaling_beta=0))
    close(run(tmp_path, t, zero, "model.layers.0", D)[1], want)
    # LongRoPE (Phi-3): transformers 5 keeps the pre-training length in rope_parameters and, without a
    # factor, grows it by max_position_embeddings / L, as the older top-level key did (attention factor)
    lists = {"short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 5.0, 8.0]}
    legacy = dict(base, model_type="phi3", rope_theta=1e4, max_position_embeddings=16,
                  original_max_position_embeddings=4, rope_scaling=dict(lists, type="longrope"))
    _, want = run(tmp_path, t, legacy, "model.layers.0", D)
    v5 = dict(base, model_type="phi3", max_position_embeddings=16, rope_parameters=dict(
        lists, rope_type="longrope", rope_theta=1e4, original_max_position_embeddings=4))
    close(run(tmp_path, t, v5, "model.layers.0", D)[1], want)
    cfg["rope_parameters"]["factor"] = "4"
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "rope_parameters.factor is not a number")


@pytest.mark.parametrize("where", ["rope_parameters", "rope_scaling"])
def test_ministral3_llama_4_scaling_beta(tmp_path, where):
    """Ministral 3 multiplies its rotated queries at position p by 1 + beta
    ln(1 + floor(p / original_max_position_embeddings)) (Llama 4's
    temperature at p, not p + 1); transformers 5 saves it in rope_parameters,
    older files in rope_scaling. L 2 here: T 7's queries see four factors.
    Before: refused (and before that run unscaled, silently)."""
    D, H, G = 32, 4, 2
    (wb,), t = layers(np.random.RandomState(31), 1, D, H, G)
    rope = {"rope_type": "default", "rope_theta": 1e6, "llama_4_scaling_beta": 0.3,
            "original_max_position_embeddings": 2}
    base = {"model_type": "ministral3", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
            "head_dim": D // H}
    cfg = dict(base, rope_parameters=rope) if where == "rope_parameters" else \
        dict(base, rope_theta=1e6, rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"})
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = qkv(x, *wb, H, G)
    scale = 1 + 0.3 * np.log(1 + np.floor(np.arange(T) / 2.0))  # (T,)
    want = attention(rotate(q, 8, 1e6, "halves") * scale[None, :, None], rotate(k, 8, 1e6, "halves"), v,
                     wb[0]["o_proj"])
    close(y, want)
    plain = attention(rotate(q, 8, 1e6, "halves"), rotate(k, 8, 1e6, "halves"), v, wb[0]["o_proj"])
    assert np.abs(plain - want).max() > 1e-2  # the scaling matters at this size
    del rope["original_max_position_embeddings"]
    cfg = dict(base, rope_parameters=rope)
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "llama_4_scaling_beta is 0.3 but original_max_position_embeddings is missing")


@pytest.mark.parametrize("layer", [0, 1])
def test_rope_parameters_per_layer_type(tmp_path, layer):
    """Gemma 3 under transformers 5: rope_parameters holds one object per
    layer type (the sliding layers' theta 1e4, the global ones' 1e6 with
    linear scaling 8); no rope_local_base_freq."""
    D, H = 32, 4
    ws, t = layers(np.random.RandomState(33), 2, D, H, H, norms="head")
    cfg = {"model_type": "gemma3_text", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H,
           "head_dim": D // H, "query_pre_attn_scalar": D // H, "sliding_window": 3, "rms_norm_eps": 1e-6,
           "layer_types": ["sliding_attention", "full_attention"],
           "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 2e4},
                               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}
    x, y = run(tmp_path, t, cfg, "model.layers.%d" % layer, D)
    w, b = ws[layer]
    q, k, v = qkv(x, w, b, H, H)
    q, k = rms(q, 1 + w["qn"], 1e-6), rms(k, 1 + w["kn"], 1e-6)  # Gemma 3's (1 + weight)
    theta, factor = (2e4, 1.0) if layer == 0 else (1e6, 8.0)
    q, k = rotate(q, 8, theta, "halves", factor), rotate(k, 8, theta, "halves", factor)
    close(y, attention(q, k, v, w["o_proj"], window=3 if layer == 0 else None))
    _, r = run(tmp_path, t, cfg, "model.layers", D, check=False)
    refused(r, tmp_path, "rope_parameters differ per layer type")


@pytest.mark.parametrize("model_type,pairing", [("qwen2_vl", "halves"), ("glm4v_text", "interleaved")])
def test_mrope_of_text_positions_is_plain_rope(tmp_path, model_type, pairing):
    """Qwen2-VL's multimodal rotary (rope_scaling type mrope, mrope_section)
    gives the three sections the same angle when every token has one
    position (text, and all `mha run` takes): plain RoPE; GLM-4V pairs
    (2i, 2i+1) as GLM-4 does, on partial_rotary_factor of the head. Before:
    "mrope" was refused as an unknown rope_type; GLM-4V rotated halves."""
    D, H, G = 64, 4, 2
    (wb,), t = layers(np.random.RandomState(34), 1, D, H, G, bias=True)
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e6, "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]}}
    if model_type == "glm4v_text":
        cfg.update(partial_rotary_factor=0.5, rope_scaling={"rope_type": "default", "mrope_section": [2, 1, 1]})
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    r = 16 if model_type == "qwen2_vl" else 8
    q, k, v = qkv(x, *wb, H, G)
    close(y, attention(rotate(q, r, 1e6, pairing), rotate(k, r, 1e6, pairing), v, wb[0]["o_proj"]))


# ------------------------------------------------------- what already fits


@pytest.mark.parametrize("model_type,extra,norms,bias,r,window", [
    ("seed_oss", {"attention_bias": True, "attention_out_bias": False, "rope_theta": 1e7}, None, True, 8, None),
    ("apertus", {"qk_norm": True, "rope_theta": 1e7}, "head", False, 8, None),  # RMSNorm of each head
    ("arcee", {"rope_theta": 1e7}, None, False, 8, None),
    ("ministral", {"rope_theta": 1e7, "sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"]},
     None, False, 8, 3),
    ("bamba", {"rope_theta": 1e7, "partial_rotary_factor": 0.5, "attn_layer_indices": [0]}, None, False, 4, None),
    ("jamba", {"attn_layer_period": 1, "attn_layer_offset": 0}, None, False, 0, None),  # no rotary at all
    ("smollm3", {"rope_theta": 1e7, "no_rope_layers": [1, 1, 1, 0]}, None, False, 8, None),
])
def test_families_that_already_fit(tmp_path, model_type, extra, norms, bias, r, window):
    """Llama-like 2025 families read generically: Seed-OSS (q/k/v biases),
    Apertus (q/k RMSNorm), Arcee, Ministral (layer_types' sliding
    layers), Bamba (rotate_half on half the head), Jamba (no rotary),
    SmolLM 3 (a rotary layer of no_rope_layers)."""
    D, H, G = 32, 4, 2
    (wb,), t = layers(np.random.RandomState(35), 1, D, H, G, bias=bias, norms=norms)
    cfg = dict({"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
                "rms_norm_eps": 1e-5}, **extra)
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    w = wb[0]
    q, k, v = qkv(x, *wb, H, G)
    if norms:
        q, k = rms(q, w["qn"], 1e-5), rms(k, w["kn"], 1e-5)
    if r:
        q, k = rotate(q, r, 1e7, "halves"), rotate(k, r, 1e7, "halves")
    close(y, attention(q, k, v, w["o_proj"], window=window))


def test_lfm2_unbiased_layernorm_names_read_as_its_rmsnorm(tmp_path):
    """LFM2 keeps an RMSNorm of each head's q and k as q_layernorm.weight /
    k_layernorm.weight (no bias), names Phi's biased LayerNorm takes: once
    refused (the kind unknown), now read as that RMSNorm (the norm is
    applied: y differs from the same layer without those tensors;
    tests/python/test_families_more.py holds it to Lfm2Attention's numbers)."""
    D, H, G = 32, 4, 2
    (wb,), t = layers(np.random.RandomState(38), 1, D, H, G)
    cfg = {"model_type": "lfm2", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G}
    _, y0 = run(tmp_path, t, cfg, "model.layers.0", D)
    t = dict(t, **{P % 0 + "q_layernorm.weight": np.ones(D // H, np.float32),
                   P % 0 + "k_layernorm.weight": np.ones(D // H, np.float32)})
    _, y1 = run(tmp_path, t, cfg, "model.layers.0", D)
    assert np.abs(y1 - y0).max() > 1e-3


@pytest.mark.parametrize("layer,interval", [(3, None), (2, None), (1, 2), (0, 2)])
def test_smollm3_default_nope_layers(tmp_path, layer, interval):
    """SmolLM 3 without no_rope_layers: its config class makes the list,
    NoPE at every no_rope_layer_interval-th layer (default 4) counted from
    1 (layers 3, 7, ...). Before: every layer rotated, silently."""
    D, H, G = 32, 4, 2
    wbs, t = layers(np.random.RandomState(37), 4, D, H, G)
    cfg = {"model_type": "smollm3", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e7, "num_hidden_layers": 4}
    if interval:
        cfg["no_rope_layer_interval"] = interval
    x, y = run(tmp_path, t, cfg, "model.layers.%d" % layer, D)
    q, k, v = qkv(x, *wbs[layer], H, G)
    if (layer + 1) % (interval or 4):
        q, k = rotate(q, 8, 1e7, "halves"), rotate(k, 8, 1e7, "halves")
    close(y, attention(q, k, v, wbs[layer][0]["o_proj"]))


def test_minimax_m2_rotary_dim_and_whole_width_norm(tmp_path):
    """MiniMax M2: rotate_half on rotary_dim (64 of head_dim 128: 4 of 8
    here) dims, after q_norm / k_norm over the whole projection
    (qk_norm_type per_layer, OLMo 2's). Before: the whole head rotated."""
    D, H, G, eps = 32, 4, 2, 1e-6
    (wb,), t = layers(np.random.RandomState(36), 1, D, H, G, norms="whole")
    cfg = {"model_type": "minimax_m2", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": D // H, "rotary_dim": 4, "rope_theta": 5e6, "use_qk_norm": True, "qk_norm_type": "per_layer",
           "rms_norm_eps": eps}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    w = wb[0]
    q, k = heads(rms(x @ w["q_proj"].T, w["qn"], eps), H), heads(rms(x @ w["k_proj"].T, w["kn"], eps), G)
    close(y, attention(rotate(q, 4, 5e6, "halves"), rotate(k, 4, 5e6, "halves"), heads(x @ w["v_proj"].T, G),
                       w["o_proj"]))


def test_t5_and_t5gemma_are_refused_by_name(tmp_path):
    """T5 (SelfAttention.q/k/v/o: no layout fits them) adds a bucketed
    relative position bias to unscaled scores: named, not "no layout
    fits". T5Gemma's Gemma-named layers keep their rotary, window and
    soft-cap in config.json's "encoder" / "decoder", which are not read:
    it asked for --heads, and with it ran with none of them."""
    D, H = 32, 4
    rs = np.random.RandomState(37)
    p = "encoder.block.0.layer.0.SelfAttention."
    t = {p + n + ".weight": rnd(rs, D, D) for n in "qkvo"}
    t[p + "relative_attention_bias.weight"] = rnd(rs, 32, H)
    cfg = {"model_type": "t5", "d_model": D, "num_heads": H, "d_kv": D // H, "relative_attention_num_buckets": 32}
    _, r = run(tmp_path, t, cfg, "encoder.block.0.layer.0", D, check=False)
    refused(r, tmp_path, "model_type t5", "relative_attention_bias")
    _, t = layers(rs, 1, D, H, H)
    t = {k.replace("model.layers", "model.encoder.layers"): a for k, a in t.items()}
    module = {"hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H, "head_dim": D // H,
              "rope_theta": 1e4, "sliding_window": 3, "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 8}
    cfg = {"model_type": "t5gemma", "encoder": module, "decoder": module}
    _, r = run(tmp_path, t, cfg, "model.encoder.layers.0", D, check=False)
    refused(r, tmp_path, "model_type t5gemma")
