"""Issue 13's "done when": attention layers written as PyTorch modules
(torch.nn.Linear projections, the model families' published forward
code) save their state_dict under the names the models use; `mha run`
loads each checkpoint and reproduces the module's own forward.
- Llama style: q/k/v/o_proj without bias, GQA (4 heads, 2 kv heads),
  RoPE halves (rotate_half), theta 500000, causal.
- BLOOM style: one fused query_key_value Linear with bias, viewed
  (T, h, 3, d) as BLOOM does, dense with bias, ALiBi added as
  slope * key position, causal.
Also `mha run --window W --sink-tokens N` against StreamingLLM's mask."""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch
from io_helpers import mha, write_safetensors

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

from test_modern import alibi_slopes, rotate_half, torch_attention  # noqa: E402

D, T = 32, 13
nn = torch.nn


class LlamaStyleAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, theta):
        super().__init__()
        self.h, self.h_kv, self.d, self.theta = n_heads, n_kv_heads, d_model // n_heads, theta
        self.q_proj = nn.Linear(d_model, n_heads * self.d, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d, bias=False)
        self.o_proj = nn.Linear(n_heads * self.d, d_model, bias=False)

    def forward(self, x):  # x (B, T, d_model)
        B, n, _ = x.shape
        q = self.q_proj(x).view(B, n, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, n, self.h_kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, n, self.h_kv, self.d).transpose(1, 2)
        inv_freq = 1.0 / self.theta ** (torch.arange(0, self.d, 2, dtype=x.dtype) / self.d)
        ang = torch.arange(n, dtype=x.dtype)[:, None] * inv_freq[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.h // self.h_kv, dim=1)
        v = v.repeat_interleave(self.h // self.h_kv, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        z = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, n, -1)
        return self.o_proj(z)


class BloomStyleAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h, self.d = n_heads, d_model // n_heads
        self.query_key_value = nn.Linear(d_model, 3 * d_model, bias=True)
        self.dense = nn.Linear(d_model, d_model, bias=True)

    def forward(self, x):  # x (B, T, d_model)
        B, n, _ = x.shape
        fused = self.query_key_value(x).view(B, n, self.h, 3, self.d)
        q, k, v = (fused[..., i, :].transpose(1, 2) for i in range(3))
        slopes = torch.tensor(alibi_slopes(self.h), dtype=x.dtype)
        alibi = slopes[:, None, None] * torch.arange(n, dtype=x.dtype)[None, None, :]
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d) + alibi
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        z = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, n, -1)
        return self.dense(z)


def save_and_run(tmp_path, module, prefix, *flags):
    """Saves module's state_dict (float32, names under prefix), runs `mha
    run` on a random x and returns (mha's y, the module's y in float64)."""
    torch.manual_seed(5)
    for p in module.parameters():  # larger than the default init: a test that can fail
        nn.init.uniform_(p, -0.4, 0.4)
    path = tmp_path / "layer.safetensors"
    write_safetensors(path, {prefix + k: v.detach().numpy() for k, v in module.state_dict().items()})
    x = np.random.default_rng(6).uniform(-1, 1, (T, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npy"
    mha("run", "--weights", path, "--input", tmp_path / "x.npy", "--output", out, "--causal", *flags)
    with torch.no_grad():
        want = module.double()(torch.tensor(x[None], dtype=torch.float64))[0].numpy()
    return np.load(out), want


def test_llama_module(tmp_path):
    module = LlamaStyleAttention(D, 4, 2, 500000.0)
    got, want = save_and_run(tmp_path, module, "model.layers.0.self_attn.", "--heads", 4, "--rope", "halves",
                             "--rope-theta", 500000)
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.abs(want).max() > 0.1


def test_bloom_module(tmp_path):
    module = BloomStyleAttention(D, 4)
    got, want = save_and_run(tmp_path, module, "h.0.self_attention.", "--heads", 4, "--alibi")
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.abs(want).max() > 0.1


def test_run_window_with_sink_tokens(tmp_path):
    """--window 4 --sink-tokens 2: torch's StreamingLLM mask (the first 2
    keys plus the last 4) on the Llama-style module's weights."""
    module = LlamaStyleAttention(D, 4, 2, 500000.0)
    got, _ = save_and_run(tmp_path, module, "model.layers.0.self_attn.", "--heads", 4, "--rope", "halves",
                          "--rope-theta", 500000, "--window", 4, "--sink-tokens", 2)
    sd = {k: v.detach().float().numpy() for k, v in module.state_dict().items()}
    w = {n: sd["%s_proj.weight" % n[2]].T for n in ("w_q", "w_k", "w_v", "w_o")}
    x = np.load(tmp_path / "x.npy")
    want = torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, False), streaming=(4, 2))[0]
    np.testing.assert_allclose(got, want, atol=2e-5)
    plain = torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, False), streaming=(4, 0))[0]
    assert np.abs(plain - want).max() > 1e-3  # the sinks matter
    r = mha("run", "--weights", tmp_path / "layer.safetensors", "--input", tmp_path / "x.npy", "--output",
            tmp_path / "z.npy", "--heads", 4, "--sink-tokens", 2, check=False)
    assert r.returncode != 0 and "--sink-tokens needs --window" in r.stdout + r.stderr
    assert not (tmp_path / "z.npy").exists()
