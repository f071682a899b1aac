"""Sweep of Hugging Face families through `mha run`'s config.json reader
for what their config class or modeling code decides that config.json may
not say: each small checkpoint under Llama's names (q/k/v/o_proj), its
config.json with the family's keys (the minimal ones, and those its config
class writes), run with --prefix and --causal only, against a float64
numpy oracle written from the family's attention forward."""
import numpy as np
import pytest

from test_probe_families import T, attention, close, heads, llama_like, refused, rnd, run
from test_probe_hf_layouts import rotate  # RoPE at positions 0..T-1, halves or interleaved

D, H, G, d = 32, 4, 2, 8


def layer(tmp_path, cfg, seed=0, prefix="model.layers.0"):
    """(y of `mha run`, q, k, v as (h, T, d) float64, o_proj) of a GQA layer"""
    w, _, t = llama_like(np.random.RandomState(seed), D, H, G, p=prefix + ".self_attn.")
    cfg = dict({"hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G}, **cfg)
    x, y = run(tmp_path, t, cfg, prefix, D)
    q, k, v = (heads(x @ w[n].T.astype(np.float64), m) for n, m in (("q_proj", H), ("k_proj", G), ("v_proj", G)))
    return y, q, k, v, w["o_proj"]


def layer_at(tmp_path, cfg, n):
    """layer() of the layer numbered n (model.layers.n)"""
    return layer(tmp_path, cfg, prefix="model.layers.%d" % n)


def roped(q, k, r, theta, pairing="halves"):
    return rotate(q, r, theta, pairing), rotate(k, r, theta, pairing)


# ------------------------------------------- defaults of the config classes


@pytest.mark.parametrize("model_type,share,theta,pairing", [
    ("stablelm", 0.25, 1e4, "halves"),   # StableLmConfig(partial_rotary_factor=0.25)
    ("gpt_neox", 0.25, 1e4, "halves"),   # GPTNeoXConfig(rotary_pct=0.25)
    ("phi", 0.5, 1e4, "halves"),         # PhiConfig(partial_rotary_factor=0.5)
    ("nemotron", 0.5, 1e4, "halves"),    # NemotronConfig(partial_rotary_factor=0.5, rope_theta 10000)
    ("persimmon", 0.5, 25000, "halves"),  # PersimmonConfig(partial_rotary_factor=0.5, rope_theta=25000)
    ("glm", 0.5, 1e4, "interleaved"),    # GlmConfig(partial_rotary_factor=0.5)
    ("glm4", 0.5, 1e4, "interleaved"),
    ("glm4_moe", 0.5, 1e4, "halves"),
])
def test_rotated_share_and_theta_default_to_the_config_class(tmp_path, model_type, share, theta, pairing):
    """A config.json without partial_rotary_factor (rotary_pct) or
    rope_theta takes its config class's defaults, as Hugging Face loads
    it. Before, the whole head rotated (and Nemotron, Persimmon, GLM
    without rope_theta did not rotate at all): 0.2 to 1.1 off."""
    y, q, k, v, wo = layer(tmp_path, {"model_type": model_type})
    close(y, attention(*roped(q, k, int(d * share), theta, pairing), v, wo))
    # the key, where given, still wins
    y, q, k, v, wo = layer(tmp_path, {"model_type": model_type, "partial_rotary_factor": 1.0, "rotary_pct": 1.0,
                                      "rope_theta": 5e3})
    close(y, attention(*roped(q, k, d, 5e3, pairing), v, wo))


@pytest.mark.parametrize("pct", [0.25, 0.5, None])
def test_stablelm_epoch_rotates_rope_pct_of_each_head(tmp_path, pct):
    """StableLM's first custom code (model_type stablelm_epoch: StableLM-3B-
    4E1T, StableLM Zephyr 3B): rotary_ndims = head_dim x rope_pct (default
    0.25), rotate_half at rope_theta. Before: the whole head, 0.7 off."""
    cfg = {"model_type": "stablelm_epoch", "rope_theta": 1e4, "norm_eps": 1e-5, "use_qkv_bias": False}
    if pct:
        cfg["rope_pct"] = pct
    y, q, k, v, wo = layer(tmp_path, cfg)
    close(y, attention(*roped(q, k, int(d * (pct or 0.25)), 1e4), v, wo))


# ------------------------------------------------------------------ Granite


@pytest.mark.parametrize("pe", ["absent", None, "rope", "nope"])
def test_granitemoehybrid_rotates_only_with_position_embedding_type_rope(tmp_path, pe):
    """Granite 4 (granitemoehybrid): GraniteMoeHybridModel builds its
    rotary only when position_embedding_type is "rope"; null or absent
    (the class's default None) is NoPE, though the config class writes
    rope_theta 10000. Scores scaled by attention_multiplier. Before, null
    or absent rotated, silently (0.5 off)."""
    cfg = {"model_type": "granitemoehybrid", "rope_theta": 10000.0, "attention_multiplier": 0.1,
           "layer_types": ["attention"]}
    if pe != "absent":
        cfg["position_embedding_type"] = pe
    y, q, k, v, wo = layer(tmp_path, cfg)
    if pe == "rope":
        q, k = roped(q, k, d, 1e4)
    close(y, attention(q, k, v, wo, scale=0.1))


@pytest.mark.parametrize("model_type", ["granite", "granitemoe", "granitemoeshared", "granitemoehybrid"])
def test_granite_without_attention_multiplier_is_unscaled(tmp_path, model_type):
    """Granite's attention scales q.k by attention_multiplier alone (its
    config classes' default 1.0), never by 1/sqrt(head_dim): without the
    key the scores are unscaled. Before: 1/sqrt(head_dim), 1.05 off."""
    cfg = {"model_type": model_type, "rope_theta": 1e4, "position_embedding_type": "rope"}
    y, q, k, v, wo = layer(tmp_path, cfg)
    close(y, attention(*roped(q, k, d, 1e4), v, wo, scale=1.0))
    y, q, k, v, wo = layer(tmp_path, dict(cfg, attention_multiplier=0.05))
    close(y, attention(*roped(q, k, d, 1e4), v, wo, scale=0.05))


# --------------------------------------------------------- Gemma 2 / Gemma 3


def gemma_layer(tmp_path, cfg, layer, norms, prefix="language_model.model.layers.%d"):
    """a layer of Gemma's default shape (8 heads, 4 kv heads of 256 dims) on a 64-wide input:
    (x, y, q, k, v, o_proj), q and k after Gemma 3's (1 + weight) RMSNorm when norms"""
    rs = np.random.RandomState(5)
    Dg, Hg, Gg, dg = 64, 8, 4, 256
    p = prefix % layer + ".self_attn."
    w = {"q": 3 * rnd(rs, Hg * dg, Dg), "k": 3 * rnd(rs, Gg * dg, Dg), "v": rnd(rs, Gg * dg, Dg), "o": rnd(rs, Dg, Hg * dg)}
    t = {p + "q_proj.weight": w["q"], p + "k_proj.weight": w["k"], p + "v_proj.weight": w["v"], p + "o_proj.weight": w["o"]}
    qn, kn = (0.3 * rs.randn(dg)).astype(np.float32), (0.3 * rs.randn(dg)).astype(np.float32)
    if norms:
        t[p + "q_norm.weight"], t[p + "k_norm.weight"] = qn, kn
    x, y = run(tmp_path, t, cfg, prefix % layer, Dg)
    q, k = heads(x @ w["q"].T.astype(np.float64), Hg), heads(x @ w["k"].T.astype(np.float64), Gg)
    if norms:
        q, k = (a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * (1 + n) for a, n in ((q, qn), (k, kn)))
    return y, q, k, heads(x @ w["v"].T.astype(np.float64), Gg), w["o"]


@pytest.mark.parametrize("layer", [0, 5])
def test_gemma3_multimodal_text_config_of_diffs_takes_the_class_defaults(tmp_path, layer):
    """Gemma 3 4B's config.json keeps in text_config only what differs from
    Gemma3TextConfig: hidden_size, rope_scaling (linear 8), sliding_window,
    no heads, head_dim, rope_theta, query_pre_attn_scalar or
    sliding_window_pattern. Its defaults: 8 heads, 4 kv heads of 256 dims,
    global layers (every 6th) at rope_theta 1e6 with the scaling, local ones
    at rope_local_base_freq 10000 without it through the window, scores /
    sqrt(256). Before: refused for --heads, and with it the local layers ran
    globally with the global rotary (1.4 off), the global ones at 10000."""
    text = {"hidden_size": 64, "intermediate_size": 128, "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 3}
    cfg = {"model_type": "gemma3", "text_config": text, "vision_config": {"model_type": "siglip_vision_model"}}
    y, q, k, v, wo = gemma_layer(tmp_path, cfg, layer, True)
    local = layer != 5
    theta, factor = (1e4, 1.0) if local else (1e6, 8.0)
    q, k = rotate(q, 256, theta, "halves", factor), rotate(k, 256, theta, "halves", factor)
    close(y, attention(q, k, v, wo, scale=256 ** -0.5, window=3 if local else None))
    # without sliding_window (Gemma3TextConfig's 4096 keys: all 7 here), layer 0 still rotates as a local one
    del text["sliding_window"]
    if local:
        close(gemma_layer(tmp_path, cfg, layer, True)[0], attention(q, k, v, wo, scale=256 ** -0.5))


def softcapped(q, k, v, wo, cap, scale):
    """causal GQA attention with Gemma 2's cap * tanh(scores / cap)"""
    kk, vv = np.repeat(k, q.shape[0] // k.shape[0], 0), np.repeat(v, q.shape[0] // v.shape[0], 0)
    s = cap * np.tanh(q @ kk.transpose(0, 2, 1) * scale / cap)
    s = np.where(np.arange(T)[None] > np.arange(T)[:, None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ vv).transpose(1, 0, 2).reshape(T, -1) @ wo.T


def test_gemma2_minimal_config_takes_the_class_defaults(tmp_path):
    """Gemma2Config's defaults where config.json is silent: 8 heads, 4 kv
    heads of 256 dims, rope_theta 10000, scores / sqrt(query_pre_attn_scalar
    256) soft-capped at 50 (null: no cap). Before: 1/sqrt(head_dim) and no
    cap."""
    cfg = {"model_type": "gemma2", "hidden_size": 64}
    y, q, k, v, wo = gemma_layer(tmp_path, cfg, 1, False, "model.layers.%d")
    q, k = rotate(q, 256, 1e4, "halves"), rotate(k, 256, 1e4, "halves")
    close(y, softcapped(q, k, v, wo, 50.0, 256 ** -0.5))
    assert np.abs(softcapped(q, k, v, wo, 50.0, 256 ** -0.5) - attention(q, k, v, wo, scale=256 ** -0.5)).max() > 1e-3
    y, *_ = gemma_layer(tmp_path, dict(cfg, attn_logit_softcapping=None, query_pre_attn_scalar=64), 1, False,
                        "model.layers.%d")
    close(y, attention(q, k, v, wo, scale=64 ** -0.5))
    # a head_dim of 8 keeps the scores / sqrt(256) of query_pre_attn_scalar's default
    y, q, k, v, wo = layer(tmp_path, {"model_type": "gemma2", "head_dim": d, "attn_logit_softcapping": None})
    close(y, attention(*roped(q, k, d, 1e4), v, wo, scale=256 ** -0.5))


# ------------------------------------------------------ Cohere 2 and OLMo 3


@pytest.mark.parametrize("layer", [0, 3])
def test_cohere2_without_pattern_keys_has_every_fourth_layer_global_nope(tmp_path, layer):
    """Command R7B (cohere2) without layer_types or sliding_window_pattern:
    Cohere2Config's pattern 4 (and sliding_window 4096) makes every 4th
    layer global, with no position encoding; the others rotate interleaved.
    Before: every layer rotated (layer 3 0.4 off)."""
    y, q, k, v, wo = layer_at(tmp_path, {"model_type": "cohere2", "rope_theta": 5e4}, layer)
    if layer == 0:
        q, k = roped(q, k, d, 5e4, "interleaved")
    close(y, attention(q, k, v, wo))


@pytest.mark.parametrize("layer", [0, 3])
def test_olmo3_minimal_config_takes_the_class_defaults(tmp_path, layer):
    """OLMo 3 (olmo3) without rope_theta or layer_types: Olmo3Config's
    default_theta 5e5 and every 4th layer full (with rope_scaling), the
    others sliding (4096 keys, plain RoPE). Before: no rotary at all
    without rope_theta, and the sliding layers took rope_scaling."""
    cfg = {"model_type": "olmo3", "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    y, q, k, v, wo = layer_at(tmp_path, cfg, layer)
    f = 4.0 if layer == 3 else 1.0
    close(y, attention(rotate(q, d, 5e5, "halves", f), rotate(k, d, 5e5, "halves", f), v, wo))


# ------------------------------------------------------------------ MiniMax


def test_minimax_softmax_layers_rotate_at_1e6_and_slide(tmp_path):
    """MiniMax (minimax): its full_attention layers are Mixtral's
    (MiniMaxAttention), rotated at MiniMaxConfig's default_theta 1e6
    without rope_theta (before: not rotated, 1.4 off), through the sliding
    mask on every full_attention layer when sliding_window is set
    (MiniMaxModel; before: global, as its layer_types name no
    sliding_attention, 1.6 off)."""
    types = ["full_attention", "linear_attention"]
    y, q, k, v, wo = layer(tmp_path, {"model_type": "minimax", "layer_types": types})
    close(y, attention(*roped(q, k, d, 1e6), v, wo))
    y, q, k, v, wo = layer(tmp_path, {"model_type": "minimax", "layer_types": types, "rope_theta": 5e3,
                                      "sliding_window": 3})
    close(y, attention(*roped(q, k, d, 5e3), v, wo, window=3))


@pytest.mark.parametrize("flags", [(), ("--layout", "codegen")])
def test_minimax_lightning_layer_is_refused_by_name(tmp_path, flags):
    """A layer_types "linear_attention" layer (MiniMax's lightning
    attention: qkv_proj, out_proj, output_gate, norm; a decayed linear
    attention, no softmax) is refused naming it, also under a layout its
    names would fit (before: --layout codegen ran it as CodeGen's)."""
    rs = np.random.RandomState(3)
    p = "model.layers.1.self_attn."
    t = {p + "qkv_proj.weight": rnd(rs, 3 * D, D), p + "out_proj.weight": rnd(rs, D, D),
         p + "output_gate.weight": rnd(rs, D, D), p + "norm.weight": np.ones(D, np.float32)}
    cfg = {"model_type": "minimax", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H,
           "layer_types": ["full_attention", "linear_attention"]}
    _, r = run(tmp_path, t, cfg, "model.layers.1", D, *flags, check=False)
    refused(r, tmp_path, "linear_attention", "minimax")


# ---------------------------------------------------------- Ling (Bailing)


@pytest.mark.parametrize("rotary", [{"partial_rotary_factor": 0.5}, {"rotary_dim": 4}])
def test_ling_query_key_value_blocks(tmp_path, rotary):
    """Ling / Bailing (bailing_moe, BailingMoeAttention): query_key_value's
    rows are [h*d q; g*d k; g*d v] blocks (ChatGLM's), rotate_half on
    rotary_dim (else partial_rotary_factor x head_dim) dims at rope_theta,
    dense the output. Before: read as megatron's per-head [q, k, v] rows
    (3.1 off); --layout megatron is refused."""
    G2 = 2
    rs = np.random.RandomState(9)
    p = "model.layers.0.attention."
    w, wo = rnd(rs, (H + 2 * G2) * d, D), rnd(rs, D, H * d)
    t = {p + "query_key_value.weight": w, p + "dense.weight": wo}
    cfg = dict({"model_type": "bailing_moe", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G2,
                "rope_theta": 6e5, "use_qk_norm": False, "use_qkv_bias": False, "rms_norm_eps": 1e-6}, **rotary)
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = np.split(x @ w.T.astype(np.float64), [H * d, (H + G2) * d], -1)
    close(y, attention(*roped(heads(q, H), heads(k, G2), 4, 6e5), heads(v, G2), wo))
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, "--layout", "megatron", check=False)
    refused(r, tmp_path, "--layout megatron", "bailing_moe")


def rms_norm(a, w, eps):
    """Ling's RMSNorm of each head's vector: a / sqrt(mean(a^2) + eps) * w"""
    return a / np.sqrt((a * a).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("model_type", ["bailing_moe", "bailing_moe_v2"])
def test_ling_query_key_layernorm(tmp_path, model_type):
    """Ling with use_qk_norm (Ling 1.5 / Ring, bailing_moe; every Ling 2.0
    checkpoint, bailing_moe_v2: Ling-mini-2.0, Ling-flash-2.0, Ling-1T):
    query_layernorm / key_layernorm, an RMSNorm (d_k weights, eps
    rms_norm_eps) of each head after query_key_value's split and before
    rotate_half on partial_rotary_factor x head_dim dims. Before, the first
    was refused by name and the second ran without its norms, silently.
    use_qk_norm true without the tensors is refused; use_qk_norm false
    with a checkpoint without the norms runs the plain rotary layer."""
    G2, eps = 2, 1e-5
    rs = np.random.RandomState(11)
    p = "model.layers.0.attention."
    w, wo = rnd(rs, (H + 2 * G2) * d, D), rnd(rs, D, H * d)
    wq, wk = (1 + 0.5 * rs.randn(d)).astype(np.float32), (1 + 0.5 * rs.randn(d)).astype(np.float32)
    t = {p + "query_key_value.weight": w, p + "dense.weight": wo,
         p + "query_layernorm.weight": wq, p + "key_layernorm.weight": wk}
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G2,
           "head_dim": d, "rope_theta": 6e5, "partial_rotary_factor": 0.5, "use_qk_norm": True,
           "use_qkv_bias": False, "use_bias": False, "rms_norm_eps": eps}
    x, y = run(tmp_path, t, cfg, "model.layers.0", D)
    q, k, v = np.split(x @ w.T.astype(np.float64), [H * d, (H + G2) * d], -1)
    q, k = rms_norm(heads(q, H), wq, eps), rms_norm(heads(k, G2), wk, eps)
    close(y, attention(*roped(q, k, d // 2, 6e5), heads(v, G2), wo))
    # without its norm tensors: refused by name
    t2 = {n: a for n, a in t.items() if "layernorm" not in n}
    _, r = run(tmp_path, t2, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "use_qk_norm", "query_layernorm.weight")
    # use_qk_norm false, no norms: the plain rotary layer
    x, y = run(tmp_path, t2, dict(cfg, use_qk_norm=False), "model.layers.0", D)
    q, k, v = np.split(x @ w.T.astype(np.float64), [H * d, (H + G2) * d], -1)
    close(y, attention(*roped(heads(q, H), heads(k, G2), d // 2, 6e5), heads(v, G2), wo))


# ------------------------------------------------------------------- BitNet


def test_bitnet_is_refused_by_name(tmp_path):
    """BitNet b1.58 (bitnet, BitNetAttention): Llama's attention with an
    RMSNorm of the heads' output before o_proj (attn_sub_norm) and BitLinear
    projections (ternary weights, 8-bit activations), none expressible:
    refused by name. Before, its bf16 checkpoint ran as a Llama layer."""
    w, _, t = llama_like(np.random.RandomState(4), D, H, G)
    t["model.layers.0.self_attn.attn_sub_norm.weight"] = np.ones(D, np.float32)
    cfg = {"model_type": "bitnet", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 5e5}
    _, r = run(tmp_path, t, cfg, "model.layers.0", D, check=False)
    refused(r, tmp_path, "bitnet", "attn_sub_norm")


# ------------------------------------------- families found right: guards


@pytest.mark.parametrize("model_type", ["seed_oss", "arcee", "apertus", "hunyuan_v1_dense", "internlm3",
                                        "mistral", "mixtral", "starcoder2", "olmo2", "qwen3"])
def test_llama_like_families_rotate_the_whole_head(tmp_path, model_type):
    """Families whose attention is Llama's GQA with rotate_half on the
    whole head at rope_theta (their biases and q/k norms, absent here,
    are read from the checkpoint): they ran right and must stay so."""
    y, q, k, v, wo = layer(tmp_path, {"model_type": model_type, "rope_theta": 5e5})
    close(y, attention(*roped(q, k, d, 5e5), v, wo))
