"""mha.nn.MultiheadAttention against torch.nn.MultiheadAttention in the same
run: outputs, attention weights, and the gradients of query, key, value and
every parameter, option by option; load_state_dict both ways; GQA against a
torch module whose kv heads are repeated; the refusals.

Tolerances: outputs 1e-5 x (1 + max|torch|) (fp32 against fp32); gradients
1e-4 x (1 + max|torch grad|): the backward accumulates in double, torch in
fp32, so the difference is torch's rounding over sums of up to B*T terms.

torch 1.13's forward has no is_causal: causal parity is checked against the
boolean mask torch.triu(ones(L,S), 1).
"""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha.nn  # noqa: E402


def randomize(m, seed):
    """Every parameter random (torch zeros the biases, which would hide bugs)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            bound = 1.0 if "bias" in name else 2.0 / math.sqrt(p.shape[-1])
            p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
    return m


def pair(E=16, h=4, seed=0, **kw):
    t = randomize(torch.nn.MultiheadAttention(E, h, **kw), 100 + seed)
    m = mha.nn.MultiheadAttention(E, h, **kw)
    m.load_state_dict(t.state_dict())
    return t, m


def close(got, want, rtol, what):
    got, want = got.detach(), want.detach()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != torch {tuple(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    tol = rtol * (1.0 + want.abs().max().item() if want.numel() else 1.0)
    assert err <= tol, f"{what}: max|mha - torch| = {err:.3g} > {tol:.3g}"


def inputs(shape_q, shape_k, shape_v, seed, self_attn=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g)
    if self_attn:
        return q, q, q
    return q, torch.randn(shape_k, generator=g), torch.randn(shape_v, generator=g)


def check(t, m, q, k, v, seed=7, torch_kw=None, **kw):
    """Runs both modules on copies of (q, k, v) that keep their aliasing,
    compares outputs, weights, and all gradients of <g, Y>; then again
    with need_weights=False (unless the caller set it), where mha.nn takes
    the training tape (mha_forward_train + mha_backward_tape)."""
    if "need_weights" not in kw:
        check(t, m, q, k, v, seed, None if torch_kw is None else dict(torch_kw, need_weights=False),
              need_weights=False, **kw)
    t.zero_grad(set_to_none=True)
    m.zero_grad(set_to_none=True)

    def leaves():
        memo = {}
        return [memo.setdefault(id(a), a.detach().clone().requires_grad_()) for a in (q, k, v)]
    qt, kt, vt = leaves()
    qm, km, vm = leaves()
    yt, wt = t(qt, kt, vt, **(torch_kw or kw))
    ym, wm = m(qm, km, vm, **kw)
    close(ym, yt, 1e-5, "attn_output")
    if wt is None:
        assert wm is None
    else:
        close(wm, wt, 1e-5, "attn_weights")
    g = torch.randn(yt.shape, generator=torch.Generator().manual_seed(seed))
    (yt * g).sum().backward()
    (ym * g).sum().backward()
    for name, a, b in (("query", qm, qt), ("key", km, kt), ("value", vm, vt)):
        close(a.grad, b.grad, 1e-4, f"d{name}")
    tp = dict(t.named_parameters())
    for name, p in m.named_parameters():
        close(p.grad, tp[name].grad, 1e-4, f"d{name}")
    return ym


# ------------------------------------------------------------------ options

@pytest.mark.parametrize("batch_first", [False, True])
def test_self_attention(batch_first):
    t, m = pair(batch_first=batch_first)
    q, k, v = inputs((2, 5, 16) if batch_first else (5, 2, 16), None, None, 1, self_attn=True)
    check(t, m, q, k, v)


@pytest.mark.parametrize("shapes", [((0, 3, 16), (0, 4, 16)), ((3, 0, 16), (3, 4, 16)), ((0, 16), (4, 16))],
                         ids=["empty batch", "no queries", "unbatched, no queries"])
def test_empty_inputs_give_empty_results_like_torch(shapes):
    """B = 0 or T = 0 (the library refuses them) gives torch's empty output
    and weights, and zero gradients for every input and parameter."""
    t, m = pair(batch_first=True)
    q, k, v = inputs(shapes[0], shapes[1], shapes[1], 4)
    check(t, m, q, k, v)
    with pytest.raises(mha.ShapeError, match="key has shape"):  # still checked against the query
        m(q, torch.randn(5, *shapes[1][1:]) if len(shapes[1]) == 3 else torch.randn(4, 8), v)


def test_distinct_query_key_value_tensors_same_width():
    t, m = pair()
    q, k, v = inputs((4, 2, 16), (6, 2, 16), (6, 2, 16), 2)
    check(t, m, q, k, v)


def test_key_is_value_cross_attention():
    t, m = pair()
    q, k, _ = inputs((4, 2, 16), (6, 2, 16), (6, 2, 16), 3)
    check(t, m, q, k, k)


def test_kdim_vdim_no_bias():
    t, m = pair(kdim=6, vdim=5, bias=False)
    q, k, v = inputs((3, 2, 16), (7, 2, 6), (7, 2, 5), 4)
    check(t, m, q, k, v)


def test_add_bias_kv_and_zero_attn():
    t, m = pair(add_bias_kv=True, add_zero_attn=True)
    q, k, v = inputs((4, 2, 16), (5, 2, 16), (5, 2, 16), 5)
    check(t, m, q, k, v)
    t, m = pair(add_bias_kv=True, seed=1)
    check(t, m, q, q, q)


def test_key_padding_masks_bool_and_float():
    t, m = pair(batch_first=True)
    q, k, v = inputs((2, 4, 16), (2, 6, 16), (2, 6, 16), 6)
    pad = torch.tensor([[False, False, True, False, True, False], [False] * 5 + [True]])
    check(t, m, q, k, v, key_padding_mask=pad)
    check(t, m, q, k, v, key_padding_mask=torch.randn(2, 6))


def test_float_mask_refilled_before_backward_keeps_the_gradients():
    """A float32 mask refilled in place between forward and backward (a
    reused buffer) does not change the gradients: the forward's mask is
    the one differentiated, as with the inputs."""
    t, m = pair(batch_first=True)
    q, _, _ = inputs((2, 4, 16), (2, 4, 16), (2, 4, 16), 9)
    grads = []
    for refill in (False, True):
        mask = torch.randn(4, 4, generator=torch.Generator().manual_seed(3))
        pad = torch.randn(2, 4, generator=torch.Generator().manual_seed(4))
        m.zero_grad(set_to_none=True)
        x = q.clone().requires_grad_()
        y, _ = m(x, x, x, attn_mask=mask, key_padding_mask=pad)
        if refill:
            mask.fill_(-5.0), pad.fill_(3.0)
        y.sum().backward()
        grads.append([x.grad] + [p.grad for p in m.parameters()])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_attn_masks_2d_bool_3d_float():
    t, m = pair()
    q, k, v = inputs((4, 2, 16), (6, 2, 16), (6, 2, 16), 7)
    mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(1)) < 0.4
    mask[:, 0] = False  # every row keeps a key
    check(t, m, q, k, v, attn_mask=mask)
    check(t, m, q, k, v, attn_mask=torch.randn(2 * 4, 4, 6))


def test_weights_per_head_and_none():
    t, m = pair()
    q, k, v = inputs((4, 2, 16), (6, 2, 16), (6, 2, 16), 8)
    check(t, m, q, k, v, average_attn_weights=False)
    check(t, m, q, k, v, need_weights=False)


def test_tape_path_taken_and_same_gradient_bits():
    """need_weights=False keeps a tape in ctx (the mha_backward_tape path);
    need_weights=True runs the stateless pair. Both backwards are the fast
    backward: the same gradient bits."""
    _, m = pair(batch_first=True)
    q, k, v = inputs((2, 5, 16), (2, 7, 16), (2, 7, 16), 10)
    grads = []
    for need in (False, True):
        m.zero_grad(set_to_none=True)
        leaves = [a.detach().clone().requires_grad_() for a in (q, k, v)]
        y, _ = m(*leaves, need_weights=need)
        assert (y.grad_fn.train is not None) == (not need)
        y.backward(torch.ones_like(y))
        grads.append([a.grad for a in leaves] + [p.grad for p in m.parameters()])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_tape_refused_falls_back_to_stateless():
    """A query with no allowed key in NaN mode: no tape (the fast backward
    refuses), the stateless backward's reference fallback, torch's NaNs."""
    t, m = pair(batch_first=True)
    q, k, v = inputs((1, 3, 16), (1, 4, 16), (1, 4, 16), 11)
    pad = torch.tensor([[True, True, True, True]])  # every key padded: every row NaN
    y, _ = m(q, k, v, key_padding_mask=pad, need_weights=False)
    assert y.grad_fn.train is None and torch.isnan(y).all()
    yt, _ = t(q, k, v, key_padding_mask=pad, need_weights=False)
    assert torch.isnan(yt).all()


def test_overflowing_tape_backward_falls_back_to_the_reference():
    """dy near FLT_MAX: the tape's fp32 sums overflow (the fast backward gave
    NaN in every element of dx with status OK); the backward reruns the
    stateless pair, whose AUTO path recomputes in double: query's gradient
    is finite and torch float64's."""
    t, m = pair(E=32, h=4, batch_first=True)
    g = torch.Generator().manual_seed(12)
    q = torch.randn((2, 20, 32), generator=g)
    dy = torch.randn((2, 20, 32), generator=g)
    dy = dy / dy.abs().max() * 3e38
    leaf = q.clone().requires_grad_()
    y, _ = m(leaf, leaf, leaf, need_weights=False)
    assert y.grad_fn.train is not None  # the tape path
    y.backward(dy)
    q64 = q.double().requires_grad_()
    y64, _ = t.double()(q64, q64, q64, need_weights=False)
    y64.backward(dy.double())
    assert torch.isfinite(leaf.grad).all()
    close(leaf.grad.double(), q64.grad, 1e-5, "query.grad")


def test_is_causal_equals_torch_triu_mask():
    t, m = pair(batch_first=True)
    q, k, v = inputs((2, 5, 16), None, None, 9, self_attn=True)
    triu = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    check(t, m, q, k, v, torch_kw={"attn_mask": triu}, is_causal=True)


def test_unbatched():
    t, m = pair()
    q, k, v = inputs((4, 16), (6, 16), (6, 16), 10)
    check(t, m, q, k, v, key_padding_mask=torch.tensor([False, True, False, False, False, False]))


def test_fully_masked_row_is_nan_like_torch():
    t, m = pair(batch_first=True)
    q, k, v = inputs((1, 3, 16), (1, 4, 16), (1, 4, 16), 11)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[1] = True
    yt, _ = t(q, k, v, attn_mask=mask)
    ym, _ = m(q, k, v, attn_mask=mask)
    assert torch.equal(torch.isnan(ym), torch.isnan(yt)) and torch.isnan(ym[0, 1]).all()
    z = mha.nn.MultiheadAttention(16, 4, batch_first=True, masked_rows="zero")
    z.load_state_dict(t.state_dict())
    qz = q.clone().requires_grad_()
    yz, _ = z(qz, k, v, attn_mask=mask)
    close(yz[0, 1], z.out_proj.bias, 1e-6, "masked row = b_O")
    yz.sum().backward()
    assert torch.count_nonzero(qz.grad[0, 1]) == 0 and torch.count_nonzero(qz.grad[0, 0]) > 0


# ------------------------------------------------------------------ GQA

def test_gqa_equals_torch_with_repeated_kv_heads():
    E, h, h_kv, d = 16, 4, 2, 4
    m = randomize(mha.nn.MultiheadAttention(E, h, num_kv_heads=h_kv), 20)
    assert m.k_proj_weight.shape == (h_kv * d, E) and m.in_proj_bias.shape == (E + 2 * h_kv * d,)
    rep = torch.arange(h).div(h // h_kv, rounding_mode="floor")  # kv head of query head r
    rows = (rep[:, None] * d + torch.arange(d)).reshape(-1)         # torch K/V rows <- GQA rows
    t = torch.nn.MultiheadAttention(E, h)
    with torch.no_grad():
        b = m.in_proj_bias
        t.in_proj_weight.copy_(torch.cat([m.q_proj_weight, m.k_proj_weight[rows], m.v_proj_weight[rows]]))
        t.in_proj_bias.copy_(torch.cat([b[:E], b[E:E + h_kv * d][rows], b[E + h_kv * d:][rows]]))
        t.out_proj.load_state_dict(m.out_proj.state_dict())
    q, k, v = inputs((4, 2, E), (6, 2, E), (6, 2, E), 21)
    ym, _ = m(q, k, v)
    yt, _ = t(q, k, v)
    close(ym, yt, 1e-5, "GQA output")
    g = torch.randn(yt.shape)
    (ym * g).sum().backward()
    (yt * g).sum().backward()
    tw, tb = t.in_proj_weight.grad, t.in_proj_bias.grad
    for i, (w, off) in enumerate(((m.k_proj_weight, E), (m.v_proj_weight, 2 * E))):
        # a kv head's gradient is the sum over the query heads of its group
        want = torch.zeros_like(w).index_add_(0, rows, tw[off:off + E])
        close(w.grad, want, 1e-4, "dk_proj_weight" if i == 0 else "dv_proj_weight")
        bo = E + i * h_kv * d
        want_b = torch.zeros(h_kv * d).index_add_(0, rows, tb[off:off + E])
        close(m.in_proj_bias.grad[bo:bo + h_kv * d], want_b, 1e-4, "d in_proj_bias kv")
    close(m.q_proj_weight.grad, tw[:E], 1e-4, "dq_proj_weight")


# ------------------------------------------------------- state dicts, refusals

def test_state_dict_round_trip_both_ways():
    for kw in ({}, {"kdim": 6, "vdim": 5, "add_bias_kv": True}, {"bias": False}):
        t, m = pair(**kw)
        assert set(m.state_dict()) == set(t.state_dict())
        t2 = torch.nn.MultiheadAttention(16, 4, **kw)
        t2.load_state_dict(m.state_dict())
        for n, p in t.state_dict().items():
            assert torch.equal(t2.state_dict()[n], p), n


def test_refusals():
    with pytest.raises(ValueError, match="dropout"):
        mha.nn.MultiheadAttention(16, 4, dropout=1.0)  # test_dropout.py: 0 <= dropout < 1 is attention dropout
    with pytest.raises(ValueError, match="num_kv_heads"):
        mha.nn.MultiheadAttention(16, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="float32"):
        mha.nn.MultiheadAttention(16, 4, dtype=torch.float64)
    m = mha.nn.MultiheadAttention(16, 4)
    with pytest.raises(TypeError, match="float32"):
        x = torch.randn(3, 1, 16, dtype=torch.float64)
        m(x, x, x)
    with pytest.raises(mha.ShapeError, match="attn_mask"):
        x = torch.randn(3, 1, 16)
        m(x, x, x, attn_mask=torch.zeros(2, 2, dtype=torch.bool))


# --------------------------------------------------------------- attribution

def test_head_attribution_binding_equals_zero_ablation():
    rng = np.random.default_rng(3)
    layer = mha.Layer(16, 4, n_kv_heads=2, weights=None)
    w = {k: rng.uniform(-0.5, 0.5, v.shape).astype(np.float32) for k, v in layer.weights().items()}
    layer.set_weights(w)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    dy = rng.standard_normal((2, 5, 16)).astype(np.float32)
    attr, dz = mha.nn.head_attribution(layer, x, dy, causal=True, dz=True)
    assert attr.shape == (4, 2, 5) and dz.shape == (2, 5, 16)
    y = layer.forward(x, causal=True)
    for r in range(4):
        ya = layer.forward(x, causal=True, interventions={r: "zero"})
        change = (dy * (y - ya)).sum(-1)
        assert np.abs(change).max() > 1e-3
        np.testing.assert_allclose(attr[r], change, atol=1e-5)
