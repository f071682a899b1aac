"""Today's attention variants against PyTorch code written from each model
family's published formulas: Hugging Face Llama's rotate_half (GQA, theta
500000), GPT-J's rotate_every_two (partial rotary), BLOOM's ALiBi slope rule
and its bias slope * key position, Gemma 2's soft-cap, gpt-oss's sink
column, and Qwen 3's per-head RMSNorm of q and k. Each is a full forward of
the binding (reference and fast paths) against float64 torch."""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402

B, T, D = 2, 13, 32


def rotate_half(x):  # Hugging Face Llama / GPT-NeoX
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):  # GPT-J
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rope(x, pos, dim, theta, interleaved, inv_freq=None, mscale=1.0):
    """x (B,heads,T,d_k); the first dim dims rotated at positions pos (B,T);
    inv_freq (dim/2) and mscale (cos, sin multiplied) for scaled variants."""
    if inv_freq is None:
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = pos[:, None, :, None].double() * inv_freq  # (B,1,T,dim/2)
    if interleaved:
        emb = freqs.repeat_interleave(2, dim=-1)
        rot = rotate_every_two
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
        rot = rotate_half
    xr, xp = x[..., :dim], x[..., dim:]
    return torch.cat((xr * emb.cos() * mscale + rot(xr) * emb.sin() * mscale, xp), dim=-1)


def alibi_slopes(n):  # the ALiBi paper's rule, as BLOOM computes it
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_2(p) + alibi_slopes(2 * p)[0::2][: n - p]


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def torch_attention(w, x, h, h_kv, d_k, pos=None, rope=None, slopes=None, softcap=0.0, sinks=None,
                    qk_norm=None, streaming=None, qk_norm_whole=None, scale=None, clip=None):
    """Causal self-attention in float64. w: (in, out) weights as mha stores them."""
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    x = torch.tensor(x, dtype=torch.float64)
    Bn, Tn, _ = x.shape
    q, k, v = x @ t["w_q"], x @ t["w_k"], x @ t["w_v"]
    if clip is not None:  # OLMo 1 / DBRX / MPT: q, k, v = .clamp(min=-clip_qkv, max=clip_qkv)
        q, k, v = q.clamp(min=-clip, max=clip), k.clamp(min=-clip, max=clip), v.clamp(min=-clip, max=clip)
    if qk_norm_whole is not None:  # OLMo 2: RMSNorm over the whole projection, before the heads split
        q, k = rms_norm(q, t["q_norm"], qk_norm_whole), rms_norm(k, t["k_norm"], qk_norm_whole)
    q = q.view(Bn, Tn, h, d_k).transpose(1, 2)
    k = k.view(Bn, Tn, h_kv, d_k).transpose(1, 2)
    v = v.view(Bn, Tn, h_kv, -1).transpose(1, 2)
    if qk_norm is not None:  # Qwen 3: RMSNorm over each head's d_k, one weight shared by the heads
        q, k = rms_norm(q, t["q_norm"], qk_norm), rms_norm(k, t["k_norm"], qk_norm)
    pos = torch.arange(Tn).expand(Bn, Tn) if pos is None else torch.tensor(pos)
    if rope is not None:
        q = apply_rope(q, pos, *rope)
        k = apply_rope(k, pos, *rope)
    k = k.repeat_interleave(h // h_kv, dim=1)
    v = v.repeat_interleave(h // h_kv, dim=1)
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(d_k) if scale is None else scale)
    if softcap:  # Gemma 2
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:  # BLOOM: + slope * key position (a constant per row apart)
        s = s + torch.tensor(slopes, dtype=torch.float64)[None, :, None, None] * pos[:, None, None, :].double()
    i, j = torch.arange(Tn)[:, None], torch.arange(Tn)[None, :]
    allowed = j <= i
    if streaming is not None:  # StreamingLLM: the attention sinks (first n) plus the last `window` keys
        window, n_sink = streaming
        allowed &= (j > i - window) | (j < n_sink)
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:  # gpt-oss: a sink column joins the softmax and is dropped
        col = torch.tensor(sinks, dtype=torch.float64)[None, :, None, None].expand(Bn, h, Tn, 1)
        p = torch.softmax(torch.cat((s, col), dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    z = (p @ v).transpose(1, 2).reshape(Bn, Tn, -1)
    return (z @ t["w_o"]).numpy()


def random_weights(rng, h, h_kv, d_k, **extra):
    w = {"w_q": rng.uniform(-0.4, 0.4, (D, h * d_k)), "w_k": rng.uniform(-0.4, 0.4, (D, h_kv * d_k)),
         "w_v": rng.uniform(-0.4, 0.4, (D, h_kv * d_k)), "w_o": rng.uniform(-0.4, 0.4, (h * d_k, D))}
    w.update(extra)
    return {k: np.asarray(v, dtype=np.float32) for k, v in w.items()}


def check_paths(layer, x, want, **options):
    for path in ("reference", "fast"):
        y = layer.forward(x, causal=True, path=path, **options)
        np.testing.assert_allclose(y, want, atol=2e-5, err_msg=path)


def test_llama_style_gqa_rope_halves():
    rng = np.random.default_rng(1)
    w = random_weights(rng, 4, 2, 8)
    layer = mha.Layer(D, 4, n_kv_heads=2, d_k=8, bias=False, weights=w,
                      rope={"pairing": "halves", "theta": 500000})
    x = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    check_paths(layer, x, torch_attention(w, x, 4, 2, 8, rope=(8, 500000.0, False)))
    pos = (np.arange(T)[None, :] * 2 + np.array([[0], [100]])).astype(np.int32)  # offset sequences
    check_paths(layer, x, torch_attention(w, x, 4, 2, 8, pos=pos, rope=(8, 500000.0, False)), positions=pos)
    # the other pairing is a different function: the test can tell them apart
    other = mha.Layer(D, 4, n_kv_heads=2, d_k=8, bias=False, weights=w,
                      rope={"pairing": "interleaved", "theta": 500000})
    assert np.abs(other.forward(x, causal=True) - torch_attention(w, x, 4, 2, 8, rope=(8, 500000.0, False))).max() > 1e-3


def test_gptj_style_partial_interleaved():
    rng = np.random.default_rng(2)
    w = random_weights(rng, 4, 4, 8)
    layer = mha.Layer(D, 4, d_k=8, bias=False, weights=w, rope={"pairing": "interleaved", "dim": 4})
    x = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    check_paths(layer, x, torch_attention(w, x, 4, 4, 8, rope=(4, 10000.0, True)))


@pytest.mark.parametrize("h", [4, 6, 12])
def test_bloom_style_alibi(h):
    rng = np.random.default_rng(3 + h)
    d_k = 4
    w = random_weights(rng, h, h, d_k)
    layer = mha.Layer(D, h, d_k=d_k, bias=False, weights=w, alibi=True)
    np.testing.assert_allclose(layer.weights()["alibi_slopes"], alibi_slopes(h), rtol=1e-7)
    assert np.array_equal(mha.alibi_slopes(h), layer.weights()["alibi_slopes"])  # the public function's bits
    x = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    check_paths(layer, x, torch_attention(w, x, h, h, d_k, slopes=alibi_slopes(h)))


def test_alibi_slopes_refuses_no_heads():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(mha.ArgumentError, match="n_heads"):
            mha.alibi_slopes(bad)


def test_gemma2_softcap_and_gpt_oss_sinks():
    rng = np.random.default_rng(4)
    sinks = rng.uniform(-1, 2, 4).astype(np.float32)
    w = random_weights(rng, 4, 2, 8, sinks=sinks)
    x = rng.uniform(-2, 2, (B, T, D)).astype(np.float32)
    layer = mha.Layer(D, 4, n_kv_heads=2, d_k=8, bias=False, weights=w, softcap=0.7, sinks=True)
    check_paths(layer, x, torch_attention(w, x, 4, 2, 8, softcap=0.7, sinks=sinks))
    plain = {k: v for k, v in w.items() if k != "sinks"}
    capped = mha.Layer(D, 4, n_kv_heads=2, d_k=8, bias=False, weights=plain, softcap=0.7)
    check_paths(capped, x, torch_attention(w, x, 4, 2, 8, softcap=0.7))


def test_qwen3_style_qk_rmsnorm_with_rope():
    rng = np.random.default_rng(5)
    w = random_weights(rng, 4, 2, 8, q_norm=rng.uniform(0.5, 1.5, 8), k_norm=rng.uniform(0.5, 1.5, 8))
    layer = mha.Layer(D, 4, n_kv_heads=2, d_k=8, bias=False, weights=w, qk_norm="rms", qk_norm_eps=1e-6,
                      rope={"pairing": "halves", "theta": 1000000})
    x = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    check_paths(layer, x, torch_attention(w, x, 4, 2, 8, rope=(8, 1000000.0, False), qk_norm=1e-6))


def test_olmo1_dbrx_clip_qkv():
    """clip_qkv clamps q, k and v (bias included) before RoPE; both paths
    equal torch's clamp, which changes y here (about half are clamped)."""
    layer, w, h_kv, targs, rng = family_layer("olmo1_dbrx", 21)
    x = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    assert 0.3 < np.mean(np.abs(x @ w["w_q"]) > 0.5) < 0.7
    want = torch_attention(w, x, 4, h_kv, 8, **targs)
    check_paths(layer, x, want)
    assert np.abs(want - torch_attention(w, x, 4, h_kv, 8, rope=targs["rope"])).max() > 1e-2
    assert layer.config["clip_qkv"] == 0.5


def test_permuted_heads_keep_y_and_s_labels_travel():
    rng = np.random.default_rng(6)
    w = random_weights(rng, 4, 4, 8, sinks=rng.uniform(-1, 1, 4))
    layer = mha.Layer(D, 4, d_k=8, bias=False, weights=w, alibi=True, sinks=True,
                      rope={"pairing": "halves"})
    x = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    y0 = layer.forward(x, causal=True)
    layer.permute_heads([3, 1, 0, 2])
    np.testing.assert_allclose(layer.forward(x, causal=True), y0, atol=1e-5)
    assert layer.labels("s") == [3, 1, 0, 2]


def test_strict_arguments():
    with pytest.raises(mha.ArgumentError, match="rope keys"):
        mha.Layer(D, 4, rope={"pairing": "halves", "base": 10000})
    with pytest.raises(mha.ArgumentError, match="pairing"):
        mha.Layer(D, 4, rope={"pairing": "sideways"})
    with pytest.raises(mha.ArgumentError, match="qk_norm"):
        mha.Layer(D, 4, qk_norm="batch")
    layer = mha.Layer(D, 4, rope={"pairing": "halves"})
    x = np.zeros((1, 3, D), dtype=np.float32)
    with pytest.raises(mha.ArgumentError, match="dtype"):
        layer.forward(x, positions=np.zeros((1, 3)))
    with pytest.raises(mha.ShapeError, match="positions"):
        layer.forward(x, positions=np.zeros((1, 4), dtype=np.int32))
    with pytest.raises(mha.MhaError, match="positions"):
        layer.forward(x, positions=np.array([[0, -1, 2]]))


FAMILIES = {  # layer arguments, torch_attention arguments, extra weights
    "llama": (dict(n_kv_heads=2, rope={"pairing": "halves", "theta": 500000}), dict(rope=(8, 500000.0, False))),
    "gptj": (dict(rope={"pairing": "interleaved", "dim": 4}), dict(rope=(4, 10000.0, True))),
    "bloom": (dict(alibi=True), dict(slopes=alibi_slopes(4))),
    "gemma2_gpt_oss": (dict(n_kv_heads=2, softcap=0.7, sinks=True), dict(softcap=0.7, sinks="sinks")),
    "qwen3": (dict(n_kv_heads=2, qk_norm="rms", qk_norm_eps=1e-6, rope={"pairing": "halves", "theta": 1e6}),
              dict(rope=(8, 1e6, False), qk_norm=1e-6)),
    "olmo2": (dict(n_kv_heads=2, qk_norm="rms", qk_norm_whole=True, rope={"pairing": "halves", "theta": 500000}),
              dict(rope=(8, 500000.0, False), qk_norm_whole=1e-6)),
    "olmo1_dbrx": (dict(n_kv_heads=2, clip_qkv=0.5, rope={"pairing": "halves", "theta": 10000}),
                   dict(rope=(8, 10000.0, False), clip=0.5)),  # about half of q, k, v clamped
}


def family_layer(name, seed):
    rng = np.random.default_rng(seed)
    kwargs, targs = FAMILIES[name]
    h_kv = kwargs.get("n_kv_heads", 4)
    whole = kwargs.get("qk_norm_whole", False)  # OLMo 2: (h*d_k) and (h_kv*d_k) norm weights
    extra = {"sinks": rng.uniform(-1, 2, 4), "q_norm": rng.uniform(0.5, 1.5, 32 if whole else 8),
             "k_norm": rng.uniform(0.5, 1.5, 8 * h_kv if whole else 8)}
    used = {k: v for k, v in extra.items() if kwargs.get("sinks" if k == "sinks" else "qk_norm")}
    w = random_weights(rng, 4, h_kv, 8, **used)
    layer = mha.Layer(D, 4, d_k=8, bias=False, weights=w, **kwargs)
    targs = dict(targs)
    if targs.get("sinks") == "sinks":
        targs["sinks"] = w["sinks"]
    return layer, w, h_kv, targs, rng


@pytest.mark.parametrize("name,with_pos", [(n, p) for n in sorted(FAMILIES) for p in (False, True)
                                            if not p or "rope" in FAMILIES[n][1] or "slopes" in FAMILIES[n][1]])
def test_cache_prefill_then_20_decode_steps(name, with_pos):
    """Prefill 7 tokens, then 20 single-token steps of a ragged batch (the
    second sequence stops 4 tokens early): every step's rows equal torch's
    full causal forward of each sequence."""
    layer, w, h_kv, targs, rng = family_layer(name, 20)
    n = 27
    x = rng.uniform(-1, 1, (B, n, D)).astype(np.float32)
    pos = (np.arange(n)[None, :] * 2 + np.array([[0], [100]])).astype(np.int32)
    lens = [n, n - 4]
    want = [torch_attention(w, x[b:b + 1, :lens[b]], 4, h_kv, 8, pos=pos[b:b + 1, :lens[b]] if with_pos else None,
                            **targs)[0] for b in range(B)]
    cache = mha.Cache(layer, B, n)
    got = np.zeros((B, n, D), dtype=np.float32)
    t = 0
    for step in [7] + [1] * 20:
        n_new = [max(0, min(step, lens[b] - t)) for b in range(B)]
        y = cache.forward(x[:, t:t + step], n_new=n_new, positions=pos[:, t:t + step] if with_pos else None)
        got[:, t:t + step] = y
        t += step
    for b in range(B):
        np.testing.assert_allclose(got[b, :lens[b]], want[b], atol=2e-5, err_msg=f"sequence {b}")
        assert np.all(got[b, lens[b]:] == 0)


@pytest.mark.parametrize("name", ["llama", "bloom", "gemma2_gpt_oss"])
def test_cache_truncate_and_continue(name):
    """12 tokens, truncate to 5, then 9 other tokens one at a time: equal to
    torch on the spliced sequence."""
    layer, w, h_kv, targs, rng = family_layer(name, 21)
    x = rng.uniform(-1, 1, (1, 14, D)).astype(np.float32)
    other = rng.uniform(-1, 1, (1, 14, D)).astype(np.float32)
    cache = mha.Cache(layer, 1, 14)
    cache.forward(x[0, :12])
    cache.truncate(0, 5)
    spliced = np.concatenate((x[:, :5], other[:, 5:]), axis=1)
    got = [cache.forward(spliced[0, t:t + 1])[0] for t in range(5, 14)]
    want = torch_attention(w, spliced, 4, h_kv, 8, **targs)[0, 5:]
    np.testing.assert_allclose(np.array(got), want, atol=2e-5)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_streaming_llm_sink_tokens(name):
    """A ring of 13 slots, 3 for the sink tokens, keeping the last 6 tokens
    besides them: prefill 8, then 26 decode steps far past the window in a
    ragged batch (the second sequence stops 5 early), then truncate both
    by 3 and continue with other tokens: every row equals torch's
    StreamingLLM attention (first 3 keys + the last 6) of each sequence,
    and the full forward with sink_tokens equals it on both paths."""
    layer, w, h_kv, targs, rng = family_layer(name, 22)
    n, window, n_sink = 34, 6, 3
    x = rng.uniform(-1, 1, (B, n, D)).astype(np.float32)
    pos = (np.arange(n)[None, :] + np.array([[0], [40]])).astype(np.int32)
    lens = [n, n - 5]
    use_pos = "rope" in targs or "slopes" in targs

    def want(xs, b, length):
        return torch_attention(w, xs[b:b + 1, :length], 4, h_kv, 8, pos=pos[b:b + 1, :length] if use_pos else None,
                               streaming=(window, n_sink), **targs)[0]

    for path in ("reference", "fast"):
        y = layer.forward(x[:1], causal=True, window_left=window - 1, sink_tokens=n_sink, path=path,
                          positions=pos[:1] if use_pos else None)
        np.testing.assert_allclose(y[0], want(x, 0, n), atol=2e-5, err_msg=path)
    cache = mha.Cache(layer, B, 13, window=window, sink_tokens=n_sink)
    got = np.zeros((B, n, D), dtype=np.float32)

    def feed(xs, t, steps):
        for step in steps:
            n_new = [max(0, min(step, lens[b] - t)) for b in range(B)]
            got[:, t:t + step] = cache.forward(xs[:, t:t + step], n_new=n_new,
                                               positions=pos[:, t:t + step] if use_pos else None)
            t += step

    feed(x, 0, [8] + [1] * 26)
    for b in range(B):
        np.testing.assert_allclose(got[b, :lens[b]], want(x, b, lens[b]), atol=2e-5, err_msg=f"sequence {b}")
        assert np.all(got[b, lens[b]:] == 0)
    # truncate by 3 (the ring of 10 keeps 10 - 6 + 1 = 5 positions to go back)
    other = rng.uniform(-1, 1, x.shape).astype(np.float32)
    keep = [lens[b] - 3 for b in range(B)]
    for b in range(B):
        cache.truncate(b, keep[b])
        other[b, :keep[b]] = x[b, :keep[b]]
    with pytest.raises(mha.ArgumentError, match="window"):
        cache.truncate(0, keep[0] - 3)
    for b in range(B):
        lens_b = lens[b]
        for t in range(keep[b], lens_b):
            n_new = [1 if bb == b else 0 for bb in range(B)]
            got[:, t:t + 1] = cache.forward(other[:, t:t + 1], n_new=n_new,
                                            positions=pos[:, t:t + 1] if use_pos else None)
        np.testing.assert_allclose(got[b, keep[b]:lens_b], want(other, b, lens_b)[keep[b]:], atol=2e-5,
                                   err_msg=f"sequence {b} after truncate")


def test_sink_tokens_arguments():
    layer, _, _, _, _ = family_layer("llama", 23)
    with pytest.raises(mha.ArgumentError, match="capacity - window"):
        mha.Cache(layer, 1, 8, window=6, sink_tokens=3)
    with pytest.raises(mha.ArgumentError, match="no window"):
        mha.Cache(layer, 1, 8, sink_tokens=1)
    with pytest.raises(mha.ArgumentError, match="sink_tokens"):
        layer.forward(np.zeros((1, 3, D), np.float32), causal=True, sink_tokens=2)


def test_olmo2_whole_width_qk_norm():
    """OLMo 2 normalizes all heads' q together (q_norm of size h*d_k):
    both paths equal torch; a per-head norm with the same weights differs;
    permuted heads keep Y (the weights travel, the statistic is over all)."""
    layer, w, h_kv, targs, rng = family_layer("olmo2", 24)
    x = rng.uniform(-1, 1, (B, T, D)).astype(np.float32)
    want = torch_attention(w, x, 4, h_kv, 8, **targs)
    check_paths(layer, x, want)
    per_head = mha.Layer(D, 4, n_kv_heads=2, d_k=8, bias=False, weights=w, qk_norm="rms", qk_norm_per_head=True,
                         rope={"pairing": "halves", "theta": 500000})
    assert np.abs(per_head.forward(x, causal=True) - want).max() > 1e-3
    layer.permute_heads([2, 3, 0, 1])
    np.testing.assert_allclose(layer.forward(x, causal=True), want, atol=2e-5)
