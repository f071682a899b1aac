"""Attention dropout (options.dropout_p, dropout_seed; mha.nn modules'
dropout in training mode) against an oracle that draws the dropped entries
itself: the documented draw (include/mha.h, src/core/mask.c) written here
again in numpy — per query row (b, r, i) splitmix64's finalizer at step
row + 1 of the Weyl sequence from the seed (row = (b h + r) T + i), its top
half the row's start, its low half (odd) the row's step; per key j
murmur3's 32-bit finalizer of start + j step, kept when at or above
floor(p 2^32) — and a float64 torch
layer that multiplies its softmax by that mask / (1 - p). Then y, the
captured probabilities and every gradient agree; eval mode is torch's own
module; torch.manual_seed makes a training step repeatable.
"""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
import mha.nn  # noqa: E402

SEED_HIGH = 2 ** 62  # the modules draw their seed as torch.randint(0, 2**62)


def keep_mask(seed, p, B, h, T, Sx):
    """(B,h,T,Sx) bool: the entries the library keeps, drawn independently of it."""
    u32 = np.uint32
    with np.errstate(over="ignore"):
        row = np.arange(B * h * T, dtype=np.uint64)
        x = np.uint64(seed) + (row + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
        start = (x >> np.uint64(32)).astype(u32)  # (B*h*T,)
        step = (x & np.uint64(0xFFFFFFFF)).astype(u32) | u32(1)
        y = start[:, None] + np.arange(Sx, dtype=u32)[None, :] * step[:, None]
        y = (y ^ (y >> u32(16))) * u32(0x85EBCA6B)
        y = (y ^ (y >> u32(13))) * u32(0xC2B2AE35)
    bits = y ^ (y >> u32(16))
    cut = np.uint32(math.floor(float(np.float32(p)) * 2.0 ** 32))
    return (bits >= cut).reshape(B, h, T, Sx)


def next_seed(torch_seed):
    """The seed a module draws after torch.manual_seed(torch_seed)."""
    torch.manual_seed(torch_seed)
    return int(torch.randint(0, SEED_HIGH, (1,)).item())


def oracle(m, x, keep, p):
    """y (B,T,E), probs (B,h,T,Sx) of torch.nn.MultiheadAttention's math in
    float64 (batch first, self-attention) with its softmax times keep / (1 - p)."""
    E, h = m.embed_dim, m.num_heads
    d = E // h
    B, T = x.shape[:2]
    W, b = m.in_proj_weight.double(), m.in_proj_bias.double()
    q, k, v = (x @ W[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E] for i in range(3))
    if m.bias_k is not None:  # the learned row, then the zero row: keys S and S + 1
        k = torch.cat((k, m.bias_k.double().expand(B, 1, E)), 1)
        v = torch.cat((v, m.bias_v.double().expand(B, 1, E)), 1)
    if m.add_zero_attn:
        k, v = torch.cat((k, k.new_zeros(B, 1, E)), 1), torch.cat((v, v.new_zeros(B, 1, E)), 1)
    Sx = k.shape[1]
    q = q.view(B, T, h, d).transpose(1, 2)
    k, v = k.view(B, Sx, h, d).transpose(1, 2), v.view(B, Sx, h, d).transpose(1, 2)
    probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) * torch.from_numpy(keep) / (1 - p)
    z = (probs @ v).transpose(1, 2).reshape(B, T, E)
    return z @ m.out_proj.weight.double().T + m.out_proj.bias.double(), probs


def module(p, seed=0, **kw):
    m = mha.nn.MultiheadAttention(16, 4, dropout=p, batch_first=True, **kw)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, t in m.named_parameters():
            t.copy_(torch.rand(t.shape, generator=gen) - 0.5)
    return m


@pytest.mark.parametrize("need_weights", [True, False])  # the stateless path, and the tape's
@pytest.mark.parametrize("extra", [{}, {"add_bias_kv": True, "add_zero_attn": True}])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_training_step_matches_the_oracle_with_the_same_draw(p, extra, need_weights):
    m = module(p, **extra)
    B, T = 2, 6
    Sx = T + 2 * bool(extra)
    x = torch.randn(B, T, 16, generator=torch.Generator().manual_seed(1))
    xm, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    keep = keep_mask(next_seed(7), p, B, 4, T, Sx)
    assert 0 < (~keep).sum() < keep.size  # the draw drops some and keeps some
    torch.manual_seed(7)
    y, w = m(xm, xm, xm, need_weights=need_weights, average_attn_weights=False)
    ref = module(p, **extra)  # the same parameters, as float64 leaves
    p64 = {n: t.detach().double().requires_grad_() for n, t in ref.named_parameters()}
    for n, t in p64.items():
        obj, attr = (ref.out_proj, n.split(".")[1]) if n.startswith("out_proj") else (ref, n)
        delattr(obj, attr)
        setattr(obj, attr, t)
    y64, w64 = oracle(ref, x64, keep, p)
    assert torch.allclose(y.double(), y64, atol=1e-5, rtol=0), (y.double() - y64).abs().max()
    if need_weights:
        assert torch.allclose(w.double(), w64, atol=1e-6, rtol=0)  # the dropped probabilities, as torch returns
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    (y * g).sum().backward()
    (y64 * g.double()).sum().backward()
    assert torch.allclose(xm.grad.double(), x64.grad, atol=1e-5, rtol=0)
    for n, t in m.named_parameters():
        assert torch.allclose(t.grad.double(), p64[n].grad, atol=2e-5, rtol=0), n


def test_layer_forward_drops_what_the_draw_says():
    rs = np.random.RandomState(3)
    w = {n: rs.uniform(-.5, .5, s).astype(np.float32) for n, s in
         (("w_q", (16, 16)), ("w_k", (16, 16)), ("w_v", (16, 16)), ("w_o", (16, 16)))}
    layer = mha.Layer(16, 4, bias=False, weights=w)
    x = np.random.RandomState(4).randn(2, 5, 16).astype(np.float32)
    _, plain = layer.forward(x, causal=True, capture="probs")
    _, dropped = layer.forward(x, causal=True, capture="probs", dropout_p=0.3, dropout_seed=2 ** 63 + 5)
    keep = keep_mask(2 ** 63 + 5, 0.3, 2, 4, 5, 5)
    np.testing.assert_allclose(dropped["probs"], plain["probs"] * keep / np.float32(0.7), rtol=1e-5, atol=1e-7)
    with pytest.raises(mha.ArgumentError, match="dropout_p=1"):
        layer.forward(x, dropout_p=1.0)
    with pytest.raises(mha.ArgumentError, match="dropout_seed"):
        layer.forward(x, dropout_p=0.1, dropout_seed=-1)


def test_eval_mode_is_torchs_module_and_training_repeats_with_its_seed():
    t = torch.nn.MultiheadAttention(16, 4, dropout=0.4, batch_first=True)
    m = module(0.4)
    t.load_state_dict(m.state_dict())
    x = torch.randn(2, 5, 16)
    t.eval(), m.eval()
    with torch.no_grad():
        assert torch.allclose(m(x, x, x)[0], t(x, x, x)[0], atol=1e-5)
    m.train()
    with torch.no_grad():
        torch.manual_seed(3)
        a = m(x, x, x)[0]
        torch.manual_seed(3)
        b = m(x, x, x)[0]
        c = m(x, x, x)[0]  # the generator moved on: another draw
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_attention_module_dropout():
    """mha.nn.Attention(dropout=p): training draws, eval does not."""
    m = mha.nn.Attention(16, 4, n_kv_heads=2, dropout=0.25, rope={"pairing": "halves"})
    x = torch.randn(1, 6, 16)
    m.eval()
    with torch.no_grad():
        y_eval = m(x, causal=True)
        m.dropout = 0.0
        m.train()
        assert torch.equal(m(x, causal=True), y_eval)  # dropout 0 in training: the same layer
        m.dropout = 0.25
        torch.manual_seed(9)
        y1 = m(x, causal=True)
    assert not torch.allclose(y1, y_eval)
    xm = x.clone().requires_grad_()
    torch.manual_seed(9)
    y2 = m(xm, causal=True)
    assert torch.equal(y2.detach(), y1)  # the tape forward draws what the plain forward drew
    y2.sum().backward()
    assert xm.grad is not None and torch.isfinite(xm.grad).all()


def test_dropout_of_any_real_type():
    for p in (np.float32(0.25), np.float64(0.25), 0, torch.tensor(0.25).item()):
        assert mha.nn.MultiheadAttention(16, 4, dropout=p).dropout == float(p)


@pytest.mark.parametrize("p", [1.0, -0.1, 1.5, "0.1", True, float("nan"), np.bool_(True)])
def test_bad_dropout_is_named(p):
    with pytest.raises(ValueError, match="dropout="):
        mha.nn.MultiheadAttention(16, 4, dropout=p)
    with pytest.raises(ValueError, match="dropout="):
        mha.nn.Attention(16, 4, dropout=p)
