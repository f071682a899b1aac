"""Gated attention through the binding (Layer(output_gate=True), w_g / b_g):
against a float64 numpy layer that gates each head's output by
sigmoid(x W_G + b_G) before W_O (its own code), on both paths, through the
KV cache one token at a time, saved and loaded, and from an hf checkpoint
whose q_proj holds each head's query then its gate (Layer.load(...,
output_gate=True)). Tolerance: 2e-5 of the output's scale."""
import numpy as np
import pytest

import mha

T, D, H, G, d = 6, 32, 4, 2, 8


def gated_layer(rs, bias=True):
    w = {"w_q": rs.randn(D, H * d), "w_k": rs.randn(D, G * d), "w_v": rs.randn(D, G * d),
         "w_o": rs.randn(H * d, D), "w_g": rs.randn(D, H * d)}
    if bias:
        w.update(b_q=rs.randn(H * d), b_k=rs.randn(G * d), b_v=rs.randn(G * d), b_o=rs.randn(D), b_g=rs.randn(H * d))
    w = {k: (v / np.sqrt(v.shape[0] if v.ndim == 2 else 4)).astype(np.float32) for k, v in w.items()}
    return mha.Layer(D, H, n_kv_heads=G, bias=bias, output_gate=True, weights=w), w


def oracle(w, x):
    """causal gated attention of x (B,T,D) in float64"""
    f = {k: v.astype(np.float64) for k, v in w.items()}
    b = lambda n, size: f.get(n, np.zeros(size))  # noqa: E731
    x = x.astype(np.float64)
    q = (x @ f["w_q"] + b("b_q", H * d)).reshape(*x.shape[:2], H, d)
    k = np.repeat((x @ f["w_k"] + b("b_k", G * d)).reshape(*x.shape[:2], G, d), H // G, 2)
    v = np.repeat((x @ f["w_v"] + b("b_v", G * d)).reshape(*x.shape[:2], G, d), H // G, 2)
    s = np.einsum("bthe,bshe->bhts", q, k) / np.sqrt(d)
    s = np.where(np.arange(x.shape[1])[None] > np.arange(x.shape[1])[:, None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    z = np.einsum("bhts,bshe->bthe", p / p.sum(-1, keepdims=True), v).reshape(*x.shape[:2], H * d)
    g = x @ f["w_g"] + b("b_g", H * d)
    return (z / (1 + np.exp(-g))) @ f["w_o"] + b("b_o", D)


def close(y, want):
    assert np.abs(y - want).max() <= 2e-5 * max(1.0, np.abs(want).max()), np.abs(y - want).max()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("path", ["reference", "fast"])
def test_gated_layer_against_numpy(bias, path):
    rs = np.random.RandomState(3)
    layer, w = gated_layer(rs, bias)
    x = rs.randn(2, T, D).astype(np.float32)
    close(layer.forward(x, causal=True, path=path), oracle(w, x))
    assert set(layer.weights()) >= {"w_g"} and ("b_g" in layer.weights()) == bias


def test_gated_layer_cache_and_file(tmp_path):
    rs = np.random.RandomState(5)
    layer, w = gated_layer(rs)
    x = rs.randn(2, T, D).astype(np.float32)
    want = oracle(w, x)
    cache = mha.Cache(layer, batch=2, capacity=16)
    ys = [cache.forward(layer, x[:, :3])] + [cache.forward(layer, x[:, t:t + 1]) for t in range(3, T)]
    close(np.concatenate(ys, 1), want)
    layer.save(tmp_path / "g.safetensors")
    again = mha.Layer.load(tmp_path / "g.safetensors")
    assert again.config["output_gate"] == 1
    close(again.forward(x, causal=True), want)


@pytest.mark.parametrize("bias", [False, True])
def test_hf_gated_q_proj_loads_with_output_gate(tmp_path, bias):
    """Qwen3-Next's q_proj: per head, d query rows then d gate rows (out, in),
    and its bias (when the layer has biases) split alike"""
    rs = np.random.RandomState(7)
    _, w = gated_layer(rs, bias=bias)
    q = np.concatenate([np.stack([w["w_q"][:, r * d:(r + 1) * d].T, w["w_g"][:, r * d:(r + 1) * d].T])
                        .reshape(2 * d, D) for r in range(H)])
    from io_helpers import write_safetensors
    p = "model.layers.0.self_attn."
    t = {p + "q_proj.weight": q, p + "k_proj.weight": w["w_k"].T.copy(), p + "v_proj.weight": w["w_v"].T.copy(),
         p + "o_proj.weight": w["w_o"].T.copy()}
    if bias:
        t[p + "q_proj.bias"] = np.concatenate([np.concatenate([w["b_q"][r * d:(r + 1) * d], w["b_g"][r * d:(r + 1) * d]])
                                               for r in range(H)])
        t.update({p + "k_proj.bias": w["b_k"], p + "v_proj.bias": w["b_v"], p + "o_proj.bias": w["b_o"]})
    write_safetensors(tmp_path / "m.safetensors", t)
    layer = mha.Layer.load(tmp_path / "m.safetensors", n_heads=H, n_kv_heads=G, output_gate=True)
    x = rs.randn(1, T, D).astype(np.float32)
    close(layer.forward(x, causal=True), oracle(w, x))
    with pytest.raises(mha.ArgumentError, match="output_gate = 1 with the native layout"):
        layer.save(tmp_path / "n.safetensors")
        mha.Layer.load(tmp_path / "n.safetensors", output_gate=True)


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_gated_layer_with_compact_weights(tmp_path, dtype):
    """W_G is stored like the other projections: the oracle on the stored
    values (the layer's weights()), decode steps and a saved file agree."""
    layer, w = gated_layer(np.random.RandomState(1))
    layer.convert_weights(dtype)
    stored = {k: v.astype(np.float32) for k, v in layer.weights().items() if k in w}
    assert 0 < np.abs(stored["w_g"] - w["w_g"]).max() < 0.05  # W_G rounded too
    x = np.random.RandomState(2).randn(1, T, D).astype(np.float32)
    close(layer.forward(x, causal=True), oracle(stored, x))
    cache = mha.Cache(layer, 1, T)
    steps = np.concatenate([cache.forward(x[:, t:t + 1]) for t in range(T)], axis=1)
    close(steps, oracle(stored, x))
    layer.save(tmp_path / "g.safetensors")
    again = mha.Layer.load(tmp_path / "g.safetensors")
    assert again.weights_dtype == dtype
    close(again.forward(x, causal=True), oracle(stored, x))
    with pytest.raises(mha.UnsupportedError, match="bf16_matmul=1 with an output gate"):
        layer.forward(x, bf16_matmul=True)


def test_gated_layer_refusals():
    with pytest.raises(mha.ArgumentError, match="weights.w_g is NULL"):
        mha.Layer(D, H, output_gate=True, weights={"w_q": np.zeros((D, D), np.float32),
                                                    "w_k": np.zeros((D, D), np.float32),
                                                    "w_v": np.zeros((D, D), np.float32),
                                                    "w_o": np.zeros((D, D), np.float32),
                                                    "b_q": np.zeros(D, np.float32), "b_k": np.zeros(D, np.float32),
                                                    "b_v": np.zeros(D, np.float32), "b_o": np.zeros(D, np.float32)})
