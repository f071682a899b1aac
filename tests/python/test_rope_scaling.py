"""RoPE scalings that depend on the call, against an oracle written from
Hugging Face's definitions (modeling_rope_utils: _compute_dynamic_ntk_parameters,
_compute_longrope_parameters and the dynamic update of the rotary module):
the sequence length a call reads is 1 + its largest position; dynamic NTK
raises the base to theta (factor seq/L - factor + 1)^(r/(r-2)) past L;
LongRoPE divides each pair's frequency by its short factor, or its long one
past L, and multiplies cos and sin by attn_factor in every call. Generation
with a KV cache keeps each key as its own step rotated it (the cache stores
rotated K, as Hugging Face's does). Also: Phi-3's and InternLM2's config.json
through `mha run`, the --rope-scale flag, and the refusals."""
import json
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch
import mha
from io_helpers import mha as mha_cli

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

from test_modern import torch_attention  # noqa: E402
from test_modern_cli import T, llama_checkpoint, run  # noqa: E402

D, H, HKV, DK = 32, 4, 2, 8
CTX = 16  # L: the context the scalings name


def hf_inv_freq(kind, dim, theta, seq, L, factor=1.0, short=None, long=None, attn=None):
    """(inv_freq (dim/2), mscale) of Hugging Face's rotary module for a call
    whose largest position is seq - 1."""
    shape = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    if kind == "dynamic":
        base = theta * ((factor * seq / L) - (factor - 1)) ** (dim / (dim - 2)) if seq > L else theta
        return 1.0 / base ** shape, 1.0
    ext = torch.tensor(long if seq > L else short, dtype=torch.float64)
    if attn is None:
        attn = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(L))
    return 1.0 / (ext * theta ** shape), attn


SHORT = [1.0, 1.25, 1.5, 2.0]
LONG = [1.0, 3.0, 9.0, 27.0]
SCALINGS = {
    "longrope": dict(scaling="longrope", factor=8.0, short_factor=SHORT, long_factor=LONG),
    "dynamic": dict(scaling="dynamic", factor=4.0),
}


def layer_and_weights(kind, seed=5):
    rng = np.random.default_rng(seed)
    w = {"w_q": rng.uniform(-.4, .4, (D, H * DK)), "w_k": rng.uniform(-.4, .4, (D, HKV * DK)),
         "w_v": rng.uniform(-.4, .4, (D, HKV * DK)), "w_o": rng.uniform(-.4, .4, (H * DK, D))}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    rope = dict(pairing="halves", theta=100.0, original_max_positions=CTX, **SCALINGS[kind])
    return mha.Layer(D, H, HKV, bias=False, weights=w, rope=rope), w


def oracle_rope(kind, seq):
    s = SCALINGS[kind]
    inv, ms = hf_inv_freq(kind, DK, 100.0, seq, CTX, s["factor"], s.get("short_factor"), s.get("long_factor"))
    return (DK, 100.0, False, inv, ms)


@pytest.mark.parametrize("kind", ["longrope", "dynamic"])
@pytest.mark.parametrize("T_", [12, 16, 17, 40])
@pytest.mark.parametrize("path", ["reference", "fast"])
def test_forward_matches_oracle(kind, T_, path):
    layer, w = layer_and_weights(kind)
    x = np.random.default_rng(T_).uniform(-1, 1, (2, T_, D)).astype(np.float32)
    want = torch_attention(w, x, H, HKV, DK, rope=oracle_rope(kind, T_))
    got = layer.forward(x, causal=True, path=path)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
    # the call's length matters: the frequencies of the other side of L give another y
    other = torch_attention(w, x, H, HKV, DK, rope=oracle_rope(kind, CTX + 1 if T_ <= CTX else CTX))
    assert np.abs(other - want).max() > 1e-3


@pytest.mark.parametrize("kind", ["longrope", "dynamic"])
def test_positions_set_the_call_length(kind):
    """Explicit positions: seq is 1 + the largest of the batch's positions
    (Hugging Face: max(position_ids) + 1), for every row of the call."""
    layer, w = layer_and_weights(kind)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 6, D)).astype(np.float32)
    for top in (9, 15, 16, 30):
        pos = np.array([[0, 1, 2, 3, 4, 5], [top - 5, top - 4, top - 3, top - 2, top - 1, top]])
        want = torch_attention(w, x, H, HKV, DK, pos=pos, rope=oracle_rope(kind, top + 1))
        got = layer.forward(x, causal=True, positions=pos)
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def cached_oracle(kind, w, x, prefill):
    """Generation as Hugging Face runs it: a prefill call of `prefill`
    tokens, then one token per call; each call's q and its new k are
    rotated with that call's frequencies (seq = its last position + 1) and
    the k stay in the cache as rotated. y (T, D) in float64."""
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    xs = torch.tensor(x, dtype=torch.float64)
    Tn = xs.shape[0]
    ks, vs, ys = [], [], []
    calls = [(0, prefill)] + [(i, i + 1) for i in range(prefill, Tn)]
    for a, b in calls:
        _, _, _, inv, ms = oracle_rope(kind, b)
        pos = torch.arange(a, b, dtype=torch.float64)
        ang = pos[:, None] * inv  # (n, dim/2)
        cos, sin = torch.cat((ang, ang), -1).cos() * ms, torch.cat((ang, ang), -1).sin() * ms

        def rot(m, heads):
            m = m.view(b - a, heads, DK)
            half = torch.cat((-m[..., DK // 2:], m[..., :DK // 2]), -1)
            return m * cos[:, None] + half * sin[:, None]
        q = rot(xs[a:b] @ t["w_q"], H)
        ks.append(rot(xs[a:b] @ t["w_k"], HKV))
        vs.append((xs[a:b] @ t["w_v"]).view(b - a, HKV, DK))
        k, v = torch.cat(ks), torch.cat(vs)
        z = torch.zeros(b - a, H, DK, dtype=torch.float64)
        for r in range(H):
            s = q[:, r] @ k[:, r // (H // HKV)].T / math.sqrt(DK)
            s = s.masked_fill(torch.arange(b)[None, :] > torch.arange(a, b)[:, None], float("-inf"))
            z[:, r] = torch.softmax(s, -1) @ v[:, r // (H // HKV)]
        ys.append(z.reshape(b - a, H * DK) @ t["w_o"])
    return torch.cat(ys).numpy()


@pytest.mark.parametrize("kind", ["longrope", "dynamic"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cache_generation_across_the_context(kind, dtype):
    """Prefill 10 tokens (within L = 16), then decode one token per call to
    24: the steps past L switch to the long factors / the larger base for
    their own q and k only, as Hugging Face's generation does."""
    layer, w = layer_and_weights(kind)
    x = np.random.default_rng(3).uniform(-1, 1, (24, D)).astype(np.float32)
    want = cached_oracle(kind, w, x, 10)
    cache = mha.Cache(layer, batch=1, capacity=32, dtype=dtype)
    got = [cache.forward(x[:10])] + [cache.forward(x[i:i + 1]) for i in range(10, 24)]
    tol = 2e-6 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(np.concatenate(got), want, atol=tol, rtol=0)
    # a cache replaying the whole prefix at once is one call of length 24: another y past L
    whole = layer.forward(x[None], causal=True)[0]
    assert np.abs(whole[16:] - want[16:]).max() > 1e-3
    np.testing.assert_allclose(whole, torch_attention(w, x[None], H, HKV, DK, rope=oracle_rope(kind, 24))[0],
                               atol=2e-6, rtol=0)


def test_training_gradients_match_torch_autograd():
    """mha.nn.Attention with LongRoPE past L (T 20): y and the gradients of
    x and the projections are those of the oracle under torch autograd in
    float64 (the fast backward recomputes the call's rows with the same
    frequencies)."""
    from mha.nn import Attention
    from test_modern import apply_rope
    torch.manual_seed(0)
    rope = dict(pairing="halves", theta=100.0, original_max_positions=CTX, **SCALINGS["longrope"])
    attn = Attention(D, H, n_kv_heads=HKV, bias=False, rope=rope)
    x = torch.randn(2, 20, D)
    xs = x.clone().requires_grad_(True)
    y = attn(xs, causal=True)
    dy = torch.randn_like(y)
    y.backward(dy)
    ws = [m.weight.detach().double().requires_grad_(True) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)]
    x64 = x.double().requires_grad_(True)
    _, _, _, inv, ms = oracle_rope("longrope", 20)
    pos = torch.arange(20).expand(2, 20)
    q = apply_rope((x64 @ ws[0].T).view(2, 20, H, DK).transpose(1, 2), pos, DK, 100.0, False, inv, ms)
    k = apply_rope((x64 @ ws[1].T).view(2, 20, HKV, DK).transpose(1, 2), pos, DK, 100.0, False, inv, ms)
    v = (x64 @ ws[2].T).view(2, 20, HKV, DK).transpose(1, 2)
    k, v = k.repeat_interleave(H // HKV, 1), v.repeat_interleave(H // HKV, 1)
    s_ = (q @ k.transpose(-1, -2) / math.sqrt(DK)).masked_fill(torch.ones(20, 20).triu(1).bool(), float("-inf"))
    want = (torch.softmax(s_, -1) @ v).transpose(1, 2).reshape(2, 20, H * DK) @ ws[3].T
    want.backward(dy.double())
    np.testing.assert_allclose(y.detach().numpy(), want.detach().numpy(), atol=3e-6, rtol=0)
    for got, ref in [(xs.grad, x64.grad)] + [(m.weight.grad, w.grad) for m, w in
                                             zip((attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj), ws)]:
        scale = float(ref.abs().max())
        assert scale > 0 and float((got.double() - ref).abs().max()) <= 1e-5 * scale + 1e-6


def phi3_config(tmp_path, original, longest):
    """Phi-3 mini 128k's rope keys: top-level original_max_position_embeddings,
    max_position_embeddings, rope_scaling {"type": "longrope"|"su", lists}."""
    return dict(model_type="phi3", rope_theta=10000.0, max_position_embeddings=longest,
                original_max_position_embeddings=original,
                rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG})


@pytest.mark.parametrize("original", [400, 1000])
def test_phi3_longrope_config_runs_as_torch(tmp_path, original):
    """p.npy puts the call's last position at (T-1) * 97 + 5: past 400
    (long factors), within 1000 (short); the growth 8192 / L gives
    attn_factor."""
    path, w, x = llama_checkpoint(tmp_path)
    cfg = {"architectures": ["Phi3ForCausalLM"], "hidden_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "torch_dtype": "float32", **phi3_config(tmp_path, original, 8192)}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    pos = (np.arange(T) * 97 + 5).astype(np.int64)
    np.save(tmp_path / "p.npy", pos)
    seq = int(pos.max()) + 1
    inv, ms = hf_inv_freq("longrope", 8, 10000.0, seq, original, 8192 / original, SHORT, LONG)
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos[None], rope=(8, 10000.0, False, inv, ms))[0]
    got = run(tmp_path, "--weights", path, "--positions", tmp_path / "p.npy")
    np.testing.assert_allclose(got, want, atol=3e-5)
    cfg["rope_scaling"]["type"] = "su"  # Phi-3's first configs: the same scaling
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    np.testing.assert_array_equal(run(tmp_path, "--weights", path, "--positions", tmp_path / "p.npy"), got)
    other = hf_inv_freq("longrope", 8, 10000.0, 1 if seq > original else 10 ** 6, original, 8192 / original,
                        SHORT, LONG)
    unlike = torch_attention(w, x[None], 4, 2, 8, pos=pos[None], rope=(8, 10000.0, False, *other))[0]
    assert np.abs(unlike - want).max() > 1e-3  # the threshold picked the list


def test_dynamic_config_and_flag(tmp_path):
    """InternLM2-style rope_scaling {"type": "dynamic", "factor": 2}: it
    scales past max_position_embeddings (Hugging Face reads no other
    length); the --rope-scale flag says the same."""
    path, w, x = llama_checkpoint(tmp_path)
    cfg = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "model_type": "llama",
           "rope_theta": 10000.0, "max_position_embeddings": 300,
           "rope_scaling": {"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 5}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    pos = (np.arange(T) * 97 + 5).astype(np.int64)
    np.save(tmp_path / "p.npy", pos)
    inv, ms = hf_inv_freq("dynamic", 8, 10000.0, int(pos.max()) + 1, 300, 2.0)
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos[None], rope=(8, 10000.0, False, inv, ms))[0]
    got = run(tmp_path, "--weights", path, "--positions", tmp_path / "p.npy")
    np.testing.assert_allclose(got, want, atol=3e-5)
    (tmp_path / "config.json").unlink()
    flag = run(tmp_path, "--weights", path, "--heads", 4, "--rope", "halves", "--positions", tmp_path / "p.npy",
               "--rope-scale", "dynamic:factor=2,original_max_position_embeddings=300")
    np.testing.assert_array_equal(flag, got)
    flag = run(tmp_path, "--weights", path, "--heads", 4, "--rope", "halves", "--positions", tmp_path / "p.npy",
               "--rope-scale", "longrope:original_max_position_embeddings=400,factor=20.48,"
               "short_factor=1:1.25:1.5:2,long_factor=1:3:9:27")
    inv, ms = hf_inv_freq("longrope", 8, 10000.0, int(pos.max()) + 1, 400, 20.48, SHORT, LONG)
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos[None], rope=(8, 10000.0, False, inv, ms))[0]
    np.testing.assert_allclose(flag, want, atol=3e-5)


@pytest.mark.parametrize("scaling, message", [
    ({"type": "longrope", "short_factor": SHORT}, "rope_scaling.long_factor is missing"),
    ({"type": "longrope", "short_factor": SHORT, "long_factor": "1,2"}, "long_factor is not a list"),
    ({"type": "longrope", "short_factor": [1, 0, 1, 1], "long_factor": LONG}, "short_factor[1] is out of range"),
    ({"type": "longrope", "short_factor": SHORT + [1.0], "long_factor": LONG + [1.0]},
     "rope.short_factor[4]=1; expected 0 beyond the dim/2=4 rotated pairs"),
    ({"type": "dynamic"}, "rope_scaling.factor missing"),
    ({"type": "ntk", "factor": 2.0}, "rope_type is \"ntk\""),
])
def test_config_refusals(tmp_path, scaling, message):
    path, w, x = llama_checkpoint(tmp_path)
    cfg = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "model_type": "llama",
           "rope_theta": 10000.0, "max_position_embeddings": 300, "rope_scaling": scaling}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = mha_cli("run", "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--weights", path, check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("spec, message", [
    ("longrope:original_max_position_embeddings=4,short_factor=1:2:3:4", "long_factor missing"),
    ("longrope:original_max_position_embeddings=4,short_factor=1::3,long_factor=1", "short_factor item 1 is empty"),
    ("longrope:original_max_position_embeddings=4,short_factor=1:x,long_factor=1", "item 1 is x"),
    ("dynamic:factor=2", "original_max_position_embeddings missing"),
    ("yarn:factor=2,original_max_position_embeddings=64,factor=4", "factor is given twice"),
    ("longrope:short_factor=1:2:3:4,long_factor=1:2:3:4,original_max_position_embeddings=4,short_factor=1:1:1:1",
     "short_factor is given twice"),
    ("linear:factor=2,", "--rope-scale: ''; expected KEY=NUMBER"),
])
def test_flag_refusals(tmp_path, spec, message):
    path, w, x = llama_checkpoint(tmp_path)
    r = mha_cli("run", "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--weights", path,
            "--heads", 4, "--rope", "halves", "--rope-scale", spec, check=False)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_python_refusals():
    rope = dict(pairing="halves", scaling="longrope", original_max_positions=4, short_factor=[1, 2, 3, 4],
                long_factor=[1, 2, 3])
    with pytest.raises(mha.ArgumentError, match=r"long_factor\[3\]=0"):
        mha.Layer(D, H, HKV, rope=rope)
    with pytest.raises(mha.ArgumentError, match="expected a list of numbers"):
        mha.Layer(D, H, HKV, rope={**rope, "long_factor": "1234"})
    with pytest.raises(mha.ArgumentError, match="expected a list of numbers"):
        mha.Layer(D, H, HKV, rope={**rope, "long_factor": [1, True, 2, 3]})
    with pytest.raises(mha.ArgumentError, match="expected at most 128"):
        mha.Layer(D, H, HKV, rope={**rope, "long_factor": [1.0] * 129})
    ok = mha.Layer(D, H, HKV, rope={**rope, "long_factor": [1, 2, 3, 4]})
    assert ok.config["rope"]["long_factor"] == [1, 2, 3, 4]
    assert mha.Layer(D, H, HKV, rope=dict(pairing="halves")).config["rope"]["short_factor"] == []
