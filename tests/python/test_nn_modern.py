"""mha.nn.Attention (today's attention layer, trainable) against a float64
torch oracle written here from the model families' published definitions:
Hugging Face Llama's rotate_half and GPT-J's interleaved RoPE
(test_modern's apply_rope), the ALiBi paper's slopes as BLOOM computes
them (test_modern's alibi_slopes) with the distance penalty
-slope |p_i - p_j| (BLOOM's +slope p_j is the same softmax under a causal
mask), Gemma 2's soft-cap c tanh(s/c), gpt-oss's sinks (one more logit
per head in the softmax, with no value), Qwen 3's RMSNorm of each head's
q and k, LayerNorm without bias, OLMo 2's norm over the whole q and k.

Each case compares y and the gradient of <g, y> for x (and kv) and every
parameter, from torch.autograd on the oracle with the same parameters in
float64, as max|mha - oracle| <= RTOL * max|oracle| (the library computes
in fp32 from fp32 weights; its variant backward accumulates in double).
"""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
import mha.nn  # noqa: E402
from io_helpers import write_safetensors  # noqa: E402
from test_modern import alibi_slopes, apply_rope, rms_norm  # noqa: E402

RTOL = 1e-5
WORST = {}  # what -> the largest relative error seen (for reports: pytest -s prints nothing of it)


@pytest.fixture(autouse=True)
def seeded():
    """Inputs drawn with torch.randn are the same on every run."""
    torch.manual_seed(0)


# ------------------------------------------------------------------ oracle

def layer_norm(x, w, eps):  # LayerNorm over the last dim, weight only (no bias)
    mu = x.mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt((x - mu).pow(2).mean(-1, keepdim=True) + eps) * w


def oracle(p, kw, x, kv=None, causal=False, window=None, positions=None, key_positions=None,
           key_padding_mask=None, attn_mask=None, align="top_left", sink_tokens=0):
    """y (B,T,d_model) in float64 from p (the module's state_dict names ->
    float64 tensors) and the constructor's arguments kw."""
    h = kw["n_heads"]
    h_kv = kw.get("n_kv_heads") or h
    d = kw.get("head_dim") or kw["d_model"] // h
    B, T = x.shape[:2]
    src = x if kv is None else kv
    S = src.shape[1]

    def linear(name, a):
        b = p.get(name + ".bias")
        return a @ p[name + ".weight"].T + (0 if b is None else b)
    q, k, v = linear("q_proj", x), linear("k_proj", src), linear("v_proj", src)  # (B,T|S,heads*d)
    if kw.get("output_gate"):  # Qwen3-Next: q_proj gives each head's query then its gate (B,T,h,2d)
        q, gate = (t.reshape(B, T, h * d) for t in q.view(B, T, h, 2 * d).chunk(2, dim=-1))
    if kw.get("clip_qkv"):  # OLMo 1 / DBRX / MPT: q, k, v clamped before the norms and RoPE
        c = kw["clip_qkv"]
        q, k, v = q.clamp(min=-c, max=c), k.clamp(min=-c, max=c), v.clamp(min=-c, max=c)
    norm = {"rms": rms_norm, "layer": layer_norm, "layernorm": layer_norm}.get(kw.get("qk_norm", "none"))
    eps = kw.get("qk_norm_eps", 1e-6)
    if norm and kw.get("qk_norm_whole"):  # OLMo 2: over all heads' q (h*d), before the split
        q, k = norm(q, p["q_norm.weight"], eps), norm(k, p["k_norm.weight"], eps)
    q = q.view(B, T, h, d).transpose(1, 2)        # (B,h,T,d)
    k = k.view(B, S, h_kv, d).transpose(1, 2)     # (B,h_kv,S,d)
    v = v.view(B, S, h_kv, d).transpose(1, 2)
    if norm and not kw.get("qk_norm_whole"):      # Qwen 3: each head's d; shared (d) or per head (h*d)
        per = kw.get("qk_norm_per_head")
        q = norm(q, p["q_norm.weight"].view(h, 1, d) if per else p["q_norm.weight"], eps)
        k = norm(k, p["k_norm.weight"].view(h_kv, 1, d) if per else p["k_norm.weight"], eps)
    pq = torch.arange(T).expand(B, T) if positions is None else torch.as_tensor(positions).long()
    if key_positions is not None:
        pk = torch.as_tensor(key_positions).long()
    else:
        pk = pq if kv is None else torch.arange(S).expand(B, S)
    rope = kw.get("rope")
    if rope:
        dim, theta = rope.get("dim") or d, rope.get("theta", 10000.0)
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        if rope.get("scaling") == "linear":  # positions / factor
            inv_freq = inv_freq / rope["factor"]
        inter = rope["pairing"] == "interleaved"
        q = apply_rope(q, pq, dim, theta, inter, inv_freq)
        k = apply_rope(k, pk, dim, theta, inter, inv_freq)
    if kw.get("temperature"):  # Llama 4: q at position p times 1 + a ln(1 + floor((p + 1) / F)), last
        F, a = kw["temperature"][:2]
        shift = 0 if kw["temperature"][2:] == ("ministral3",) else 1  # Ministral 3: floor(p / F)
        q = q * (1 + a * torch.log1p(torch.floor((pq.double() + shift) / F)))[:, None, :, None]
    k, v = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)  # kv head r // (h/h_kv)
    s = q @ k.transpose(-1, -2) * (kw.get("scale") or 1 / math.sqrt(d))  # (B,h,T,S)
    if kw.get("softcap"):  # Gemma 2
        c = kw["softcap"]
        s = c * torch.tanh(s / c)
    if kw.get("alibi"):
        dist = (pq[:, None, :, None] - pk[:, None, None, :]).abs().double()
        s = s - p["alibi_slopes"][None, :, None, None] * dist
    i = torch.arange(T)[:, None] + (S - T if align == "bottom_right" else 0)
    j = torch.arange(S)[None, :]
    allowed = torch.ones(B, h, T, S, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window is not None:  # Mistral: the last `window` keys, the query's own included
        allowed &= (j > i - window) | (j < sink_tokens)  # StreamingLLM keeps the first sink_tokens
    if key_padding_mask is not None:
        if key_padding_mask.dtype == torch.bool:
            allowed &= ~key_padding_mask[:, None, None, :]
        else:
            s = s + key_padding_mask[:, None, None, :].double()
    if attn_mask is not None:
        m = attn_mask if attn_mask.dim() != 3 else attn_mask.view(B, h, T, S)
        if m.dtype == torch.bool:
            allowed &= ~m
        else:
            s = s + m.double()
    row_any = allowed.any(-1, keepdim=True)
    s = s.masked_fill(~allowed, float("-inf")).masked_fill(~row_any, 0.0)  # no NaN from empty rows
    if kw.get("sinks"):  # gpt-oss: a sink column joins the softmax and is dropped
        col = p["sinks"][None, :, None, None].expand(B, h, T, 1)
        prob = torch.softmax(torch.cat((s, col), dim=-1), dim=-1)[..., :-1]
    else:
        prob = torch.softmax(s, dim=-1)
    prob = prob * row_any  # masked_rows='zero': a query with no key gives Z = 0
    z = (prob @ v).transpose(1, 2).reshape(B, T, h * d)
    if kw.get("output_gate"):
        z = z * torch.sigmoid(gate)
    return linear("o_proj", z)


# ----------------------------------------------------------------- helpers

def make(seed=0, **kw):
    """An Attention with every parameter random (norm weights near 1, sinks
    of either sign, biases nonzero) so that no term hides."""
    m = mha.nn.Attention(**kw)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in m.named_parameters():
            u = torch.rand(t.shape, generator=gen) * 2 - 1
            if name.endswith("norm.weight"):
                t.copy_(1 + 0.5 * u)
            elif name == "sinks":
                t.copy_(1.5 * u)
            else:
                t.copy_(u * (1.0 if name.endswith("bias") else 2.0 / math.sqrt(t.shape[-1])))
    return m


def close(got, want, what, floor=0.0):
    got, want = got.detach().double(), want.detach()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}; expected {tuple(want.shape)}"
    peak = want.abs().max().item()
    assert peak > 0, f"{what}: the oracle's value is all zeros; the comparison would prove nothing"
    rel = (got - want).abs().max().item() / max(peak, floor)
    WORST[what] = max(WORST.get(what, 0.0), rel)
    assert rel <= RTOL, f"{what}: max|mha - oracle| / max|oracle| = {rel:.3g} > {RTOL}"


def check(kw, B=2, T=7, S=None, seed=0, grad_x=True, **call):
    """y and every gradient of <g, y> of Attention(**kw) against the oracle;
    S: a cross-attention source of S rows (kv_dim from kw). Returns the
    module and y."""
    m = make(seed, **kw)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(B, T, kw["d_model"], generator=gen)
    kv = None if S is None else torch.randn(B, S, kw.get("kv_dim") or kw["d_model"], generator=gen)
    xm = x.clone().requires_grad_(grad_x)
    kvm = None if kv is None else kv.clone().requires_grad_()
    p64 = {n: t.detach().double().requires_grad_(t.dtype.is_floating_point and n != "alibi_slopes")
           for n, t in m.state_dict().items()}
    x64 = x.double().requires_grad_(grad_x)
    kv64 = None if kv is None else kv.double().requires_grad_()
    y = m(xm, kvm, **call)
    y64 = oracle(p64, kw, x64, kv64, **call)
    close(y, y64, "y")
    g = torch.randn(y.shape, generator=gen)
    (y * g).sum().backward()
    (y64 * g.double()).sum().backward()
    if grad_x:
        close(xm.grad, x64.grad, "dx")
    if kv is not None:
        close(kvm.grad, kv64.grad, "dkv")
    for name, t in m.named_parameters():
        assert t.grad is not None, f"parameter {name} got no gradient"
        # k_proj.bias's gradient is zero in exact arithmetic without RoPE,
        # QK-norm or sinks (softmax ignores a constant added to a row): its
        # sums cancel, so it is measured against the scale of k_proj.weight's
        floor = p64["k_proj.weight"].grad.abs().max().item() if name == "k_proj.bias" else 0.0
        close(t.grad, p64[name].grad, f"d {name}", floor)
    return m, y


def variant_kw(h=4, h_kv=2, d=8, d_model=32, **variants):
    return dict(d_model=d_model, n_heads=h, n_kv_heads=h_kv, head_dim=d, **variants)


ALL = dict(rope={"pairing": "halves", "theta": 500000.0}, alibi=True, softcap=2.0, sinks=True, qk_norm="rms",
           bias=True)


# ------------------------------------------------------------ each variant

VARIANTS = {
    "plain": {},
    "rope_halves": dict(rope={"pairing": "halves"}),
    "rope_interleaved_partial": dict(rope={"pairing": "interleaved", "dim": 4, "theta": 500000.0}),
    "rope_linear_scaling": dict(rope={"pairing": "halves", "scaling": "linear", "factor": 4.0}),
    "alibi": dict(alibi=True),
    "softcap": dict(softcap=0.8),
    "sinks": dict(sinks=True),
    "qk_rms_shared": dict(qk_norm="rms"),
    "qk_rms_per_head": dict(qk_norm="rms", qk_norm_per_head=True),
    "qk_layer_shared": dict(qk_norm="layer", qk_norm_eps=1e-5),
    "qk_layernorm_per_head": dict(qk_norm="layernorm", qk_norm_per_head=True),
    "qk_rms_whole": dict(qk_norm="rms", qk_norm_whole=True),
    "qk_layer_whole": dict(qk_norm="layer", qk_norm_whole=True),
    "bias": dict(bias=True),
    "bias_qkv": dict(bias="qkv"),
    "scale": dict(scale=0.2),
    "clip_qkv": dict(clip_qkv=0.6, bias=True),  # about half of q, k, v clamped
    "temperature": dict(temperature=(2, 0.5), bias=True),  # Llama 4's NoPE layers: T 7 sees four factors
    "temperature_ministral3": dict(rope={"pairing": "halves"}, temperature=(2, 0.5, "ministral3")),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_alone(name):
    check(variant_kw(**VARIANTS[name]), causal=True)


@pytest.mark.parametrize("h_kv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("call", [dict(causal=True), dict(causal=True, window=3), dict()],
                         ids=["causal", "window", "bidirectional"])
def test_all_variants_together(h_kv, call):
    check(variant_kw(h_kv=h_kv, **ALL), **call)


@pytest.mark.parametrize("bias", [False, True, "qkv"])
@pytest.mark.parametrize("h_kv", [4, 2, 1])
def test_output_gate_qwen3_next(bias, h_kv):
    """Gated attention as Qwen3NextAttention computes it (q_proj's rows per
    head: query then gate; Z * sigmoid(gate) before o_proj), with its RMS
    QK-norm and partial rotary, causal; every gradient, q_proj's holding
    both the query's and the gate's."""
    kw = variant_kw(h_kv=h_kv, bias=bias, output_gate=True, qk_norm="rms",
                    rope={"pairing": "halves", "theta": 10000.0, "dim": 4})
    m, _ = check(kw, causal=True)
    assert m.q_proj.weight.shape == (2 * 4 * 8, 32)


def test_output_gate_with_every_variant_and_cross_attention():
    check(variant_kw(output_gate=True, kv_dim=24, **ALL), S=9)


def test_output_gate_module_runs_as_its_layer():
    """to_layer() of a gated module is a gated mha.Layer with the same y."""
    m = make(3, **variant_kw(output_gate=True, bias=True))
    x = torch.randn(2, 5, 32)
    layer = m.to_layer()
    assert layer.weights()["w_g"].shape == (32, 4 * 8)
    y = m(x).detach().numpy()
    np.testing.assert_allclose(layer.forward(x.numpy()), y, rtol=0, atol=1e-6)


@pytest.mark.parametrize("h_kv", [4, 2], ids=["MHA", "GQA"])
def test_clip_qkv_with_the_other_variants_and_cross_attention(h_kv):
    """OLMo 1 / DBRX (clip_qkv with RoPE, GQA) and every variant with it,
    self and cross attention: y and all gradients against torch's clamp
    (whose gradient is 0 where a projection was clamped)."""
    kw = variant_kw(h_kv=h_kv, **dict(ALL, clip_qkv=0.6))
    m, _ = check(kw, causal=True, window=3)
    with torch.no_grad():  # the clamp matters: a good share of the projections is beyond 0.6
        x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
        assert 0.2 < (m.q_proj(x).abs() > 0.6).double().mean().item() < 0.8
    check(dict(kw, kv_dim=24), S=9)


@pytest.mark.parametrize("h_kv", [4, 1], ids=["MHA", "MQA"])
def test_temperature_with_the_other_variants_positions_and_cross_attention(h_kv):
    """Llama 4's query temperature after QK-norm and RoPE, with every
    variant; explicit positions past several floors choose the factors;
    cross-attention (the keys untouched)."""
    kw = variant_kw(h_kv=h_kv, **dict(ALL, temperature=(3, 0.4)))
    check(kw, causal=True)
    pos = torch.tensor([[0, 5, 11, 2, 40, 3, 8], [100, 1, 2, 3, 4, 5, 6]])
    check(kw, positions=pos)
    check(dict(kw, kv_dim=24), S=9, positions=pos)


def test_all_variants_olmo2_whole_width_layernorm_interleaved():
    check(variant_kw(**dict(ALL, qk_norm="layer", qk_norm_whole=True, rope={"pairing": "interleaved"})),
          causal=True, window=4)


def test_cross_attention_with_its_own_width_and_positions():
    kw = variant_kw(kv_dim=20, **ALL)
    check(kw, T=5, S=9)  # keys at 0..S-1
    pos = torch.tensor([[3, 4, 5, 6, 7], [0, 2, 4, 6, 8]])
    kpos = torch.arange(9).expand(2, 9) * 2
    check(kw, T=5, S=9, positions=pos, key_positions=kpos)
    check(kw, T=5, S=9, causal=True, align="bottom_right")



def tape_spy(monkeypatch):
    """A list that gets, per forward that builds a graph, whether the
    library granted a tape (mha_forward_train) or refused it."""
    granted = []
    real = mha.nn._forward_train

    def spy(*a):
        out = real(*a)
        granted.append(out is not None)
        return out
    monkeypatch.setattr(mha.nn, "_forward_train", spy)
    return granted


def test_alibi_queries_far_from_every_key(monkeypatch):
    """ALiBi with the queries near position 2^30 and the keys at 0..S-1:
    every score of a row is about -slope 2^30, beyond what fp32 resolves.
    The library refuses the tape there (the fast path's range rule checks
    each row's largest score) and the stateless backward's AUTO runs the
    reference: y and every gradient are the oracle's (before: 130% off)."""
    granted = tape_spy(monkeypatch)
    pos = 2 ** 30 - torch.arange(5).expand(2, 5) * 3
    kpos = torch.arange(9).expand(2, 9)
    check(variant_kw(kv_dim=20, alibi=True), T=5, S=9, positions=pos, key_positions=kpos)
    assert granted == [False]


def test_window_with_streaming_llm_sink_tokens():
    check(variant_kw(**ALL), T=9, causal=True, window=3, sink_tokens=2)


def test_explicit_positions_self_attention():
    pos = torch.tensor([[10, 11, 12, 13, 14, 15], [0, 1, 2, 3, 100, 101]])
    m, y = check(variant_kw(**ALL), T=6, causal=True, positions=pos)
    # kv=x is self-attention: the keys take the queries' positions (not 0..S-1)
    x = torch.randn(2, 6, 32)
    assert torch.equal(m(x, x, causal=True, positions=pos), m(x, causal=True, positions=pos))


def test_padding_masks_bool_and_float():
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 5:] = True
    pad[1, :2] = True
    check(variant_kw(**ALL), key_padding_mask=pad)
    check(variant_kw(**ALL), causal=True, key_padding_mask=pad)  # row 0 of batch 1: no key -> zero
    add = torch.randn(2, 7, generator=torch.Generator().manual_seed(3))
    check(variant_kw(**ALL), key_padding_mask=add)


@pytest.mark.parametrize("shape", [(7, 7), (8, 7, 7), (2, 1, 7, 7), (1, 4, 7, 7)],
                         ids=["T,S", "B*h,T,S", "B,1,T,S", "1,h,T,S"])
def test_attn_masks_bool_and_float(shape):
    gen = torch.Generator().manual_seed(5)
    m = torch.rand(shape, generator=gen) < 0.3
    check(variant_kw(**ALL), attn_mask=m)
    check(variant_kw(**ALL), attn_mask=torch.randn(shape, generator=gen))


def test_one_query_and_head_dim_not_a_multiple_of_16():
    check(variant_kw(**ALL), T=1, causal=True)
    check(variant_kw(h=3, h_kv=1, d=6, d_model=15, **ALL), T=5, causal=True)
    check(variant_kw(h=2, h_kv=2, d=10, d_model=12, **dict(ALL, rope={"pairing": "interleaved", "dim": 6})),
          T=4, S=3, causal=True, align="bottom_right")


def test_nan_rows_and_zero_rows():
    """masked_rows='nan': a query with no key gives NaN (torch's softmax);
    'zero': zero before o_proj (y = o_proj's bias) and zero gradient; with
    sinks zero in either mode."""
    pad = torch.tensor([[True, True, True, False, False]])
    m = make(1, **variant_kw(rope={"pairing": "halves"}, bias=True, masked_rows="nan"))
    x = torch.randn(1, 5, 32)
    y = m(x, causal=True, key_padding_mask=pad)
    assert torch.isnan(y[0, :3]).all() and torch.isfinite(y[0, 3:]).all()
    z = make(1, **variant_kw(rope={"pairing": "halves"}, bias=True))
    xz = x.clone().requires_grad_()
    y = z(xz, causal=True, key_padding_mask=pad)
    assert torch.allclose(y[0, :3], z.o_proj.bias.detach().expand(3, 32), rtol=0, atol=1e-6)
    y.sum().backward()
    assert torch.count_nonzero(xz.grad[0, :3]) == 0 and torch.count_nonzero(xz.grad[0, 3:]) > 0
    # with sinks a query with no key puts all its weight on the sink: zero in
    # both modes (torch's softmax over the scores and the sink logit)
    s = make(1, **variant_kw(rope={"pairing": "halves"}, bias=True, sinks=True, masked_rows="nan"))
    xs = x.clone().requires_grad_()
    y = s(xs, causal=True, key_padding_mask=pad)
    assert torch.allclose(y[0, :3], s.o_proj.bias.detach().expand(3, 32), rtol=0, atol=1e-6)
    y.sum().backward()
    assert torch.isfinite(xs.grad).all() and torch.isfinite(s.sinks.grad).all()
    assert torch.count_nonzero(xs.grad[0, :3]) == 0


def test_input_without_grad_and_frozen_parameters():
    """Only what requires grad is asked of the library and gets a gradient."""
    m = make(2, **variant_kw(**ALL))
    m.q_proj.weight.requires_grad_(False)
    x = torch.randn(2, 5, 32)
    m(x, causal=True).sum().backward()
    assert x.grad is None and m.q_proj.weight.grad is None and m.sinks.grad is not None
    check(variant_kw(**ALL), seed=2, grad_x=False, causal=True)  # the parameters' against the oracle


# -------------------------------------------------------------- autograd paths

@pytest.mark.parametrize("kw", [variant_kw(), variant_kw(**ALL)], ids=["plain", "all variants"])
def test_tape_taken_where_granted_and_fallback_gives_the_same_gradients(monkeypatch, kw):
    """A layer gets a tape (mha_forward_train), variants included; refusing
    it (as the library does for NaN-mode masked rows) runs the stateless pair: the
    same gradients, the fast backward's bits both ways."""
    m = make(3, **kw)
    x = torch.randn(2, 6, 32)
    grads = []
    for refuse in (False, True):
        if refuse:
            monkeypatch.setattr(mha.nn, "_forward_train", lambda *a: None)
        m.zero_grad(set_to_none=True)
        xl = x.clone().requires_grad_()
        y = m(xl, causal=True)
        assert (y.grad_fn.train is None) == refuse
        y.backward(torch.ones_like(y))
        grads.append([xl.grad] + [p.grad for p in m.parameters()])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_variant_layers_get_a_tape(monkeypatch):
    """The library grants a tape to a layer with every variant (its fast
    backward serves them), and the gradients from it are right (check()
    compares them with the oracle)."""
    granted = tape_spy(monkeypatch)
    check(variant_kw(**ALL), causal=True)
    assert granted and all(granted)


def test_no_tape_without_a_backward(monkeypatch):
    calls = []
    monkeypatch.setattr(mha.nn, "_forward_train", lambda *a: calls.append(1))
    m = make(4, **variant_kw(**ALL))
    with torch.no_grad():
        y = m(torch.randn(1, 3, 32))
    assert y.grad_fn is None and calls == []


def test_double_backward_refused():
    m = make(5, **variant_kw(**ALL))
    x = torch.randn(1, 4, 32, requires_grad=True)
    with pytest.raises(mha.UnsupportedError, match="create_graph"):
        torch.autograd.grad(m(x).sum(), x, create_graph=True)


def test_empty_batch_or_no_queries():
    for B, T in ((0, 4), (2, 0)):
        m = make(6, **variant_kw(**ALL))
        x = torch.randn(B, T, 32, requires_grad=True)
        y = m(x, causal=True)
        assert y.shape == (B, T, 32)
        y.sum().backward()
        assert x.grad is not None and not x.grad.any()
        for name, p in m.named_parameters():
            assert p.grad is not None and not p.grad.any(), name
    with pytest.raises(mha.ShapeError, match="kv has shape"):
        m(torch.randn(0, 4, 32), torch.randn(0, 3, 31))


# ------------------------------------------------------------- module level

def test_parameter_names_are_hugging_faces_and_state_dict_round_trips():
    m = make(7, **variant_kw(**dict(ALL, qk_norm_per_head=True)))
    sd = m.state_dict()
    assert set(sd) == {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_proj.bias",
                       "k_proj.bias", "v_proj.bias", "o_proj.bias", "sinks", "q_norm.weight", "k_norm.weight",
                       "alibi_slopes"}
    assert sd["q_proj.weight"].shape == (32, 32) and sd["k_proj.weight"].shape == (16, 32)
    assert sd["q_norm.weight"].shape == (32,) and sd["k_norm.weight"].shape == (16,)
    assert "alibi_slopes" not in dict(m.named_parameters())  # a buffer: not trained
    np.testing.assert_allclose(sd["alibi_slopes"].numpy(), alibi_slopes(4), rtol=1e-7)
    other = mha.nn.Attention(**variant_kw(**dict(ALL, qk_norm_per_head=True)))
    other.load_state_dict(sd)
    x = torch.randn(2, 5, 32)
    assert torch.equal(other(x, causal=True), m(x, causal=True))
    plain = mha.nn.Attention(32, 4)
    assert set(plain.state_dict()) == {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}


def test_alibi_slopes_buffer_is_used():
    """Slopes set in the buffer (a checkpoint's own) are the ones applied."""
    m = make(8, **variant_kw(alibi=True))
    with torch.no_grad():
        m.alibi_slopes.copy_(torch.tensor([1.0, 0.0, 0.3, 2.0]))
    check_kw = variant_kw(alibi=True)
    x = torch.randn(1, 6, 32)
    p64 = {n: t.double() for n, t in m.state_dict().items()}
    close(m(x, causal=True), oracle(p64, check_kw, x.double(), causal=True), "y custom slopes")


def test_state_dict_is_a_checkpoint_the_hf_loader_reads(tmp_path):
    """The names are the ones mha's hf layout reads (Qwen 3: q/k/v/o_proj,
    q_norm.weight, k_norm.weight; RoPE from the metadata): the loaded
    mha.Layer computes the module's y; to_layer() gives the same."""
    kw = variant_kw(rope={"pairing": "halves", "theta": 1000000.0}, qk_norm="rms")
    m = make(9, **kw)
    sd = {f"model.layers.0.self_attn.{n}": t.numpy() for n, t in m.state_dict().items()}
    path = str(tmp_path / "model.safetensors")
    write_safetensors(path, sd, metadata={"rope": "halves", "rope_theta": 1000000})
    layer = mha.Layer.load(path, layout="hf", n_heads=4, n_kv_heads=2)
    x = torch.randn(2, 6, 32)
    want = m(x, causal=True).detach().numpy()
    np.testing.assert_allclose(layer.forward(x.numpy(), causal=True), want, atol=1e-5)
    np.testing.assert_allclose(m.to_layer().forward(x.numpy(), causal=True), want, atol=1e-6)


def test_an_optimizer_step_reduces_the_loss():
    torch.manual_seed(0)
    m = mha.nn.Attention(**variant_kw(**ALL))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x, target = torch.randn(4, 8, 32), torch.randn(4, 8, 32)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = (m(x, causal=True) - target).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses
    assert m.sinks.grad.abs().max() > 0 and m.q_norm.weight.grad.abs().max() > 0


# -------------------------------------------------------------- refusals

@pytest.mark.parametrize("kw,error,match", [
    (dict(rope={"pairing": "halves", "dim": 3}), mha.ArgumentError, "rope.dim=3"),
    (dict(rope={"pairing": "halves", "base": 10}), mha.ArgumentError, "rope keys"),
    (dict(n_kv_heads=3), mha.ArgumentError, "n_kv_heads=3 does not divide n_heads=4"),
    (dict(softcap=-1.0), mha.ArgumentError, "softcap=-1"),
    (dict(qk_norm="batch"), mha.ArgumentError, "qk_norm='batch'"),
    (dict(qk_norm="rms", qk_norm_eps=0.0), mha.ArgumentError, "qk_norm_eps"),
    (dict(qk_norm_whole=True), mha.ArgumentError, "without qk_norm"),
    (dict(bias="qk"), mha.ArgumentError, "bias='qk'"),
    (dict(masked_rows="inf"), mha.ArgumentError, "masked_rows"),
    (dict(scale=-1.0), mha.ArgumentError, "scale"),
    (dict(clip_qkv=0.0), mha.ArgumentError, "clip_qkv=0.0; expected None"),
    (dict(clip_qkv=-2.0), mha.ArgumentError, "clip_qkv=-2.0"),
    (dict(clip_qkv=float("inf")), mha.ArgumentError, "clip_qkv=inf"),
    (dict(head_dim=None, d_model=30), ValueError, "d_model=30 is not a multiple of n_heads=4"),
    (dict(dtype=torch.float64), ValueError, "float32"),
    (dict(alibi="yes"), mha.ArgumentError, "alibi"),
])
def test_bad_arguments_are_named(kw, error, match):
    args = dict(variant_kw(), **kw)
    with pytest.raises(error, match=match):
        mha.nn.Attention(**args)


def test_bad_calls_are_named():
    m = mha.nn.Attention(**variant_kw(rope={"pairing": "halves"}))
    x = torch.randn(2, 5, 32)
    with pytest.raises(TypeError, match="x must be a float32 CPU tensor"):
        m(x.double())
    with pytest.raises(mha.ShapeError, match=r"x has shape \(2, 5, 31\)"):
        m(torch.randn(2, 5, 31))
    with pytest.raises(mha.ShapeError, match="kv has shape"):
        m(x, torch.randn(3, 4, 32))
    with pytest.raises(mha.ShapeError, match="attn_mask"):
        m(x, attn_mask=torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(mha.ArgumentError, match="window=0"):
        m(x, window=0)
    with pytest.raises(mha.ShapeError, match="positions"):
        m(x, positions=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="parameter q_proj.weight is torch.float64"):
        m.double()(x)


@pytest.mark.parametrize("rope", [True, "halves", 10000.0, ["pairing", "halves"]])
def test_rope_that_is_not_a_dict_is_named(rope):
    # rope=True raised "TypeError: 'bool' object is not iterable" from dict(rope), naming nothing
    with pytest.raises(mha.ArgumentError, match=r"rope=.*expected None or a dict of the RoPE settings"):
        mha.nn.Attention(32, 4, rope=rope)
