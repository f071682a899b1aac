"""Qwen 1, ChatGLM 2/3 and CodeGen: three families whose fused q/k/v rows
the loaders had refused. Each small checkpoint is written under the names
its family saves, with its real config.json keys, run by `mha run` with no
flag but --prefix and --causal, and loaded by Python's Layer.load with the
layout named; both against a float64 numpy oracle that splits the fused
weight as the family's modeling code does (QWenAttention: c_attn's output
split in thirds; ChatGLM's SelfAttention: [h*d | g*d | g*d]; CodeGen's
forward: mp_num = 4 blocks of [q | v | k]). Inconsistent shapes are refused
with a message naming the tensor or key."""
import numpy as np
import pytest

from io_helpers import mha, write_safetensors
from test_probe_families import T, attention, close, heads, refused, rnd, run
from test_probe_hf_layouts import rotate  # RoPE at positions 0..T-1, halves or interleaved


def load(tmp_path, layout, prefix, **kw):
    """Python's Layer.load of the checkpoint run() wrote: the weights only"""
    from mha import Layer
    return Layer.load(str(tmp_path / "model.safetensors"), layout=layout, prefix=prefix, config_json="ignore", **kw)


def plain(layer, x):
    """the loaded layer's causal output on x (T, D), no rotary"""
    return layer.forward(x[None].astype(np.float32), causal=True)[0]


# ------------------------------------------------------------------ Qwen 1

QP = "transformer.h.0.attn."


def qwen1(rs, D, H, bias=True):
    """c_attn (3E, E) nn.Linear with its bias, c_proj (E, E) without (no_bias)"""
    w, b, wo = rnd(rs, 3 * D, D), rnd(rs, 1, 3 * D)[0] * bias, rnd(rs, D, D)
    t = {QP + "c_attn.weight": w, QP + "c_proj.weight": wo}
    if bias:
        t[QP + "c_attn.bias"] = b
    return w, b, wo, t


def qwen1_qkv(x, w, b, H):
    """QWenAttention: c_attn(x).split(hidden_size), each (T, H, d) by _split_heads"""
    q, k, v = np.split(x @ w.T + b, 3, axis=-1)
    return heads(q, H), heads(k, H), heads(v, H)


@pytest.mark.parametrize("pct", [1.0, 0.5])
def test_qwen1_c_attn_thirds_rotate_halves(tmp_path, pct):
    """Qwen 1 (model_type qwen): nn.Linear c_attn's rows are [q; k; v]
    (not GPT-BigCode's per-head rows, which the gpt2 layout reads from
    these names), rotate_half on kv_channels * rotary_pct dims with
    rotary_emb_base. Before: refused by its config.json."""
    D, H = 32, 4
    w, b, wo, t = qwen1(np.random.RandomState(31), D, H)
    cfg = {"model_type": "qwen", "hidden_size": D, "num_attention_heads": H, "kv_channels": D // H,
           "rotary_emb_base": 5000, "rotary_pct": pct, "seq_length": 64, "no_bias": True}
    x, y = run(tmp_path, t, cfg, "transformer.h.0", D)
    q, k, v = qwen1_qkv(x, w, b, H)
    r = int(D // H * pct)
    close(y, attention(rotate(q, r, 5000, "halves"), rotate(k, r, 5000, "halves"), v, wo))
    close(plain(load(tmp_path, "hf", "transformer.h.0", n_heads=H), x), attention(q, k, v, wo))


def test_qwen1_past_seq_length_refused(tmp_path):
    """Past seq_length keys Qwen 1 raises its base (use_dynamic_ntk) and
    scales q by log(position) (use_logn_attn, both on by QWenConfig's
    defaults): refused, naming seq_length; with both false it runs."""
    D, H = 32, 4
    w, b, wo, t = qwen1(np.random.RandomState(32), D, H)
    cfg = {"model_type": "qwen", "hidden_size": D, "num_attention_heads": H, "kv_channels": D // H,
           "rotary_emb_base": 10000, "seq_length": T - 1}
    _, r = run(tmp_path, t, cfg, "transformer.h.0", D, check=False)
    refused(r, tmp_path, "seq_length", "use_logn_attn")
    x, y = run(tmp_path, t, dict(cfg, use_dynamic_ntk=False, use_logn_attn=False), "transformer.h.0", D)
    q, k, v = qwen1_qkv(x, w, b, H)
    close(y, attention(rotate(q, 8, 1e4, "halves"), rotate(k, 8, 1e4, "halves"), v, wo))
    x, y = run(tmp_path, t, dict(cfg, seq_length=T), "transformer.h.0", D)  # T keys: not past it
    close(y, attention(rotate(q, 8, 1e4, "halves"), rotate(k, 8, 1e4, "halves"), v, wo))


def test_qwen1_refusals_named(tmp_path):
    """--layout gpt2 (GPT-BigCode's rows) with Qwen's config.json is refused
    naming the layout; a c_attn of other rows than 3E is refused naming it."""
    D, H = 32, 4
    w, b, wo, t = qwen1(np.random.RandomState(33), D, H)
    cfg = {"model_type": "qwen", "hidden_size": D, "num_attention_heads": H, "kv_channels": D // H,
           "seq_length": 64}
    _, r = run(tmp_path, t, cfg, "transformer.h.0", D, "--layout", "gpt2", check=False)
    refused(r, tmp_path, "--layout gpt2", "hf")
    assert r.returncode == 2
    t[QP + "c_attn.weight"], t[QP + "c_attn.bias"] = w[:-8], b[:-8]
    _, r = run(tmp_path, t, cfg, "transformer.h.0", D, check=False)
    refused(r, tmp_path, "c_attn.weight")


# ----------------------------------------------------------- ChatGLM 2 / 3

GP = "transformer.encoder.layers.0.self_attention."


def chatglm(rs, D, H, G, d):
    """query_key_value ((H + 2G) d, D) with its bias (add_qkv_bias), dense (D, H d) without"""
    w, b, wo = rnd(rs, (H + 2 * G) * d, D), rnd(rs, 1, (H + 2 * G) * d)[0], rnd(rs, D, H * d)
    return w, b, wo, {GP + "query_key_value.weight": w, GP + "query_key_value.bias": b, GP + "dense.weight": wo}


def glm_cfg(D, H, G, d, **kw):
    return dict({"model_type": "chatglm", "hidden_size": D, "num_attention_heads": H, "kv_channels": d,
                 "multi_query_attention": True, "multi_query_group_num": G, "rope_ratio": 2,
                 "add_qkv_bias": True, "add_bias_linear": False, "original_rope": True, "seq_length": 32}, **kw)


def test_chatglm_multi_query_blocks_rotate_half_each_head_in_pairs(tmp_path):
    """ChatGLM 2/3 (SelfAttention): query_key_value splits into [h*d | g*d |
    g*d] (multi_query_group_num kv heads); apply_rotary_pos_emb rotates the
    first d/2 dims of each head in pairs (2i, 2i+1), frequencies of
    RotaryEmbedding(d/2) with base 10000 * rope_ratio. Before: refused."""
    D, H, G, d = 64, 4, 2, 16
    w, b, wo, t = chatglm(np.random.RandomState(34), D, H, G, d)
    x, y = run(tmp_path, t, glm_cfg(D, H, G, d), "transformer.encoder.layers.0", D)
    q, k, v = np.split(x @ w.T + b, [H * d, (H + G) * d], axis=-1)
    q, k, v = heads(q, H), heads(k, G), heads(v, G)
    close(y, attention(rotate(q, d // 2, 2e4, "interleaved"), rotate(k, d // 2, 2e4, "interleaved"), v, wo))
    close(plain(load(tmp_path, "hf", "transformer.encoder.layers.0", n_heads=H, n_kv_heads=G), x),
          attention(q, k, v, wo))


def test_chatglm_without_multi_query_keeps_per_head_rows(tmp_path):
    """multi_query_attention false: the (3 h d) rows are viewed (h, 3d) and
    split per head, [q_r; k_r; v_r] (megatron's rows with h_kv = h)."""
    D, H, d = 32, 4, 8
    w, b, wo, t = chatglm(np.random.RandomState(35), D, H, H, d)
    cfg = glm_cfg(D, H, H, d, multi_query_attention=False)
    del cfg["rope_ratio"]  # ChatGLM 2's first configs: base 10000
    x, y = run(tmp_path, t, cfg, "transformer.encoder.layers.0", D)
    per_head = (x @ w.T + b).reshape(T, H, 3 * d).transpose(1, 0, 2)
    q, k, v = per_head[..., :d], per_head[..., d:2 * d], per_head[..., 2 * d:]
    close(y, attention(rotate(q, d // 2, 1e4, "interleaved"), rotate(k, d // 2, 1e4, "interleaved"), v, wo))


def test_chatglm_refusals_named(tmp_path):
    """Refused, naming what is wrong: rows that do not fit
    multi_query_group_num, --layout megatron against a multi-query config,
    ChatGLM-6B's position_encoding_2d, a head of d/2 odd dims."""
    D, H, G, d = 64, 4, 2, 16
    w, b, wo, t = chatglm(np.random.RandomState(36), D, H, 1, d)  # one kv head's rows
    _, r = run(tmp_path, t, glm_cfg(D, H, G, d), "transformer.encoder.layers.0", D, check=False)
    refused(r, tmp_path, "query_key_value.weight")
    w, b, wo, t = chatglm(np.random.RandomState(36), D, H, G, d)
    _, r = run(tmp_path, t, glm_cfg(D, H, G, d), "transformer.encoder.layers.0", D, "--layout", "megatron",
               check=False)
    refused(r, tmp_path, "--layout megatron", "chatglm")
    _, r = run(tmp_path, t, glm_cfg(D, H, G, d, position_encoding_2d=True), "transformer.encoder.layers.0", D,
               check=False)
    refused(r, tmp_path, "position_encoding_2d")
    D, H, G, d = 24, 4, 2, 6  # rotary over d/2 = 3 dims
    w, b, wo, t = chatglm(np.random.RandomState(37), D, H, G, d)
    _, r = run(tmp_path, t, glm_cfg(D, H, G, d), "transformer.encoder.layers.0", D, check=False)
    refused(r, tmp_path, "chatglm", "rotated dims")


# ------------------------------------------------------------------ CodeGen

CP = "transformer.h.0.attn."


def codegen_qkv(x, w, H):
    """CodeGenAttention.forward: qkv reshaped (T, mp_num = 4, -1), split in
    local_dim parts [query | value | key], each _split_heads'd to (H, T, d)"""
    blocks = (x @ w.T).reshape(T, 4, -1)
    q, v, k = np.split(blocks, 3, axis=-1)
    return tuple(a.reshape(T, H, -1).transpose(1, 0, 2) for a in (q, k, v))


@pytest.mark.parametrize("rotary_dim", [4, None])
def test_codegen_blocks_of_q_v_k_rotate_every_two(tmp_path, rotary_dim):
    """CodeGen: qkv_proj's rows in mp_num = 4 blocks, each [q; v; k] of its
    h/4 heads; rotate_every_two (GPT-J's pairs) on rotary_dim dims (the
    whole head when null), base 10000; scores / sqrt(head_dim); no biases.
    Before: no layout fit its names."""
    D, H = 64, 8
    rs = np.random.RandomState(38)
    w, wo = rnd(rs, 3 * D, D), rnd(rs, D, D)
    t = {CP + "qkv_proj.weight": w, CP + "out_proj.weight": wo, CP + "causal_mask": np.ones((4, 4), np.uint8)}
    cfg = {"model_type": "codegen", "n_embd": D, "n_head": H, "rotary_dim": rotary_dim, "n_positions": 64,
           "n_ctx": 64}
    x, y = run(tmp_path, t, cfg, "transformer.h.0", D)
    q, k, v = codegen_qkv(x, w, H)
    r = rotary_dim or D // H
    close(y, attention(rotate(q, r, 1e4, "interleaved"), rotate(k, r, 1e4, "interleaved"), v, wo))
    close(plain(load(tmp_path, "codegen", "transformer.h.0", n_heads=H), x), attention(q, k, v, wo))
    # without config.json: --layout codegen and --heads say it; the names alone fit no layout
    (tmp_path / "config.json").unlink()
    (tmp_path / "y.npy").unlink()
    mha("run", "--weights", tmp_path / "model.safetensors", "--layout", "codegen", "--heads", H, "--rope",
        "interleaved", "--rope-dim", r, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--causal")
    close(np.load(tmp_path / "y.npy"), attention(rotate(q, r, 1e4, "interleaved"), rotate(k, r, 1e4,
                                                                                             "interleaved"), v, wo))
    p = mha("run", "--weights", tmp_path / "model.safetensors", "--heads", H, "--input", tmp_path / "x.npy",
            "--output", tmp_path / "z.npy", check=False)
    assert p.returncode == 1 and "--layout codegen" in p.stderr, p.stderr


def test_codegen_refusals_named(tmp_path):
    """Refused, naming it: heads that are no multiple of mp_num = 4, a bias
    (CodeGen has none), --layout hf against its config.json, an out_proj of
    another width."""
    D, H = 48, 6
    rs = np.random.RandomState(39)
    t = {CP + "qkv_proj.weight": rnd(rs, 3 * D, D), CP + "out_proj.weight": rnd(rs, D, D)}
    cfg = {"model_type": "codegen", "n_embd": D, "n_head": H, "rotary_dim": 4}
    _, r = run(tmp_path, t, cfg, "transformer.h.0", D, check=False)
    refused(r, tmp_path, "mp_num")
    D, H = 32, 4
    t = {CP + "qkv_proj.weight": rnd(rs, 3 * D, D), CP + "out_proj.weight": rnd(rs, D, D),
         CP + "qkv_proj.bias": rnd(rs, 1, 3 * D)[0]}
    cfg = {"model_type": "codegen", "n_embd": D, "n_head": H, "rotary_dim": 4}
    _, r = run(tmp_path, t, cfg, "transformer.h.0", D, check=False)
    refused(r, tmp_path, "qkv_proj.bias")
    del t[CP + "qkv_proj.bias"]
    _, r = run(tmp_path, t, cfg, "transformer.h.0", D, "--layout", "hf", check=False)
    refused(r, tmp_path, "--layout hf", "codegen")
    t[CP + "out_proj.weight"] = rnd(rs, D, D - 4)
    _, r = run(tmp_path, t, cfg, "transformer.h.0", D, check=False)
    refused(r, tmp_path, "out_proj.weight")


# -------------------------------------------------------------------- LFM2

def rms_heads(a, w, eps):
    """Lfm2RMSNorm of each head's (T, d) rows: x / sqrt(mean(x^2) + eps) * w"""
    return a / np.sqrt((a.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("G", [4, 2, 1])
def test_lfm2_attention_layer(tmp_path, G):
    """LFM2 (model_type lfm2, Lfm2Attention): q/k/v_proj and out_proj without
    bias, q_layernorm / k_layernorm an RMSNorm of each head (d weights, no
    bias, norm_eps) before rotate_half RoPE on the whole head (rope_theta).
    Before: refused as a norm of unknown kind. The conv layers have no
    attention: --prefix names a full_attention layer."""
    D, H, d = 32, 4, 8
    rs = np.random.RandomState(41 + G)
    p = "model.layers.2.self_attn."
    wq, wk, wv, wo = rnd(rs, H * d, D), rnd(rs, G * d, D), rnd(rs, G * d, D), rnd(rs, D, H * d)
    qn, kn = (1 + 0.3 * rs.randn(d)).astype(np.float32), (1 + 0.3 * rs.randn(d)).astype(np.float32)
    t = {p + "q_proj.weight": wq, p + "k_proj.weight": wk, p + "v_proj.weight": wv, p + "out_proj.weight": wo,
         p + "q_layernorm.weight": qn, p + "k_layernorm.weight": kn,
         "model.layers.0.conv.in_proj.weight": rnd(rs, 3 * D, D)}  # a short-conv layer beside it
    cfg = {"model_type": "lfm2", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e6, "norm_eps": 1e-3, "layer_types": ["conv", "conv", "full_attention"]}
    x, y = run(tmp_path, t, cfg, "model.layers.2", D)
    q = rms_heads(heads(x @ wq.T.astype(np.float64), H), qn, 1e-3)
    k = rms_heads(heads(x @ wk.T.astype(np.float64), G), kn, 1e-3)
    v = heads(x @ wv.T.astype(np.float64), G)
    want = attention(rotate(q, d, 1e6, "halves"), rotate(k, d, 1e6, "halves"), v, wo)
    close(y, want)
    # the norm matters (eps 1e-3 against the library's default too): without it, another layer
    nonorm = attention(rotate(heads(x @ wq.T.astype(np.float64), H), d, 1e6, "halves"),
                       rotate(heads(x @ wk.T.astype(np.float64), G), d, 1e6, "halves"), v, wo)
    assert np.abs(want - nonorm).max() > 1e-2
    # a biased q_layernorm (Phi's LayerNorm) stays refused
    t[p + "q_layernorm.bias"] = np.zeros(d, np.float32)
    _, r = run(tmp_path, t, cfg, "model.layers.2", D, check=False)
    refused(r, tmp_path, "q_layernorm", "with a bias")


# -------------------------------------------------------------- Nemotron-H

@pytest.mark.parametrize("model_type", ["nemotron_h", "jamba"])
@pytest.mark.parametrize("theta", [None, 10000])
def test_nemotron_h_attention_has_no_rotary(tmp_path, theta, model_type):
    """Nemotron-H (model_type nemotron_h, NemotronHAttention): GQA with no
    positional embedding (its Mamba layers order the tokens), under
    backbone.layers.N.mixer. A rope_theta in config.json rotates nothing:
    before, mha run applied it (1.7 off)."""
    D, H, G, d = 32, 4, 2, 16
    rs = np.random.RandomState(51)
    p = "backbone.layers.3.mixer."
    wq, wk, wv, wo = rnd(rs, H * d, D), rnd(rs, G * d, D), rnd(rs, G * d, D), rnd(rs, D, H * d)
    t = {p + "q_proj.weight": wq, p + "k_proj.weight": wk, p + "v_proj.weight": wv, p + "o_proj.weight": wo,
         "backbone.layers.0.mixer.in_proj.weight": rnd(rs, 8, D)}  # a Mamba layer beside it
    cfg = {"model_type": model_type, "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "head_dim": d, "hybrid_override_pattern": "M-M*"}  # Jamba (JambaAttention, which Nemotron-H's extends)
    if theta:
        cfg["rope_theta"] = theta
    x, y = run(tmp_path, t, cfg, "backbone.layers.3.mixer", D)
    close(y, attention(heads(x @ wq.T.astype(np.float64), H), heads(x @ wk.T.astype(np.float64), G),
                       heads(x @ wv.T.astype(np.float64), G), wo))


# -------------------------------------------------------------------- Bamba

@pytest.mark.parametrize("factor", [None, 1.0])
def test_bamba_rotates_half_of_each_head(tmp_path, factor):
    """Bamba (model_type bamba): BambaConfig sets partial_rotary_factor to
    0.5 whatever config.json says (rotate_half on the first half of each
    head, rope_theta), its attention's GQA otherwise Llama's. Before, a
    config.json without the key (or saying 1.0) rotated the whole head."""
    D, H, G, d = 32, 4, 2, 8  # head_dim = hidden_size / heads (no head_dim key)
    rs = np.random.RandomState(61)
    p = "model.layers.1.self_attn."
    wq, wk, wv, wo = rnd(rs, H * d, D), rnd(rs, G * d, D), rnd(rs, G * d, D), rnd(rs, D, H * d)
    t = {p + "q_proj.weight": wq, p + "k_proj.weight": wk, p + "v_proj.weight": wv, p + "o_proj.weight": wo}
    cfg = {"model_type": "bamba", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G,
           "rope_theta": 1e4, "attn_rotary_emb": d // 2, "attn_layer_indices": [1]}
    if factor:
        cfg["partial_rotary_factor"] = factor
    x, y = run(tmp_path, t, cfg, "model.layers.1", D)
    q, k = heads(x @ wq.T.astype(np.float64), H), heads(x @ wk.T.astype(np.float64), G)
    close(y, attention(rotate(q, d // 2, 1e4, "halves"), rotate(k, d // 2, 1e4, "halves"),
                       heads(x @ wv.T.astype(np.float64), G), wo))
