"""Chunked attention (Llama 4's attention_chunk_size; options.chunk_size):
query i and key j attend each other only inside one chunk of C, as
Hugging Face's chunked causal mask writes it ((q_idx // C) == (kv_idx // C)
and kv_idx <= q_idx), against a float64 torch oracle: Layer.forward on both
paths, the cache's generation steps, mha.nn.Attention's gradients, the
`mha run --chunk` flag, refusals."""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
from io_helpers import mha as mha_cli  # noqa: E402
from test_modern_cli import llama_checkpoint, run  # noqa: E402

D, H, HKV, DK = 32, 4, 2, 8


def weights(seed=2):
    rng = np.random.default_rng(seed)
    w = {"w_q": rng.uniform(-.4, .4, (D, H * DK)), "w_k": rng.uniform(-.4, .4, (D, HKV * DK)),
         "w_v": rng.uniform(-.4, .4, (D, HKV * DK)), "w_o": rng.uniform(-.4, .4, (H * DK, D))}
    return {k: v.astype(np.float32) for k, v in w.items()}


def chunk_mask(T, C):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (j <= i) & (i // C == j // C)  # Hugging Face's chunked_causal_mask


def oracle(w, x, C, wt=None):
    """y (B,T,D) of causal self-attention inside chunks of C, float64 torch;
    wt: the weights as torch tensors (autograd), else w's."""
    t = wt if wt is not None else {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    x = torch.as_tensor(x, dtype=torch.float64)
    B, T, _ = x.shape
    q = (x @ t["w_q"]).view(B, T, H, DK).transpose(1, 2)
    k = (x @ t["w_k"]).view(B, T, HKV, DK).transpose(1, 2).repeat_interleave(H // HKV, 1)
    v = (x @ t["w_v"]).view(B, T, HKV, DK).transpose(1, 2).repeat_interleave(H // HKV, 1)
    s = (q @ k.transpose(-1, -2) / math.sqrt(DK)).masked_fill(~chunk_mask(T, C), float("-inf"))
    return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * DK) @ t["w_o"]


@pytest.mark.parametrize("C", [1, 3, 8, 50])
@pytest.mark.parametrize("path", ["reference", "fast"])
def test_forward_matches_oracle(C, path):
    w = weights()
    layer = mha.Layer(D, H, HKV, bias=False, weights=w)
    x = np.random.default_rng(C).uniform(-1, 1, (2, 30, D)).astype(np.float32)
    got = layer.forward(x, causal=True, chunk_size=C, path=path)
    np.testing.assert_allclose(got, oracle(w, x, C).numpy(), atol=2e-6, rtol=0)
    if C < 30:
        assert np.abs(got - layer.forward(x, causal=True)).max() > 1e-3


def test_cache_generation():
    """A prefill of 5 then one token per call: each step's row is the
    chunked forward's (chunks by cache position)."""
    w = weights(3)
    layer = mha.Layer(D, H, HKV, bias=False, weights=w)
    x = np.random.default_rng(4).uniform(-1, 1, (21, D)).astype(np.float32)
    cache = mha.Cache(layer, batch=1, capacity=32)
    got = [cache.forward(x[:5], chunk_size=4)] + [cache.forward(x[i:i + 1], chunk_size=4) for i in range(5, 21)]
    np.testing.assert_allclose(np.concatenate(got), oracle(w, x[None], 4)[0].numpy(), atol=2e-6, rtol=0)


def test_nn_attention_gradients():
    from mha.nn import Attention
    torch.manual_seed(1)
    attn = Attention(D, H, n_kv_heads=HKV, bias=False)
    x = torch.randn(2, 19, D)
    xs = x.clone().requires_grad_(True)
    y = attn(xs, causal=True, chunk_size=6)
    dy = torch.randn_like(y)
    y.backward(dy)
    ws = {n: getattr(attn, p).weight.detach().double().T.clone().requires_grad_(True)
          for n, p in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "o_proj"))}
    x64 = x.double().requires_grad_(True)
    want = oracle(None, x64, 6, ws)
    want.backward(dy.double())
    np.testing.assert_allclose(y.detach().numpy(), want.detach().numpy(), atol=3e-6, rtol=0)
    pairs = [(xs.grad, x64.grad)] + [(getattr(attn, p).weight.grad, ws[n].grad.T)
                                     for n, p in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"),
                                                  ("w_o", "o_proj"))]
    for got, ref in pairs:
        big = float(ref.abs().max())
        assert big > 0 and float((got.double() - ref).abs().max()) <= 1e-5 * big + 1e-6


def test_cli_flag(tmp_path):
    path, w, x = llama_checkpoint(tmp_path)
    got = run(tmp_path, "--weights", path, "--heads", 4, "--chunk", 2)
    T = x.shape[0]
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    xs = torch.tensor(x[None], dtype=torch.float64)
    q = (xs @ t["w_q"]).view(1, T, 4, 8).transpose(1, 2)
    k = (xs @ t["w_k"]).view(1, T, 2, 8).transpose(1, 2).repeat_interleave(2, 1)
    v = (xs @ t["w_v"]).view(1, T, 2, 8).transpose(1, 2).repeat_interleave(2, 1)
    s = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~chunk_mask(T, 2), float("-inf"))
    want = ((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(1, T, 32) @ t["w_o"])[0].numpy()
    np.testing.assert_allclose(got, want, atol=3e-5)
    r = mha_cli("run", "--input", tmp_path / "x.npy", "--output", tmp_path / "z.npy", "--weights", path,
                "--heads", 4, "--chunk", 2, "--window", 3, "--sink-tokens", 1, check=False)
    assert r.returncode == 2 and "--sink-tokens with --chunk" in r.stderr, r.stderr
    r = mha_cli("run", "--input", tmp_path / "x.npy", "--output", tmp_path / "z.npy", "--weights", path,
                "--heads", 4, "--chunk", 0, check=False)
    assert r.returncode == 2 and "--chunk" in r.stderr and not (tmp_path / "z.npy").exists()


def test_python_refusals():
    layer = mha.Layer(D, H, HKV, bias=False, weights=weights())
    x = np.zeros((1, 4, D), np.float32)
    with pytest.raises(mha.ArgumentError, match="chunk_size"):
        layer.forward(x, chunk_size=-2)
    with pytest.raises(mha.ArgumentError, match="without sink tokens"):
        layer.forward(x, chunk_size=2, window_left=1, sink_tokens=1)
