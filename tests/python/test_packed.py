"""Packed sequences (cu_seqlens, FlashAttention's varlen): one call over
rows cu[s]..cu[s+1]-1 of several sequences gives what each sequence gives
alone, forward (mha.Layer, both paths, every kernel set) and backward
(mha.nn.Attention's gradients are the sums of the separate calls'). The
oracle is the library's own call on each sequence alone, which needs no
statement of the packing; tests/test_packed.c also checks the hand-written
block mask."""
import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

import mha  # noqa: E402

CU = [0, 5, 6, 13, 20]


def random_layer(seed, **cfg):
    layer = mha.Layer(**cfg)
    rng = np.random.default_rng(seed)
    w = {k: rng.uniform(-0.5, 0.5, v.shape).astype(np.float32) for k, v in layer.weights().items()}
    layer.set_weights(w)
    return layer


def alone(layer, x, positions=None, **opt):
    """Each sequence of CU run as its own call, rows back in place."""
    ys = []
    for s in range(len(CU) - 1):
        a, b = CU[s], CU[s + 1]
        kw = dict(opt) if positions is None else dict(opt, positions=positions[:, a:b])
        ys.append(layer.forward(x[:, a:b], **kw))
    return np.concatenate(ys, axis=1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("path", ["reference", "fast"])
def test_layer_packed_equals_each_sequence_alone(causal, path, kernels):
    layer = random_layer(3, d_model=32, n_heads=4, n_kv_heads=2, rope={"pairing": "halves", "theta": 1000.0},
                         softcap=4.0)
    x = np.random.default_rng(4).standard_normal((2, CU[-1], 32)).astype(np.float32)
    pos = np.concatenate([np.arange(CU[s + 1] - CU[s]) for s in range(len(CU) - 1)])[None].repeat(2, 0)
    got = layer.forward(x, causal=causal, path=path, cu_seqlens=CU, positions=pos)
    want = alone(layer, x, positions=pos, causal=causal, path=path)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 2e-6 * scale, f"packed vs alone: {np.abs(got - want).max():.3g}"
    whole = layer.forward(x, causal=causal, path=path, positions=pos)
    assert np.abs(whole - want).max() > 1e-3  # without cu_seqlens the sequences see each other


def test_bad_boundaries_are_refused_naming_them():
    layer = random_layer(1, d_model=16, n_heads=2)
    x = np.zeros((1, 6, 16), np.float32)
    for cu, says in (([0, 3, 3, 6], r"cu_seqlens\[2\]=3 after \[1\]=3; expected strictly increasing"),
                     ([0, 3, 5], r"\[n_seqs=2\]=5; expected 0 and T=6"),
                     ([1, 6], r"cu_seqlens\[0\]=1"),):
        with pytest.raises(mha.ArgumentError, match=says):
            layer.forward(x, cu_seqlens=cu)
    with pytest.raises(mha.ShapeError, match="expected n \\+ 1 >= 2 boundaries"):
        layer.forward(x, cu_seqlens=[0])
    with pytest.raises(mha.ArgumentError, match="expected packed self-attention sequences"):
        layer.forward(x, np.zeros((1, 4, 16), np.float32), cu_seqlens=[0, 6])


@pytest.mark.skipif(torch is None, reason=TORCH_SKIP_REASON or "torch")
def test_attention_module_gradients_are_the_sums_of_the_sequences():
    """Training on packed documents: mha.nn.Attention (Llama / Qwen 3 style:
    RoPE, RMS QK-norm, GQA, sinks) over the packed rows; y and every
    gradient equal those of the sequences run one by one (positions
    restarting at each sequence's start in both)."""
    import mha.nn
    torch.manual_seed(0)
    m = mha.nn.Attention(32, 4, n_kv_heads=2, head_dim=8, rope={"pairing": "halves", "theta": 10000.0},
                         qk_norm="rms", sinks=True, bias=True)
    with torch.no_grad():
        for p in m.parameters():
            p.uniform_(-0.4, 0.4)
    x = torch.randn(2, CU[-1], 32)
    pos = torch.cat([torch.arange(CU[s + 1] - CU[s]) for s in range(len(CU) - 1)]).repeat(2, 1)
    dy = torch.randn(2, CU[-1], 32)

    def grads(run):
        m.zero_grad()
        xx = x.clone().requires_grad_(True)
        y = run(xx)
        (y * dy).sum().backward()
        return [y.detach(), xx.grad] + [p.grad.clone() for p in m.parameters()]

    packed = grads(lambda xx: m(xx, causal=True, positions=pos, cu_seqlens=CU))
    parts = grads(lambda xx: torch.cat([m(xx[:, CU[s]:CU[s + 1]], causal=True, positions=pos[:, CU[s]:CU[s + 1]])
                                        for s in range(len(CU) - 1)], dim=1))
    for i, (a, b) in enumerate(zip(packed, parts)):
        err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
        assert err <= 1e-5, f"tensor {i}: packed vs one by one {err:.3g}"


@pytest.mark.skipif(torch is None, reason=TORCH_SKIP_REASON or "torch")
def test_torch_tensor_boundaries_as_flash_attention_passes_them():
    """FlashAttention's varlen API takes cu_seqlens as an int32 tensor: Layer.forward and
    nn.Attention take one (np.size of a tensor is its .size method: a TypeError comparing a
    method with 2 before); float or 2-D tensors and nested lists are refused naming cu_seqlens."""
    layer = random_layer(2, d_model=16, n_heads=2)
    x = np.random.default_rng(5).standard_normal((2, CU[-1], 16)).astype(np.float32)
    want = layer.forward(x, causal=True, cu_seqlens=CU)
    for dtype in (torch.int32, torch.int64):
        got = layer.forward(x, causal=True, cu_seqlens=torch.tensor(CU, dtype=dtype))
        assert np.array_equal(got, want)
    att = mha.nn.Attention(16, 2)
    xt = torch.from_numpy(x).requires_grad_()
    y = att(xt, causal=True, cu_seqlens=torch.tensor(CU, dtype=torch.int32))
    assert torch.equal(y, att(xt, causal=True, cu_seqlens=CU))
    for bad, says in ((torch.tensor([0.0, 20.0]), "expected 2 integers"),
                      (torch.tensor([[0, 20]]), "expected n \\+ 1 >= 2 boundaries"),
                      ([[0, 5], [20]], r"cu_seqlens\[0\]=\[0, 5\] is a list")):
        with pytest.raises((mha.ShapeError, mha.ArgumentError), match=says):
            layer.forward(x, cu_seqlens=bad)


EMPTY_BATCH_CASES = [[0, 3], [5], "abc", [[0]], [0], [1, 0], [0, 0], [0, -1], [0, 6], [0, 3, 6], [0, 3, 3, 6],
                     [0, 5, 3, 6], [0, 2 ** 40], [0.0, 6.0], np.array([0, 3, 6], np.int64)]


def _verdict(att, x, **kw):
    """None when att accepts the call, else the exception."""
    try:
        att(x, **kw)
    except mha.MhaError as e:
        return e
    return None


@pytest.mark.skipif(torch is None, reason=TORCH_SKIP_REASON or "torch")
@pytest.mark.parametrize("cu", EMPTY_BATCH_CASES + [dict(sink_tokens=1, window=2, causal=True), dict(chunk_size=2),
                                                    dict(kv=4)], ids=str)
def test_empty_batch_judges_cu_seqlens_as_the_library(cu):
    """B = 0: mha.nn.Attention answers the empty output itself (the library refuses empty shapes),
    and took any cu_seqlens silently; now each gets the verdict a one-row batch gets from the
    library, in its words (the library's message holds the empty call's)."""
    import mha.nn
    att = mha.nn.Attention(16, 2)
    kw = dict(cu, cu_seqlens=[0, 3, 6]) if isinstance(cu, dict) else dict(cu_seqlens=cu)
    if "kv" in kw:  # S = 4 keys for T = 6 queries
        got = [_verdict(att, torch.randn(b, 6, 16), kv=torch.randn(b, kw["kv"], 16), cu_seqlens=kw["cu_seqlens"])
               for b in (0, 1)]
    else:
        got = [_verdict(att, torch.randn(b, 6, 16), **kw) for b in (0, 1)]
    empty, library = got
    assert type(empty) is type(library), (empty, library)
    if library is not None:
        assert str(empty) in str(library), (str(empty), str(library))


@pytest.mark.skipif(torch is None, reason=TORCH_SKIP_REASON or "torch")
def test_empty_sequence_dimension_refuses_every_cu_seqlens():
    """T = 0: 0 = cu[0] < ... < cu[n] = T holds for no n >= 1 (each sequence has a row), so every
    cu_seqlens is refused naming it (all were accepted); None still gives the empty output."""
    import mha.nn
    att = mha.nn.Attention(16, 2)
    x = torch.randn(2, 0, 16, requires_grad=True)
    for cu in ([0, 3], [0, 0], [0, 1, 2], torch.tensor([0, 3], dtype=torch.int32)):
        with pytest.raises(mha.ArgumentError, match=r"cu_seqlens.*T=0.*pass cu_seqlens=None"):
            att(x, cu_seqlens=cu)
    for cu, says in (([0], "expected n \\+ 1 >= 2 boundaries"), ([[0, 3]], "cu_seqlens"), ("ab", "cu_seqlens")):
        with pytest.raises(mha.ShapeError, match=says):
            att(x, cu_seqlens=cu)
    y = att(x)
    assert y.shape == (2, 0, 16)
    y.sum().backward()
    assert x.grad.shape == x.shape
