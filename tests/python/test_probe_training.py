"""Probe of the training features added together (the output gate's
backward, attention dropout, compact weights of gated layers) against
oracles written here from the public definitions, not from the library:

- the gate as Hugging Face's Qwen3NextAttention: q_proj's rows per head are
  d query rows then d gate rows, attn_output * sigmoid(gate) before o_proj;
- dropout as torch.nn.functional.dropout on the softmax: a dropped entry is
  0, a kept one is scaled by 1 / (1 - p); which entries drop is the draw
  docs/BACKWARD.md documents ("Attention dropout"), written again in numpy
  (per query row (b, r, i) with row = (b h + r) T + i: splitmix64's
  finalizer of seed + (row + 1) 0x9E3779B97F4A7C15, its top 32 bits the
  row's start, its low 32 bits (odd) its step; per key j murmur3's fmix32 of
  start + j step; kept when >= floor(p 2^32));
- sinks as gpt-oss (one logit per head in the denominator; the sink's
  share is no key's probability: never dropped), masks as torch's.

The float64 torch layer below gives y and every gradient; the library's
module (mha.nn.Attention) must agree on GQA / MQA, cross-attention,
padding masks, causal with windows, sinks, packed sequences (cu_seqlens:
the draw's i is the row's index in the packed batch row, not in its
document), fully masked rows, with and without dropout, on the tape's path
and the stateless one (need_weights / masked_rows='nan').

Found (each test failed before its fix):
- the draw stepped every row's keys by one constant, so each row's mask was
  a window of one 2^32-long sequence: rows starting fewer than S steps
  apart dropped the same keys shifted (seed 271867: (head 3, query 2)
  dropped (head 0, query 1)'s keys 15 to the left, 49 of 64; at B h T =
  10^6 rows of 4096 keys 86% of the rows shared such a run). Now each row
  steps by its own odd number (test_no_two_rows_drop_the_same_keys_shifted);
- the modules took dropout=1-1e-9, which is 1 as options.dropout_p's float:
  every training forward then failed in the library;
- an int8 native file whose w_g had more rows than d_model had its codes
  checked against scales past the config's groups (a heap read out of
  bounds) before its shape was refused.
Also probed, no defect: compact (bf16 / int8) gated layers permuted, saved,
loaded and decoded; hostile int8 gate files refused by name; interventions
and head_attribution on the gated, dropped Z; the reference fallback past
the fast score range; Qwen 1 (kv_channels * heads != hidden_size, c_proj's
bias), ChatGLM (MQA, no qkv bias, a dense bias, rotary over 2 dims) and
CodeGen (1, 3 and 4 heads per mp block) against numpy.

Legend: B batch, T queries, S keys, h heads, g kv heads, d head dim.
"""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
import mha.nn  # noqa: E402
from io_helpers import write_safetensors_raw  # noqa: E402

M64 = (1 << 64) - 1


# ---------------------------------------------------------------- the draw
def row_keys(seed, rows):
    """(start, step), each (len(rows),) uint32: each query row's Weyl
    sequence (Python ints, exact)."""
    out = []
    for row in rows:
        x = (seed + (row + 1) * 0x9E3779B97F4A7C15) & M64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
        x ^= x >> 31
        out.append((x >> 32, (x & 0xFFFFFFFF) | 1))
    return np.array(out, dtype=np.uint32).T


def keep_of(seed, p, B, h, T, S):
    """(B,h,T,S) bool: the entries the documented draw keeps."""
    start, step = row_keys(seed, range(B * h * T))
    with np.errstate(over="ignore"):
        x = start[:, None] + np.arange(S, dtype=np.uint32)[None] * step[:, None]
        x = (x ^ (x >> np.uint32(16))) * np.uint32(0x85EBCA6B)
        x = (x ^ (x >> np.uint32(13))) * np.uint32(0xC2B2AE35)
        x = x ^ (x >> np.uint32(16))
    cut = math.floor(float(np.float32(p)) * 2.0 ** 32)
    return (x >= cut).reshape(B, h, T, S)


def module_seed(torch_seed):
    """The seed mha.nn draws in training after torch.manual_seed(torch_seed)."""
    torch.manual_seed(torch_seed)
    return int(torch.randint(0, 2 ** 62, (1,)).item())


# ---------------------------------------------------------------- the layer in float64
def allowed_mask(B, h, T, S, causal=False, window=None, kpm=None, attn_mask=None, cu=None, align="top_left",
                 sink_tokens=0, chunk_size=0):
    """(B,h,T,S) bool: query i may attend key j (torch's conventions:
    kpm / bool attn_mask True = not allowed); window W: j > i - W, except
    the first sink_tokens keys; align bottom_right: query i sits at key
    position i + S - T; chunk C: i and j in one chunk of C."""
    i, j = np.arange(T)[:, None] + (S - T if align == "bottom_right" else 0), np.arange(S)[None]
    a = np.ones((B, h, T, S), bool)
    if causal:
        a &= j <= i
    if window is not None:
        a &= (j > i - window) | (j < sink_tokens)
    if chunk_size:
        a &= i // chunk_size == j // chunk_size
    if kpm is not None:
        a &= ~np.asarray(kpm, bool)[:, None, None, :]
    if attn_mask is not None:
        a &= ~np.asarray(attn_mask, bool)
    if cu is not None:
        doc = np.searchsorted(np.asarray(cu)[1:], np.arange(T), side="right")
        a &= doc[:, None] == doc[None]
    return a


def oracle(m, x, kv=None, *, allowed, keep=None, p=0.0, nan_rows=False):
    """y of mha.nn.Attention m (no RoPE / norms) in float64 with float64
    leaf copies of its parameters; returns (y, params, x64, kv64)."""
    h, g, d = m.n_heads, m.n_kv_heads, m.head_dim
    P = {n: t.detach().double().requires_grad_() for n, t in m.named_parameters()}
    x64 = x.detach().double().requires_grad_()
    kv64 = None if kv is None else kv.detach().double().requires_grad_()
    src = x64 if kv64 is None else kv64
    B, T, S = x.shape[0], x.shape[1], src.shape[1]
    lin = lambda t, n: t @ P[n + ".weight"].T + (P[n + ".bias"] if n + ".bias" in P else 0)  # noqa: E731
    q = lin(x64, "q_proj")
    if m.config["output_gate"]:  # Qwen3NextAttention: chunk each head's 2d rows into query, gate
        q, gate = torch.chunk(q.view(B, T, h, 2 * d), 2, dim=-1)
        gate = gate.reshape(B, T, h * d)
    q = q.reshape(B, T, h, d).transpose(1, 2)
    k = lin(src, "k_proj").view(B, S, g, d).transpose(1, 2).repeat_interleave(h // g, 1)
    v = lin(src, "v_proj").view(B, S, g, d).transpose(1, 2).repeat_interleave(h // g, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if m.config["softcap"]:
        s = m.config["softcap"] * torch.tanh(s / m.config["softcap"])
    al = torch.from_numpy(np.broadcast_to(allowed, s.shape).copy())
    s = s.masked_fill(~al, -math.inf)
    mx = s.amax(-1, keepdim=True).detach()
    if "sinks" in P:
        mx = torch.maximum(mx, P["sinks"].detach().view(1, h, 1, 1))
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    e = torch.exp(s - mx)
    den = e.sum(-1, keepdim=True)
    if "sinks" in P:
        den = den + torch.exp(P["sinks"].view(1, h, 1, 1) - mx)
    empty = den == 0  # a row with no key and no sink
    probs = e / torch.where(empty, torch.ones_like(den), den)
    if keep is not None:
        probs = probs * torch.from_numpy(keep) / (1.0 - float(np.float32(p)))
    z = probs @ v
    if nan_rows:
        z = torch.where(empty, torch.full_like(z, math.nan), z)
    z = z.transpose(1, 2).reshape(B, T, h * d)
    if m.config["output_gate"]:
        z = z * torch.sigmoid(gate)
    y = lin(z, "o_proj")
    return y, P, x64, kv64


def randomized(m, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, t in m.named_parameters():
            t.copy_((torch.rand(t.shape, generator=gen) - 0.5) * (2.0 if n == "sinks" else 1.0))
    return m


def check_grads(m, x, kv, y, y64, P, x64, kv64, atol=2e-5):
    """y and every gradient of <y, dy> against the oracle's."""
    assert torch.allclose(y.double(), y64, atol=atol, rtol=0), (y.double() - y64).abs().max()
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(11))
    (y * dy).sum().backward()
    (y64 * dy.double()).sum().backward()
    assert torch.allclose(x.grad.double(), x64.grad, atol=atol, rtol=0), (x.grad.double() - x64.grad).abs().max()
    if kv is not None:
        assert torch.allclose(kv.grad.double(), kv64.grad, atol=atol, rtol=0)
    for n, t in m.named_parameters():
        assert t.grad is not None, n
        err = (t.grad.double() - P[n].grad).abs().max()
        assert err <= atol * max(1.0, P[n].grad.abs().max().item()), (n, float(err))


# ---------------------------------------------------------------- gate and dropout through autograd
CASES = {  # name: (Attention kwargs, forward kwargs, cross S or None)
    "gqa_causal_window": (dict(n_kv_heads=2, bias=True), dict(causal=True, window=3), None),
    "mqa_sinks_padding": (dict(n_kv_heads=1, bias="qkv", sinks=True), dict(key_padding_mask="pad"), None),
    "cross_gqa": (dict(n_kv_heads=2, bias=True, kv_dim=12), dict(key_padding_mask="pad"), 9),
    "packed_causal": (dict(n_kv_heads=2), dict(causal=True, cu_seqlens=[0, 3, 4, 11]), None),
    "packed_sinks": (dict(sinks=True, bias=True), dict(cu_seqlens=[0, 5, 11]), None),
    "masked_row_zero": (dict(n_kv_heads=2, bias=True), dict(attn_mask="row"), None),
    "masked_row_sinks": (dict(n_kv_heads=2, sinks=True), dict(attn_mask="row"), None),
    "cross_bottom_right": (dict(n_kv_heads=1, bias=True), dict(causal=True, align="bottom_right"), 8),  # rows 0-2 see no key
    "window_sink_tokens": (dict(n_kv_heads=2, softcap=3.0), dict(causal=True, window=3, sink_tokens=2), None),
    "chunked": (dict(n_kv_heads=4, sinks=True, softcap=2.0), dict(causal=True, chunk_size=4), None),
}


def case_inputs(name, B=2, T=11):
    kw, fw, S = CASES[name]
    fw = dict(fw)
    Sx = S or T
    gen = torch.Generator().manual_seed(hash(name) % 1000)
    x = torch.randn(B, T, 16, generator=gen)
    kv = None if S is None else torch.randn(B, S, kw.get("kv_dim", 16), generator=gen)
    if fw.get("key_padding_mask") == "pad":
        pad = torch.zeros(B, Sx, dtype=torch.bool)
        pad[0, -3:] = True
        pad[1, :2] = True
        fw["key_padding_mask"] = pad
    if fw.get("attn_mask") == "row":  # row 2 of every head masked whole, a few holes elsewhere
        am = torch.zeros(T, Sx, dtype=torch.bool)
        am[2] = True
        am[5, 1::2] = True
        fw["attn_mask"] = am
    return kw, fw, x, kv


def allowed_for(fw, B, h, T, S):
    return allowed_mask(B, h, T, S, causal=fw.get("causal", False), window=fw.get("window"),
                        kpm=None if fw.get("key_padding_mask") is None else fw["key_padding_mask"].numpy(),
                        attn_mask=None if fw.get("attn_mask") is None else fw["attn_mask"].numpy(),
                        cu=fw.get("cu_seqlens"), align=fw.get("align", "top_left"),
                        sink_tokens=fw.get("sink_tokens", 0), chunk_size=fw.get("chunk_size", 0))


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gated_module_gradients_against_qwen3next_oracle(name, p):
    kw, fw, x, kv = case_inputs(name)
    m = randomized(mha.nn.Attention(16, 4, output_gate=True, dropout=p, **kw), 5)
    B, T = x.shape[:2]
    S = T if kv is None else kv.shape[1]
    keep = keep_of(module_seed(3), p, B, 4, T, S) if p else None
    y64, P, x64, kv64 = oracle(m, x, kv, allowed=allowed_for(fw, B, 4, T, S), keep=keep, p=p)
    xs = x.clone().requires_grad_()
    kvs = None if kv is None else kv.clone().requires_grad_()
    torch.manual_seed(3)
    y = m(xs, kvs, **fw)
    check_grads(m, xs, kvs, y, y64, P, x64, kv64)


@pytest.mark.parametrize("name", ["gqa_causal_window", "packed_sinks", "cross_gqa"])
def test_ungated_dropout_gradients(name):
    """the same without the gate (the dropout's own backward)"""
    kw, fw, x, kv = case_inputs(name, B=3, T=13 if name != "packed_sinks" else 11)
    m = randomized(mha.nn.Attention(16, 4, dropout=0.45, **kw), 6)
    B, T = x.shape[:2]
    S = T if kv is None else kv.shape[1]
    if "key_padding_mask" in fw:
        fw["key_padding_mask"] = torch.zeros(B, S, dtype=torch.bool)
    keep = keep_of(module_seed(4), 0.45, B, 4, T, S)
    y64, P, x64, kv64 = oracle(m, x, kv, allowed=allowed_for(fw, B, 4, T, S), keep=keep, p=0.45)
    xs = x.clone().requires_grad_()
    kvs = None if kv is None else kv.clone().requires_grad_()
    torch.manual_seed(4)
    check_grads(m, xs, kvs, m(xs, kvs, **fw), y64, P, x64, kv64)


def test_nan_rows_with_dropout_draw_as_the_tape():
    """masked_rows='nan' with a fully masked row: the tape refuses it, so the
    stateless forward and backward run; the other rows must carry the same
    draw (the gradients are NaN, as torch's softmax makes them)."""
    kw, fw, x, _ = case_inputs("masked_row_zero")
    m = randomized(mha.nn.Attention(16, 4, output_gate=True, dropout=0.3, masked_rows="nan", **kw), 7)
    B, T = x.shape[:2]
    keep = keep_of(module_seed(8), 0.3, B, 4, T, T)
    y64 = oracle(m, x, allowed=allowed_for(fw, B, 4, T, T), keep=keep, p=0.3, nan_rows=True)[0]
    xs = x.clone().requires_grad_()
    torch.manual_seed(8)
    y = m(xs, **fw)
    assert torch.isnan(y[:, 2]).all() and torch.isnan(y64[:, 2]).all()
    rows = [t for t in range(T) if t != 2]
    assert torch.allclose(y[:, rows].double(), y64[:, rows], atol=2e-5, rtol=0)
    y.sum().backward()
    assert xs.grad.shape == x.shape


def test_gate_double_backward_refused():
    m = mha.nn.Attention(16, 4, output_gate=True, dropout=0.2)
    x = torch.randn(1, 5, 16, requires_grad=True)
    y = m(x, causal=True)
    with pytest.raises(mha.UnsupportedError, match="create_graph"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


# ---------------------------------------------------------------- the draw through mha.Layer
def plain_layer(seed, h=4, g=2, d=8, extra=False, sinks=False, gate=False, d_in=16):
    rs = np.random.RandomState(seed)
    layer = mha.Layer(d_in, h, n_kv_heads=g, d_k=d, d_v=d, bias=True, add_bias_kv=extra, add_zero_attn=extra,
                      sinks=sinks, output_gate=gate)
    w = {n: (rs.uniform(-.6, .6, a.shape) * (3 if n == "sinks" else 1)).astype(np.float32)
         for n, a in layer.weights().items()}
    layer.set_weights(w)
    return layer


@pytest.mark.parametrize("path", ["reference", "fast"])
@pytest.mark.parametrize("shape", [
    dict(B=3, T=37, S=37, causal=True),                   # T not a multiple of the tiles, B > 1
    dict(B=1, T=5, S=83, extra=True),                     # cross, past one key tile, the two extra keys
    dict(B=2, T=20, S=20, sinks=True, window_left=4, causal=True),
    dict(B=2, T=19, S=19, cu_seqlens=[0, 7, 8, 19], causal=True),
])
@pytest.mark.parametrize("p,seed", [(0.3, 0), (0.3, 2 ** 64 - 1), (1e-7, 5), (0.999, 9)])
def test_captured_probs_are_the_draw(path, shape, p, seed):
    """probs with dropout = probs without * keep / (1 - p), keep the
    documented draw at (b, r, i, j) for every key including the extra
    ones (j = S, S + 1); y = the dropped probabilities times V."""
    shape = dict(shape)
    B, T, S = shape.pop("B"), shape.pop("T"), shape.pop("S")
    layer = plain_layer(1, extra=shape.pop("extra", False), sinks=shape.pop("sinks", False))
    rs = np.random.RandomState(2)
    x = rs.randn(B, T, 16).astype(np.float32)
    kv = None if S == T else rs.randn(B, S, 16).astype(np.float32)
    y0, c0 = layer.forward(x, kv, capture=("probs", "z"), path=path, **shape)
    y1, c1 = layer.forward(x, kv, capture=("probs", "z"), path=path, dropout_p=p, dropout_seed=seed, **shape)
    Sx = c0["probs"].shape[-1]
    keep = keep_of(seed, p, B, 4, T, Sx)
    scale = 1.0 / (1.0 - float(np.float32(p)))
    want = c0["probs"].astype(np.float64) * keep * scale
    assert np.allclose(c1["probs"], want, rtol=2e-6, atol=1e-7 * scale), np.abs(c1["probs"] - want).max()
    if p > 0.5:
        assert keep.mean() < 0.01
    # Z from the captured dropped probabilities and V of the layer
    w = {n: a.astype(np.float64) for n, a in layer.weights().items()}
    src = (x if kv is None else kv).astype(np.float64)
    v = src @ w["w_v"] + w["b_v"]  # (B,S,g*d)
    if "bias_v" in w:
        v = np.concatenate([v, np.broadcast_to(w["bias_v"], (B, 1, 16)), np.zeros((B, 1, 16))], 1)
    v = v.reshape(B, Sx, 2, 8).repeat(2, 2)  # (B,Sx,h,d), head r reads group r // 2
    z = np.einsum("bhts,bshe->bthe", c1["probs"].astype(np.float64), v).reshape(B, T, 32)
    assert np.allclose(c1["z"], z, atol=1e-4 * scale, rtol=1e-5), np.abs(c1["z"] - z).max()


def test_fast_and_reference_draw_alike_on_a_long_row():
    """keys past several tiles, GQA, window: the two paths' y agree"""
    layer = plain_layer(3, h=4, g=1)
    x = np.random.RandomState(4).randn(2, 150, 16).astype(np.float32)
    opts = dict(causal=True, window_left=90, dropout_p=0.2, dropout_seed=77)
    a, b = (layer.forward(x, path=pth, **opts) for pth in ("reference", "fast"))
    assert np.abs(a - b).max() < 1e-4
    assert np.abs(a - layer.forward(x, causal=True, window_left=90)).max() > 1e-2


# ---------------------------------------------------------------- the draw's statistics
def dropped(seed, p=0.5, B=1, h=4, T=4, S=64):
    """(B*h*T, S) bool: the entries the library's captured probs zero."""
    layer = mha.Layer(16, h, bias=False)
    rs = np.random.RandomState(0)
    x, kv = rs.randn(B, T, 16).astype(np.float32), rs.randn(B, S, 16).astype(np.float32)
    _, c = layer.forward(x, kv, capture="probs", dropout_p=p, dropout_seed=seed)
    return (c["probs"] == 0).reshape(B * h * T, S)


def test_no_two_rows_drop_the_same_keys_shifted():
    """Seed 271867 (found by a search over the first draw's keys): with one
    constant step per key, the rows (head 0, query 1) and (head 3, query 2)
    started 15 steps apart, so the second dropped exactly the first's keys
    15 to the left (49 of 64 in a row); any two rows of any seed here must
    agree on about half their overlapping keys at p = 0.5."""
    for seed in (271867, 126832, 1788616, 0, 2 ** 64 - 1):
        d = dropped(seed)
        n, S = d.shape
        worst = 0.0
        for a in range(n):
            for b in range(n):
                for c in range(-(S - 24), S - 24):  # row b at j against row a at j + c, >= 24 keys
                    if a == b and c == 0:
                        continue
                    lo, hi = max(0, -c), min(S, S - c)
                    worst = max(worst, float((d[a, lo + c:hi + c] == d[b, lo:hi]).mean()))
        assert worst < 0.9, (seed, worst)


def test_each_row_and_key_drops_its_share():
    """the dropped share of every row (and of every key over rows) within 5
    sigma of p; neighbouring rows, heads and batch rows agree as
    independent draws would (p^2 + (1-p)^2), not more"""
    p, S = 0.3, 4096
    d = dropped(123, p=p, B=2, h=4, T=8, S=S).reshape(2, 4, 8, S)
    share = d.mean(-1)
    assert np.abs(share - p).max() < 5 * math.sqrt(p * (1 - p) / S), share
    col = d.reshape(-1, S).mean(0)
    assert abs(col.mean() - p) < 5 * math.sqrt(p * (1 - p) / d[..., 0].size / S)
    same = p * p + (1 - p) ** 2
    tol = 5 * math.sqrt(same * (1 - same) / S)
    for a, b in ((d[:, :, :-1], d[:, :, 1:]), (d[:, :-1], d[:, 1:]), (d[0], d[1])):
        agree = (a == b).mean(-1)
        assert np.abs(agree - same).max() < tol, agree


def test_mean_over_seeds_is_the_undropped_layer():
    """E[y] over seeds = y without dropout (torch's scaling 1 / (1 - p))"""
    layer = plain_layer(8, gate=True)
    x = np.random.RandomState(9).randn(1, 6, 16).astype(np.float32)
    y0 = layer.forward(x, causal=True).astype(np.float64)
    n, p = 1500, 0.4
    ys = np.stack([layer.forward(x, causal=True, dropout_p=p, dropout_seed=s) for s in range(n)]).astype(np.float64)
    err = np.abs(ys.mean(0) - y0)
    se = ys.std(0) / math.sqrt(n)
    assert (err < 5 * se + 1e-6).all(), (err / se).max()


# ---------------------------------------------------------------- the modules' dropout argument
@pytest.mark.parametrize("p", [1 - 1e-9, 1 - 2 ** -26])
def test_dropout_that_rounds_to_one_refused_at_construction(p):
    """options.dropout_p is a float: 1 - 1e-9 is 1 there. The modules took
    it, then every training forward failed in the library ('dropout_p=1')."""
    for make in (lambda: mha.nn.MultiheadAttention(16, 4, dropout=p), lambda: mha.nn.Attention(16, 4, dropout=p)):
        with pytest.raises(ValueError, match="dropout="):
            make()


def test_dropout_just_below_one_in_float32_trains():
    p = float(np.nextafter(np.float32(1), np.float32(0)))  # 1 - 2^-24: the largest the library takes
    m = mha.nn.Attention(16, 4, dropout=p)
    x = torch.randn(1, 4, 16, requires_grad=True)
    m(x, causal=True).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_multihead_paths_agree_on_the_draw():
    """training: need_weights (stateless), the tape (grad, no weights) and
    no_grad draw the same entries; the weights returned are eval's
    probabilities times keep / (1 - p) with keep the documented draw, over
    the bias_k / zero-attention columns too, under GQA cross-attention
    with a padding mask and a causal mask"""
    m = mha.nn.MultiheadAttention(16, 4, dropout=0.35, batch_first=True, kdim=12, vdim=10, num_kv_heads=2,
                                  add_bias_kv=True, add_zero_attn=True)
    randomized(m, 2)
    gen = torch.Generator().manual_seed(3)
    B, T, S = 2, 7, 9
    q, k, v = torch.randn(B, T, 16, generator=gen), torch.randn(B, S, 12, generator=gen), torch.randn(B, S, 10, generator=gen)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1, 4:] = True
    am = torch.ones(T, S, dtype=torch.bool).triu(1)
    kw = dict(key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    m.eval()
    with torch.no_grad():
        y_eval, w_eval = m(q, k, v, **kw)
    m.train()
    outs = []
    for mode in ("weights", "tape", "no_grad"):
        qq = q.clone().requires_grad_(mode != "no_grad")
        torch.manual_seed(21)
        with torch.set_grad_enabled(mode != "no_grad"):
            y, w = m(qq, k, v, need_weights=mode == "weights", **kw)
        outs.append(y.detach())
        if mode == "weights":
            keep = keep_of(module_seed(21), 0.35, B, 4, T, S + 2)
            want = w_eval.double() * torch.from_numpy(keep) / (1 - float(np.float32(0.35)))
            assert torch.allclose(w.double(), want, atol=1e-6, rtol=1e-5)
    assert torch.allclose(outs[0], outs[1], atol=1e-5) and torch.allclose(outs[0], outs[2], atol=1e-5)
    assert not torch.allclose(outs[0], y_eval, atol=1e-3)


# ---------------------------------------------------------------- gated layers in bf16 / int8
def gated_numpy(w, x, causal=True, h=4, g=2, d=8):
    """y of a gated layer (weights w in the library's (in, out) layout) in float64"""
    f = {k: v.astype(np.float64) for k, v in w.items()}
    B, T, _ = x.shape
    x = x.astype(np.float64)
    q = (x @ f["w_q"] + f.get("b_q", 0)).reshape(B, T, h, d)
    k = np.repeat((x @ f["w_k"] + f.get("b_k", 0)).reshape(B, T, g, d), h // g, 2)
    v = np.repeat((x @ f["w_v"] + f.get("b_v", 0)).reshape(B, T, g, d), h // g, 2)
    s = np.einsum("bthe,bshe->bhts", q, k) / math.sqrt(d)
    if causal:
        s = np.where(np.arange(T)[None] > np.arange(T)[:, None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    z = np.einsum("bhts,bshe->bthe", p / p.sum(-1, keepdims=True), v).reshape(B, T, h * d)
    z = z / (1 + np.exp(-(x @ f["w_g"] + f.get("b_g", 0))))
    return z @ f["w_o"] + f.get("b_o", 0)


def compact_gated(dtype, seed=1):
    layer = plain_layer(seed, gate=True, d_in=40)  # d_model 40: two int8 groups, the second partial
    layer.convert_weights(dtype)
    return layer


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_compact_gated_layer_permute_save_load_cache(tmp_path, dtype):
    layer = compact_gated(dtype)
    stored = layer.weights()
    x = np.random.RandomState(3).randn(2, 9, 40).astype(np.float32)
    want = gated_numpy(stored, x)
    assert np.abs(layer.forward(x, causal=True) - want).max() < 2e-5 * max(1, np.abs(want).max())
    # head permutation inside each kv group and of the groups: the same function
    perm = [3, 2, 1, 0]
    layer.permute_heads(perm)
    pw = layer.weights()
    cols = np.concatenate([np.arange(r * 8, r * 8 + 8) for r in perm])
    assert np.array_equal(pw["w_g"], stored["w_g"][:, cols]) and np.array_equal(pw["b_g"], stored["b_g"][cols])
    assert layer.weights_dtype == dtype
    assert np.abs(layer.forward(x, causal=True) - want).max() < 2e-5 * max(1, np.abs(want).max())
    layer.save(tmp_path / "g.safetensors")
    again = mha.Layer.load(tmp_path / "g.safetensors")
    assert again.weights_dtype == dtype
    for n, a in pw.items():
        assert np.array_equal(again.weights()[n], a), n
    cache = mha.Cache(again, 2, 16)
    steps = [cache.forward(x[:, :4])] + [cache.forward(x[:, t:t + 1]) for t in range(4, 9)]
    got = np.concatenate(steps, 1)
    assert np.abs(got - want).max() < 2e-5 * max(1, np.abs(want).max())


def read_raw(path):
    """{name: (dtype, shape, bytes)}, metadata of a safetensors file"""
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    meta = hdr.pop("__metadata__", {})
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in hdr.items()}, meta


def bf16_bytes(a):
    return (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def i8_file(tmp_path):
    layer = compact_gated("int8")
    layer.save(tmp_path / "ok.safetensors")
    return read_raw(tmp_path / "ok.safetensors")


def hostile_int8(tmp_path, name):
    """an int8 gated file with one defect (the name says which)"""
    t, meta = i8_file(tmp_path)
    dt, (K, N), codes = t["w_g"]
    q = np.frombuffer(codes, np.int8).reshape(K, N).copy()
    scale = np.frombuffer(t["w_g_scale"][2], np.float32).reshape(t["w_g_scale"][1]).copy()
    if name == "code_-128":
        q[37, 5] = -128
        t["w_g"] = ("I8", (K, N), q.tobytes())
    elif name == "code_beside_zero_scale":
        q[0:32, 3] = 0
        q[7, 3] = 4
        scale[0, 3] = 0
        t["w_g"], t["w_g_scale"] = ("I8", (K, N), q.tobytes()), ("F32", scale.shape, scale.tobytes())
    elif name == "scale_nan":
        scale[1, 2] = np.nan
        t["w_g_scale"] = ("F32", scale.shape, scale.tobytes())
    elif name == "scale_negative":
        scale[0, 0] = -scale[0, 0]
        t["w_g_scale"] = ("F32", scale.shape, scale.tobytes())
    elif name == "scale_shape":
        t["w_g_scale"] = ("F32", (1, N), scale[:1].tobytes())
    elif name == "scale_f16":
        t["w_g_scale"] = ("F16", scale.shape, scale.astype(np.float16).tobytes())
    elif name == "scale_missing":
        del t["w_g_scale"]
    elif name == "w_g_bf16":
        t["w_g"] = ("BF16", (K, N), bf16_bytes(q * 0.01))
    elif name == "w_g_f32":
        t["w_g"] = ("F32", (K, N), (q * 0.01).astype(np.float32).tobytes())
    elif name == "w_g_tall":  # more rows than d_model: its codes read scales past the config's groups
        t["w_g"] = ("I8", (K * 64, 1), bytes(K * 64))
        t["w_g_scale"] = ("F32", (2, 1), np.ones(2, np.float32).tobytes())
    elif name == "w_g_wide":
        t["w_g"] = ("I8", (K, N + 8), np.zeros((K, N + 8), np.int8).tobytes())
        t["w_g_scale"] = ("F32", (2, N + 8), np.ones((2, N + 8), np.float32).tobytes())
    elif name == "w_g_rank1":
        t["w_g"] = ("I8", (K * N,), q.tobytes())
    elif name == "b_g_missing":
        del t["b_g"]
    elif name == "no_gate_flag":
        del meta["output_gate"]
    path = tmp_path / f"{name}.safetensors"
    write_safetensors_raw(path, t, meta)
    return path


@pytest.mark.parametrize("name,error,words", [
    ("code_-128", mha.FormatError, r"'w_g'\[37\]\[5\] = -128"),
    ("code_beside_zero_scale", mha.FormatError, r"'w_g'\[7\]\[3\] = 4 \(scale 0"),
    ("scale_nan", mha.NonFiniteError, r"w_g_scale\[\d+\] = nan"),  # the file reader's check
    ("scale_negative", mha.FormatError, r"w_g_scale'\[0\] = -"),
    ("scale_shape", mha.FormatError, r"'w_g_scale' is float32 of shape \(1, 32\); expected F32 \(2, 32\)"),
    ("scale_f16", mha.FormatError, r"'w_g_scale' is float16 of shape \(2, 32\); expected F32"),
    ("scale_missing", mha.FormatError, r"'w_g_scale' is missing"),
    ("w_g_bf16", mha.FormatError, r"'w_g' is bfloat16 but metadata weights_dtype = int8"),
    ("w_g_f32", mha.FormatError, r"'w_g' is float32 but metadata weights_dtype = int8"),
    ("w_g_tall", mha.ShapeError, r"'w_g' has shape \(2560, 1\); expected \(d_model, h\*d_v\) = \(40, 32\)"),
    ("w_g_wide", mha.ShapeError, r"'w_g' has shape \(40, 40\); expected \(d_model, h\*d_v\) = \(40, 32\)"),
    ("w_g_rank1", mha.ShapeError, r"'w_g' has shape \(1280,\); expected \(d_model, h\*d_v\)"),
    ("b_g_missing", mha.FormatError, r"b_g"),
    ("no_gate_flag", mha.FormatError, r"w_g"),
])
def test_hostile_int8_gate_files_refused_by_name(tmp_path, name, error, words):
    with pytest.raises(error, match=words):
        mha.Layer.load(hostile_int8(tmp_path, name))


def test_gate_in_other_dtypes_of_an_fp32_file(tmp_path):
    """an fp32 file (no weights_dtype) widens a BF16 w_g; an I8 w_g there
    (codes without their scales' metadata) is refused by name"""
    layer = plain_layer(4, gate=True, d_in=40)
    layer.save(tmp_path / "f.safetensors")
    t, meta = read_raw(tmp_path / "f.safetensors")
    K, N = t["w_g"][1]
    wg = np.frombuffer(t["w_g"][2], np.float32).reshape(K, N)
    t["w_g"] = ("BF16", (K, N), bf16_bytes(wg))
    write_safetensors_raw(tmp_path / "b.safetensors", t, meta)
    got = mha.Layer.load(tmp_path / "b.safetensors").weights()["w_g"]
    assert np.array_equal(got, (wg.view(np.uint32) & 0xFFFF0000).view(np.float32))
    t["w_g"] = ("I8", (K, N), np.zeros((K, N), np.int8).tobytes())
    write_safetensors_raw(tmp_path / "i.safetensors", t, meta)
    with pytest.raises(mha.FormatError, match="'w_g' is int8; expected a floating dtype"):
        mha.Layer.load(tmp_path / "i.safetensors")


# ---------------------------------------------------------------- Qwen 1, ChatGLM, CodeGen: odd shapes
def _families():
    import test_families_more as fm
    import test_probe_families as pf
    from test_probe_hf_layouts import rotate
    return fm, pf, rotate


def test_qwen1_kv_channels_not_hidden_over_heads(tmp_path):
    """QWenAttention: projection_size = kv_channels * heads, which need not
    be hidden_size: c_attn (3 h kv, E), c_proj (E, h kv)"""
    fm, pf, rotate = _families()
    D, H, d = 32, 4, 12
    rs = np.random.RandomState(41)
    w, b, wo = pf.rnd(rs, 3 * H * d, D), pf.rnd(rs, 1, 3 * H * d)[0], pf.rnd(rs, D, H * d)
    t = {fm.QP + "c_attn.weight": w, fm.QP + "c_attn.bias": b, fm.QP + "c_proj.weight": wo}
    cfg = {"model_type": "qwen", "hidden_size": D, "num_attention_heads": H, "kv_channels": d,
           "rotary_emb_base": 10000, "rotary_pct": 0.5, "seq_length": 64, "no_bias": True}
    x, y = pf.run(tmp_path, t, cfg, "transformer.h.0", D)
    q, k, v = np.split(x @ w.T + b, 3, axis=-1)
    q, k, v = pf.heads(q, H), pf.heads(k, H), pf.heads(v, H)
    pf.close(y, pf.attention(rotate(q, 6, 1e4, "halves"), rotate(k, 6, 1e4, "halves"), v, wo))


@pytest.mark.parametrize("D,H,G,d,qkv_bias,dense_bias", [
    (48, 4, 1, 16, True, False),   # MQA, kv_channels * heads (64) != hidden_size (48)
    (32, 4, 4, 8, False, True),    # as many groups as heads, a dense bias, no qkv bias
    (40, 8, 2, 4, True, True),     # rotary over 2 dims of 4
])
def test_chatglm_odd_shapes(tmp_path, D, H, G, d, qkv_bias, dense_bias):
    fm, pf, rotate = _families()
    rs = np.random.RandomState(42)
    w, b, wo = pf.rnd(rs, (H + 2 * G) * d, D), pf.rnd(rs, 1, (H + 2 * G) * d)[0] * qkv_bias, pf.rnd(rs, D, H * d)
    bo = pf.rnd(rs, 1, D)[0] * dense_bias
    t = {fm.GP + "query_key_value.weight": w, fm.GP + "dense.weight": wo}
    if qkv_bias:
        t[fm.GP + "query_key_value.bias"] = b
    if dense_bias:
        t[fm.GP + "dense.bias"] = bo
    cfg = fm.glm_cfg(D, H, G, d, add_qkv_bias=qkv_bias, add_bias_linear=dense_bias)
    x, y = pf.run(tmp_path, t, cfg, "transformer.encoder.layers.0", D)
    q, k, v = np.split(x @ w.T + b, [H * d, (H + G) * d], axis=-1)
    q, k, v = pf.heads(q, H), pf.heads(k, G), pf.heads(v, G)
    pf.close(y, pf.attention(rotate(q, d // 2, 2e4, "interleaved"), rotate(k, d // 2, 2e4, "interleaved"), v, wo,
                             bo))


@pytest.mark.parametrize("D,H,rotary_dim", [(32, 4, 8), (96, 12, 4), (128, 16, None)])
def test_codegen_odd_shapes(tmp_path, D, H, rotary_dim):
    """one head per mp block, three per block, four per block with the whole head rotated"""
    fm, pf, rotate = _families()
    rs = np.random.RandomState(43)
    w, wo = pf.rnd(rs, 3 * D, D), pf.rnd(rs, D, D)
    t = {fm.CP + "qkv_proj.weight": w, fm.CP + "out_proj.weight": wo}
    cfg = {"model_type": "codegen", "n_embd": D, "n_head": H, "rotary_dim": rotary_dim, "n_positions": 64}
    x, y = pf.run(tmp_path, t, cfg, "transformer.h.0", D)
    q, k, v = fm.codegen_qkv(x, w, H)
    r = rotary_dim or D // H
    pf.close(y, pf.attention(rotate(q, r, 1e4, "interleaved"), rotate(k, r, 1e4, "interleaved"), v, wo))


# ---------------------------------------------------------------- gate and dropout with interventions
def test_interventions_and_attribution_see_the_gated_dropped_z():
    """docs/VARIANTS.md: interventions, captures and contributions see the
    gated Z. So, under one dropout draw: 'replace' puts the value itself
    (not value * gate) before W_O, 'scale' s scales the gated Z, and
    head_attribution[r] = <dy, Y> - <dy, Y with head r zeroed>."""
    layer = plain_layer(12, gate=True)
    w = {n: a.astype(np.float64) for n, a in layer.weights().items()}
    rs = np.random.RandomState(13)
    x = rs.randn(2, 10, 16).astype(np.float32)
    opts = dict(causal=True, window_left=5, dropout_p=0.25, dropout_seed=2 ** 64 - 3)
    y, cap = layer.forward(x, capture=("z", "contributions"), **opts)
    z = cap["z"].astype(np.float64)  # (B,T,h*d): gated and dropped
    assert np.allclose(z @ w["w_o"] + w["b_o"], y, atol=2e-5)
    assert np.allclose(cap["contributions"].sum(0) + w["b_o"], y, atol=2e-5)
    val = rs.randn(2, 10, 8).astype(np.float32)
    y_rep = layer.forward(x, interventions={1: ("replace", val), 2: ("scale", -0.5)}, **opts)
    z2 = z.copy()
    z2[..., 8:16] = val
    z2[..., 16:24] *= -0.5
    assert np.allclose(y_rep, z2 @ w["w_o"] + w["b_o"], atol=2e-5)
    dy = rs.randn(*y.shape).astype(np.float32)
    attr = mha.nn.head_attribution(layer, x, dy, **opts)
    for r in range(4):
        y0 = layer.forward(x, interventions={r: "zero"}, **opts)
        want = (dy.astype(np.float64) * (y.astype(np.float64) - y0)).sum(-1)
        assert np.allclose(attr[r], want, atol=1e-4), r


def test_gate_and_dropout_past_the_fast_score_range():
    """scores beyond the fast path's range (|s| > 131072): the forward and
    backward fall back to the reference, which must draw and gate alike"""
    m = randomized(mha.nn.Attention(16, 4, n_kv_heads=2, output_gate=True, dropout=0.5, bias=True), 14)
    with torch.no_grad():
        m.q_proj.weight.mul_(300)
        m.k_proj.weight.mul_(300)
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(15))
    keep = keep_of(module_seed(16), 0.5, 2, 4, 9, 9)
    y64, P, x64, _ = oracle(m, x, allowed=allowed_mask(2, 4, 9, 9, causal=True), keep=keep, p=0.5)
    s_max = 0
    with torch.no_grad():
        q = torch.chunk(m.q_proj(x).view(2, 9, 4, 8), 2, -1)[0]
        k = m.k_proj(x).view(2, 9, 2, 4).repeat_interleave(2, 2)
        s_max = (torch.einsum("bthe,bshe->bhts", q, k) / math.sqrt(4)).abs().max().item()
    assert s_max > 131072
    xs = x.clone().requires_grad_()
    torch.manual_seed(16)
    check_grads(m, xs, None, m(xs, causal=True), y64, P, x64, None, atol=5e-4)


def test_qwen1_c_proj_bias_when_no_bias_false(tmp_path):
    """QWenAttention: c_proj = nn.Linear(..., bias=not config.no_bias)"""
    fm, pf, rotate = _families()
    D, H = 32, 4
    rs = np.random.RandomState(44)
    w, b, wo, bo = pf.rnd(rs, 3 * D, D), pf.rnd(rs, 1, 3 * D)[0], pf.rnd(rs, D, D), pf.rnd(rs, 1, D)[0]
    t = {fm.QP + "c_attn.weight": w, fm.QP + "c_attn.bias": b, fm.QP + "c_proj.weight": wo, fm.QP + "c_proj.bias": bo}
    cfg = {"model_type": "qwen", "hidden_size": D, "num_attention_heads": H, "kv_channels": D // H,
           "rotary_emb_base": 10000, "seq_length": 64, "no_bias": False}
    x, y = pf.run(tmp_path, t, cfg, "transformer.h.0", D)
    q, k, v = np.split(x @ w.T + b, 3, axis=-1)
    q, k, v = pf.heads(q, H), pf.heads(k, H), pf.heads(v, H)
    pf.close(y, pf.attention(rotate(q, 8, 1e4, "halves"), rotate(k, 8, 1e4, "halves"), v, wo, bo))


def test_multihead_gqa_cross_extra_keys_dropout_gradients():
    """mha.nn.MultiheadAttention in training (the tape): GQA, kdim / vdim,
    bias_k / bias_v then the zero key (columns S, S + 1, never padded),
    a padding mask and a causal mask, dropout 0.35: y and every gradient
    against torch's semantics in float64 with the documented draw"""
    h, g, d, B, T, S = 4, 2, 4, 2, 7, 9
    m = randomized(mha.nn.MultiheadAttention(16, h, dropout=0.35, batch_first=True, kdim=12, vdim=10,
                                             num_kv_heads=g, add_bias_kv=True, add_zero_attn=True), 2)
    gen = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(B, T, 16, generator=gen), torch.randn(B, S, 12, generator=gen), torch.randn(B, S, 10, generator=gen)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1, 4:] = True
    am = torch.ones(T, S, dtype=torch.bool).triu(1)
    P = {n: t.detach().double().requires_grad_() for n, t in m.named_parameters()}
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    bq, bk, bv = P["in_proj_bias"].split([h * d, g * d, g * d])
    Q = (q64 @ P["q_proj_weight"].T + bq).view(B, T, h, d).transpose(1, 2)
    K = torch.cat([k64 @ P["k_proj_weight"].T + bk, P["bias_k"].expand(B, 1, g * d), q64.new_zeros(B, 1, g * d)], 1)
    V = torch.cat([v64 @ P["v_proj_weight"].T + bv, P["bias_v"].expand(B, 1, g * d), q64.new_zeros(B, 1, g * d)], 1)
    K = K.view(B, S + 2, g, d).transpose(1, 2).repeat_interleave(h // g, 1)
    V = V.view(B, S + 2, g, d).transpose(1, 2).repeat_interleave(h // g, 1)
    hide = torch.cat([am[None].expand(B, T, S) | kpm[:, None], torch.zeros(B, T, 2, dtype=torch.bool)], -1)
    s = (Q @ K.transpose(-1, -2) / math.sqrt(d)).masked_fill(hide[:, None], -math.inf)
    keep = torch.from_numpy(keep_of(module_seed(5), 0.35, B, h, T, S + 2))
    probs = torch.softmax(s, -1) * keep / (1 - float(np.float32(0.35)))
    y64 = ((probs @ V).transpose(1, 2).reshape(B, T, h * d)) @ P["out_proj.weight"].T + P["out_proj.bias"]
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    torch.manual_seed(5)
    y, _ = m(qs, ks, vs, key_padding_mask=kpm, attn_mask=am, need_weights=False)
    assert torch.allclose(y.double(), y64, atol=2e-5, rtol=0)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(6))
    (y * dy).sum().backward()
    (y64 * dy.double()).sum().backward()
    for a, b in ((qs, q64), (ks, k64), (vs, v64)):
        assert torch.allclose(a.grad.double(), b.grad, atol=2e-5, rtol=0)
    for n, t in m.named_parameters():
        assert torch.allclose(t.grad.double(), P[n].grad, atol=2e-5, rtol=0), n


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_redraws_the_same_mask(reentrant):
    """torch.utils.checkpoint recomputes the forward in the backward with
    torch's RNG state restored: the seed, hence the draw, must be the
    forward's, so the gradients equal those without checkpointing"""
    from torch.utils.checkpoint import checkpoint
    m = randomized(mha.nn.Attention(16, 4, n_kv_heads=2, output_gate=True, dropout=0.4, bias=True), 17)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(18))
    grads = []
    for ckpt in (False, True):
        m.zero_grad()
        xs = x.clone().requires_grad_()
        torch.manual_seed(19)
        y = checkpoint(lambda t: m(t, causal=True), xs, use_reentrant=reentrant) if ckpt else m(xs, causal=True)
        (y * torch.arange(y.numel()).view(y.shape).sin()).sum().backward()
        grads.append([xs.grad.clone()] + [p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
