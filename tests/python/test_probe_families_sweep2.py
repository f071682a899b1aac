"""Second sweep of Hugging Face families through `mha run`'s config.json
reader: each small checkpoint under its family's names, its config.json
with the family's keys, run with --prefix and --causal only, against a
float64 numpy oracle written from the family's attention forward, or
refused by name where the layer cannot express it."""
import numpy as np
import pytest

from test_probe_families import attention, close, heads, llama_like, refused, rnd, run
from test_probe_families_sweep import D, G, H, d, layer, layer_at, roped


def rms(a, w, eps):
    """an RMSNorm of each head's vector"""
    return a / np.sqrt((a * a).mean(-1, keepdims=True) + eps) * w


# ------------------------------------------------------------------ Hunyuan


@pytest.mark.parametrize("model_type", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
@pytest.mark.parametrize("key", ["absent", False])
def test_hunyuan_norm_tensors_after_rope_are_refused_without_use_qk_norm(tmp_path, model_type, key):
    """HunYuanDenseV1Attention / HunYuanMoEV1Attention apply query_layernorm
    / key_layernorm (an RMSNorm of each head, per-dim weights) after the
    rotary, always: the classes have no use_qk_norm. A checkpoint holding
    them under a config.json without use_qk_norm (or false) was read with
    Ling's norm before the rotary, silently (0.59 off): refused by name."""
    rs = np.random.RandomState(3)
    w, _, t = llama_like(rs, D, H, G)
    p = "model.layers.0.self_attn."
    wq, wk = (1 + 0.5 * rs.randn(d)).astype(np.float32), (1 + 0.5 * rs.randn(d)).astype(np.float32)
    t[p + "query_layernorm.weight"], t[p + "key_layernorm.weight"] = wq, wk
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": d, "rope_theta": 1e4, "rms_norm_eps": 1e-5}
    if key != "absent":
        cfg["use_qk_norm"] = key
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "query_layernorm", "after the rotary")
    # without the tensors: Llama's layer, as before
    t = {n: a for n, a in t.items() if "layernorm" not in n}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = (heads(x @ w[n].T.astype(np.float64), m) for n, m in (("q_proj", H), ("k_proj", G), ("v_proj", G)))
    close(y, attention(*roped(q, k, d, 1e4), v, w["o_proj"]))


# --------------------------------------------------------------------- Doge


def test_doge_dynamic_mask_attention_is_refused_by_name(tmp_path):
    """Doge (DogeAttention): the scores get a bias per key,
    exp(A softplus(dt_proj(v))), and past keep_window_size keys only the
    top ones are kept: a data-dependent mask the layer cannot express.
    Before, its q/k/v/o_proj ran as Llama's layer, exit 0."""
    rs = np.random.RandomState(3)
    _, _, t = llama_like(rs, D, H, G)
    p = "model.layers.0.self_attn."
    t[p + "A"] = rs.randn(G).astype(np.float32)
    t[p + "dt_proj.weight"] = rnd(rs, G, G * d)
    cfg = {"model_type": "doge", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e4, "keep_window_size": 2048}
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "doge", "dt_proj")


# ----------------------------------------------------- GLM-4.5V's text model


@pytest.mark.parametrize("model_type", ["glm4v_moe", "glm4v_moe_text"])
@pytest.mark.parametrize("share", [None, 0.5, 1.0])
def test_glm4v_moe_text_rotates_halves_of_the_first_half(tmp_path, model_type, share):
    """GLM-4.5V (glm4v_moe; its text_config glm4v_moe_text): Glm4vMoeTextAttention
    rotates with rotate_half (cos, sin of cat(freqs, freqs)) the first
    partial_rotary_factor x head_dim dims (Glm4vMoeTextConfig, a
    Glm4MoeConfig: default 0.5), as GLM-4.5 (glm4_moe) does; GLM-4.1V
    (glm4v) alone pairs dims 2i, 2i+1. Before: interleaved pairs, and the
    whole head without the key (0.8 off)."""
    text = {"model_type": "glm4v_moe_text", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
            "head_dim": d, "rope_theta": 1e4, "attention_bias": False,
            "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 0]}}
    if share:
        text["partial_rotary_factor"] = share
    cfg = text if model_type == "glm4v_moe_text" else {"model_type": "glm4v_moe", "text_config": text,
                                                        "vision_config": {"model_type": "glm4v_moe_vision"}}
    w, _, t = llama_like(np.random.RandomState(6), D, H, G, p="model.language_model.layers.0.self_attn.")
    x, y = run(tmp_path, t, cfg, "model.language_model.layers.0", D)
    q, k, v = (heads(x @ w[n].T.astype(np.float64), m) for n, m in (("q_proj", H), ("k_proj", G), ("v_proj", G)))
    close(y, attention(*roped(q, k, int(d * (share or 0.5)), 1e4, "halves"), v, w["o_proj"]))


# ------------------------------------------------------------------ LFM2-MoE


@pytest.mark.parametrize("model_type", ["lfm2", "lfm2_moe"])
def test_lfm2_moe_qk_layernorm_takes_norm_eps(tmp_path, model_type):
    """LFM2-MoE (lfm2_moe, Lfm2MoeAttention: LFM2's): q_layernorm /
    k_layernorm, an RMSNorm of each head before the rotary with eps
    norm_eps (Lfm2MoeConfig has no rms_norm_eps). Before, lfm2_moe's
    norm_eps was not read (the loader's eps ran instead; 0.45 off at a
    norm_eps of 0.5)."""
    eps = 0.5
    rs = np.random.RandomState(12)
    p = "model.layers.0.self_attn."
    w, _, t = llama_like(rs, D, H, G, p=p)
    t[p + "out_proj.weight"] = t.pop(p + "o_proj.weight")
    wq, wk = (1 + 0.5 * rs.randn(d)).astype(np.float32), (1 + 0.5 * rs.randn(d)).astype(np.float32)
    t[p + "q_layernorm.weight"], t[p + "k_layernorm.weight"] = wq, wk
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e6, "norm_eps": eps, "layer_types": ["full_attention"]}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = (heads(x @ w[n].T.astype(np.float64), m) for n, m in (("q_proj", H), ("k_proj", G), ("v_proj", G)))
    close(y, attention(*roped(rms(q, wq, eps), rms(k, wk, eps), d, 1e6), v, w["o_proj"]))


# ---------------------------------------------------- GPT-2's score scalings


def gpt2_layer(tmp_path, cfg, n, *flags, check=True):
    """(x, y or the CompletedProcess, q, k, v, c_proj, its bias) of GPT-2's Conv1D c_attn / c_proj at layer n"""
    rs = np.random.RandomState(8)
    p = "transformer.h.%d.attn." % n
    ca, ba, cp, bp = 3 * rnd(rs, D, 3 * D), rnd(rs, 1, 3 * D)[0], rnd(rs, D, D), rnd(rs, 1, D)[0]
    t = {p + "c_attn.weight": ca, p + "c_attn.bias": ba, p + "c_proj.weight": cp, p + "c_proj.bias": bp}
    x, y = run(tmp_path, t, cfg, "transformer.h.%d" % n, D, "--heads", H, *flags, check=check)
    qkv = x @ ca.astype(np.float64) + ba
    q, k, v = (heads(qkv[:, i * D:(i + 1) * D], H) for i in range(3))
    return x, y, q, k, v, cp.T, bp


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_bigcode", None])
@pytest.mark.parametrize("weights,inverse", [(True, True), (False, False), (False, True), (True, False)])
def test_gpt2_scale_attn_weights_and_inverse_layer_idx(tmp_path, model_type, weights, inverse):
    """GPT-2 (GPT2Attention): the scores are divided by sqrt(head_dim) only
    with scale_attn_weights (default true), and by layer_idx + 1 with
    scale_attn_by_inverse_layer_idx (Stanford CRFM's GPT-2 runs write
    true); GPT-BigCode reads scale_attn_weights alike. Before, GPT-2's
    config.json was not read at all: 1/sqrt(head_dim) always (0.5 off at
    layer 3)."""
    cfg = {"n_embd": D, "n_head": H, "scale_attn_weights": weights, "scale_attn_by_inverse_layer_idx": inverse}
    if model_type:
        cfg["model_type"] = model_type
    _, y, q, k, v, wo, bo = gpt2_layer(tmp_path, cfg, 3)
    scale = (1 / np.sqrt(d) if weights else 1.0) / (4.0 if inverse else 1.0)
    close(y, attention(q, k, v, wo, bo, scale=scale))


def test_gpt2_inverse_layer_idx_needs_the_layer_number(tmp_path):
    """scale_attn_by_inverse_layer_idx without a layer number in --prefix:
    refused, naming what is expected (before: run unscaled by it)."""
    rs = np.random.RandomState(8)
    p = "transformer.last.attn."
    t = {p + "c_attn.weight": rnd(rs, D, 3 * D), p + "c_proj.weight": rnd(rs, D, D)}
    cfg = {"model_type": "gpt2", "n_embd": D, "n_head": H, "scale_attn_by_inverse_layer_idx": True}
    _, r = run(tmp_path, t, cfg, "transformer.last", D, "--heads", H, check=False)
    refused(r, tmp_path, "scale_attn_by_inverse_layer_idx", "--prefix")


# ---------------------------------------------------------------- dots.llm1


@pytest.mark.parametrize("n", [0, 1])
@pytest.mark.parametrize("keys", [{"max_window_layers": 1, "num_hidden_layers": 2}, {}])
def test_dots1_layers_from_max_window_layers_slide(tmp_path, n, keys):
    """dots.llm1 (dots1): Dots1Config without layer_types makes the layers
    from max_window_layers (default 62, of num_hidden_layers default 62) on
    sliding_attention whenever sliding_window is set (no
    use_sliding_window); Dots1Attention is Qwen 3's (q_norm / k_norm, read
    from the checkpoint, absent here). Before: every layer global (1.6 off
    on layer 1)."""
    cfg = dict({"model_type": "dots1", "rope_theta": 1e4, "sliding_window": 3}, **keys)
    y, q, k, v, wo = layer_at(tmp_path, cfg, n)
    window = 3 if keys and n >= 1 else None
    close(y, attention(*roped(q, k, d, 1e4), v, wo, window=window))


# ------------------------------------------------- Llama 3.2 Vision (Mllama)


@pytest.mark.parametrize("listed", [True, False])
def test_mllama_cross_attention_layers_do_not_rotate(tmp_path, listed):
    """Llama 3.2 Vision (mllama; text_config mllama_text_model): the layers
    of cross_attention_layers (MllamaTextConfig's default 3, 8, ..., 38)
    are MllamaTextCrossAttention: q from the text, k and v from the vision
    states (--kv-input), each head RMS-normed (q_norm, k_norm), and no
    rotary; the other layers rotate at rope_theta. Before, a cross layer
    rotated q and k (1.8 off)."""
    from io_helpers import mha
    rs = np.random.RandomState(13)
    p = "model.language_model.layers.3.cross_attn."
    w, _, t = llama_like(rs, D, H, G, p=p)
    qn, kn = (1 + 0.5 * rs.randn(d)).astype(np.float32), (1 + 0.5 * rs.randn(d)).astype(np.float32)
    t[p + "q_norm.weight"], t[p + "k_norm.weight"] = qn, kn
    text = {"model_type": "mllama_text_model", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
            "rope_theta": 5e5, "rms_norm_eps": 1e-5}
    if listed:
        text["cross_attention_layers"] = [3]
    cfg = {"model_type": "mllama", "text_config": text, "vision_config": {"model_type": "mllama_vision_model"}}
    x, _ = run(tmp_path, t, cfg, "model.language_model.layers.3.cross_attn", D, check=False)
    kv = np.random.RandomState(14).randn(5, D).astype(np.float32)
    np.save(tmp_path / "kv.npy", kv)
    mha("run", "--weights", tmp_path, "--prefix", "model.language_model.layers.3.cross_attn", "--input",
        tmp_path / "x.npy", "--kv-input", tmp_path / "kv.npy", "--output", tmp_path / "y.npy")
    y = np.load(tmp_path / "y.npy")
    kv = kv.astype(np.float64)
    q = rms(heads(x @ w["q_proj"].T, H), qn, 1e-5)
    k, v = rms(heads(kv @ w["k_proj"].T, G), kn, 1e-5), heads(kv @ w["v_proj"].T, G)
    kk, vv = np.repeat(k, H // G, 0), np.repeat(v, H // G, 0)
    s = q @ kk.transpose(0, 2, 1) / np.sqrt(d)
    pr = np.exp(s - s.max(-1, keepdims=True))
    z = (pr / pr.sum(-1, keepdims=True)) @ vv
    close(y, z.transpose(1, 0, 2).reshape(x.shape[0], -1) @ w["o_proj"].T)


# ------------------------------------------- families found right: guards


def test_seed_oss_biases_and_out_bias(tmp_path):
    """Seed-OSS (seed_oss, SeedOssAttention): q/k/v biases (attention_bias)
    and o_proj's (attention_out_bias), read from the checkpoint; Llama's
    rotary at rope_theta. Ran right; must stay so."""
    rs = np.random.RandomState(1)
    w, b, t = llama_like(rs, D, H, G, bias=True)
    bo = rnd(rs, 1, D)[0]
    t["model.layers.0.self_attn.o_proj.bias"] = bo
    cfg = {"model_type": "seed_oss", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": d, "rope_theta": 1e7, "attention_bias": True, "attention_out_bias": True}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = (heads(x @ w[n].T.astype(np.float64) + b[n], m) for n, m in (("q_proj", H), ("k_proj", G), ("v_proj", G)))
    close(y, attention(*roped(q, k, d, 1e7), v, w["o_proj"], bo))


def test_flex_olmo_norms_the_whole_projection(tmp_path):
    """FlexOlmo (flex_olmo, OLMo 2's attention): q_norm / k_norm RMS-normalize
    the whole q and k projections (h*d, g*d), then the rotary. Ran right."""
    rs = np.random.RandomState(2)
    w, _, t = llama_like(rs, D, H, G)
    p = "model.layers.0.self_attn."
    qn, kn = (1 + 0.5 * rs.randn(H * d)).astype(np.float32), (1 + 0.5 * rs.randn(G * d)).astype(np.float32)
    t[p + "q_norm.weight"], t[p + "k_norm.weight"] = qn, kn
    cfg = {"model_type": "flex_olmo", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 5e5, "rms_norm_eps": 1e-6}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k = heads(rms(x @ w["q_proj"].T, qn, 1e-6), H), heads(rms(x @ w["k_proj"].T, kn, 1e-6), G)
    close(y, attention(*roped(q, k, d, 5e5), heads(x @ w["v_proj"].T, G), w["o_proj"]))


def test_exaone_custom_code_names(tmp_path):
    """EXAONE 3 / 3.5 (exaone, custom code): transformer.h.N.attn.attention's
    q/k/v_proj and out_proj, Llama's rotary at rope_theta. Ran right."""
    rs = np.random.RandomState(3)
    p = "transformer.h.0.attn.attention."
    w, _, t = llama_like(rs, D, H, G, p=p)
    t[p + "out_proj.weight"] = t.pop(p + "o_proj.weight")
    cfg = {"model_type": "exaone", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e6, "rope_scaling": None, "layer_norm_epsilon": 1e-5}
    x, y = run(tmp_path, t, cfg, "transformer.h.0.attn.attention", D)
    q, k, v = (heads(x @ w[n].T.astype(np.float64), m) for n, m in (("q_proj", H), ("k_proj", G), ("v_proj", G)))
    close(y, attention(*roped(q, k, d, 1e6), v, w["o_proj"]))
