"""`mha run` with today's variants on checkpoints written here in the
layouts models use: a Llama-style layer (Hugging Face names, GQA, RoPE
halves, theta 500000, no bias) and a BLOOM-style layer (fused
query_key_value per head, biases, ALiBi), each against PyTorch written
from the published formulas; the native layout keeps every setting."""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch
from io_helpers import mha, read_safetensors_header, write_safetensors

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

from test_modern import alibi_slopes, apply_rope, torch_attention  # noqa: E402

D, T = 32, 11


def llama_checkpoint(tmp_path, metadata=None):
    rng = np.random.default_rng(31)
    h, h_kv, d = 4, 2, 8
    hf = {"model.layers.0.self_attn.q_proj.weight": rng.uniform(-.4, .4, (h * d, D)),
          "model.layers.0.self_attn.k_proj.weight": rng.uniform(-.4, .4, (h_kv * d, D)),
          "model.layers.0.self_attn.v_proj.weight": rng.uniform(-.4, .4, (h_kv * d, D)),
          "model.layers.0.self_attn.o_proj.weight": rng.uniform(-.4, .4, (D, h * d))}
    hf = {k: v.astype(np.float32) for k, v in hf.items()}
    path = tmp_path / "llama.safetensors"
    write_safetensors(path, hf, metadata)
    w = {n: hf["model.layers.0.self_attn.%s_proj.weight" % n[2]].T for n in ("w_q", "w_k", "w_v", "w_o")}
    x = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return path, w, x


def normed_checkpoint(tmp_path, rng, name, prefix, norm_sizes, metadata, extra=None):
    """q/k/v/o_proj plus q_norm.weight and k_norm.weight of norm_sizes
    (4 heads, 2 kv heads, d_k 8) under prefix; returns the file, the
    weights as mha takes them (norms included) and x (T, D) saved as x.npy."""
    h, h_kv, d = 4, 2, 8
    ws = {"q_proj.weight": rng.uniform(-.4, .4, (h * d, D)), "k_proj.weight": rng.uniform(-.4, .4, (h_kv * d, D)),
          "v_proj.weight": rng.uniform(-.4, .4, (h_kv * d, D)), "o_proj.weight": rng.uniform(-.4, .4, (D, h * d)),
          "q_norm.weight": rng.uniform(.5, 1.5, norm_sizes[0]), "k_norm.weight": rng.uniform(.5, 1.5, norm_sizes[1])}
    ws.update(extra or {})
    ws = {prefix + k: v.astype(np.float32) for k, v in ws.items()}
    path = tmp_path / name
    write_safetensors(path, ws, metadata)
    w = {n: ws[prefix + "%s_proj.weight" % n[2]].T for n in ("w_q", "w_k", "w_v", "w_o")}
    w.update(q_norm=ws[prefix + "q_norm.weight"], k_norm=ws[prefix + "k_norm.weight"])
    x = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return path, w, x, ws


def run(tmp_path, *flags):
    out = tmp_path / "y.npy"
    mha("run", "--input", tmp_path / "x.npy", "--output", out, "--causal", *flags)
    return np.load(out)


def test_llama_style_rope_flags(tmp_path):
    path, w, x = llama_checkpoint(tmp_path)
    want = torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, False))[0]
    got = run(tmp_path, "--weights", path, "--heads", 4, "--rope", "halves", "--rope-theta", 500000)
    np.testing.assert_allclose(got, want, atol=2e-5)
    # the other pairing is another function: the flag matters
    other = run(tmp_path, "--weights", path, "--heads", 4, "--rope", "interleaved", "--rope-theta", 500000)
    assert np.abs(other - want).max() > 1e-3
    pos = (np.arange(T) * 3 + 7).astype(np.float32)
    np.save(tmp_path / "p.npy", pos)
    want = torch_attention(w, x[None], 4, 2, 8, pos=pos[None].astype(np.int64), rope=(8, 500000.0, False))[0]
    got = run(tmp_path, "--weights", path, "--heads", 4, "--rope", "halves", "--rope-theta", 500000,
              "--positions", tmp_path / "p.npy")
    np.testing.assert_allclose(got, want, atol=2e-5)
    for dt in (np.int32, np.int64):  # integer positions as numpy saves them
        np.save(tmp_path / "pi.npy", pos.astype(dt))
        got = run(tmp_path, "--weights", path, "--heads", 4, "--rope", "halves", "--rope-theta", 500000,
                  "--positions", tmp_path / "pi.npy")
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=str(dt))


@pytest.mark.parametrize("dim", ["7", "10"])
def test_rope_dim_flag_checked_against_d_k(tmp_path, dim):
    """An odd --rope-dim, or one above the file's d_k (8), is a usage error
    that names the flag, and no output appears."""
    path, _, _ = llama_checkpoint(tmp_path)
    p = mha("run", "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--weights", path, "--heads", "4",
            "--kv-heads", "2", "--rope", "halves", "--rope-dim", dim, check=False)
    assert p.returncode == 2 and "--rope-dim is %s; expected an even number in 2..8" % dim in p.stderr, p.stderr
    assert not (tmp_path / "y.npy").exists()


def test_positions_shared_by_the_batch(tmp_path):
    """(T,) and (1, T) positions apply to every sequence of a (B, T, d) input:
    the same Y as the (B, T) array that repeats them; other spacings in
    the second row change only its Y (RoPE sees differences, so a shift
    alone would not)."""
    path, _, x = llama_checkpoint(tmp_path)
    np.save(tmp_path / "xb.npy", np.stack([x, x[::-1]]).astype(np.float32))
    pos = (np.arange(T) * 2 + 5).astype(np.int64)
    outs = {}
    for name, p in (("row", pos), ("one", pos[None]), ("both", np.stack([pos, pos])), ("other", np.stack([pos, pos * 3]))):
        np.save(tmp_path / ("p_%s.npy" % name), p)
        out = tmp_path / ("y_%s.npy" % name)
        mha("run", "--weights", path, "--heads", 4, "--rope", "halves", "--input", tmp_path / "xb.npy",
            "--output", out, "--positions", tmp_path / ("p_%s.npy" % name))
        outs[name] = np.load(out)
    np.testing.assert_array_equal(outs["row"], outs["both"])
    np.testing.assert_array_equal(outs["one"], outs["both"])
    np.testing.assert_array_equal(outs["other"][0], outs["both"][0])
    assert np.abs(outs["other"][1] - outs["both"][1]).max() > 1e-4


@pytest.mark.parametrize("bad,message", [(np.array([0, -3]), "position -3 at index 1"),
                                         (np.array([0, 2**31 + 5]), "position 2147483653 at index 1"),
                                         (np.array([0.0, 1.5], np.float32), "position 1.5 at index 1"),
                                         (np.array([0, 1], np.int16), "'<i2' is not supported")])
def test_positions_refused_with_a_clear_error(tmp_path, bad, message):
    path, _, _ = llama_checkpoint(tmp_path)
    pos = np.arange(T, dtype=bad.dtype)
    pos[-2:] = bad
    np.save(tmp_path / "p.npy", pos)
    out = tmp_path / "y.npy"
    r = mha("run", "--weights", path, "--heads", 4, "--rope", "halves", "--input", tmp_path / "x.npy",
            "--output", out, "--positions", tmp_path / "p.npy", check=False)
    assert r.returncode != 0 and message.replace("index 1", "index %d" % (T - 1)) in r.stderr, r.stderr
    assert not out.exists()


def test_llama_style_rope_from_metadata_and_native_round_trip(tmp_path):
    path, w, x = llama_checkpoint(tmp_path, {"n_heads": 4, "rope": "halves", "rope_theta": 500000})
    want = torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, False))[0]
    np.testing.assert_allclose(run(tmp_path, "--weights", path), want, atol=2e-5)
    native = tmp_path / "native.safetensors"
    mha("convert", "--to", "native", path, native)
    meta = read_safetensors_header(native)["__metadata__"]
    assert meta["rope"] == "halves" and float(meta["rope_theta"]) == 500000
    np.testing.assert_allclose(run(tmp_path, "--weights", native), want, atol=2e-5)


def test_bloom_style_fused_qkv_alibi(tmp_path):
    rng = np.random.default_rng(32)
    h, d = 4, 8
    qkv = rng.uniform(-.4, .4, (3 * h * d, D)).astype(np.float32)  # rows: head, (q, k, v), d
    bqkv = rng.uniform(-.2, .2, 3 * h * d).astype(np.float32)
    dense = rng.uniform(-.4, .4, (D, h * d)).astype(np.float32)
    bdense = rng.uniform(-.2, .2, D).astype(np.float32)
    path = tmp_path / "bloom.safetensors"
    write_safetensors(path, {"h.0.self_attention.query_key_value.weight": qkv,
                             "h.0.self_attention.query_key_value.bias": bqkv,
                             "h.0.self_attention.dense.weight": dense, "h.0.self_attention.dense.bias": bdense})
    x = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    # BLOOM: fused_qkv.view(T, h, 3, d); scores/sqrt(d) + slope * key position; causal
    xt = torch.tensor(x, dtype=torch.float64)
    fused = (xt @ torch.tensor(qkv, dtype=torch.float64).T + torch.tensor(bqkv, dtype=torch.float64)).view(T, h, 3, d)
    q, k, v = (fused[:, :, i].transpose(0, 1) for i in range(3))
    alibi = torch.tensor(alibi_slopes(h), dtype=torch.float64)[:, None, None] * torch.arange(T)[None, None, :]
    s = q @ k.transpose(-1, -2) / math.sqrt(d) + alibi
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    z = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(T, h * d)
    want = (z @ torch.tensor(dense, dtype=torch.float64).T + torch.tensor(bdense, dtype=torch.float64)).numpy()
    got = run(tmp_path, "--weights", path, "--heads", h, "--alibi")
    np.testing.assert_allclose(got, want, atol=2e-5)
    plain = run(tmp_path, "--weights", path, "--heads", h)
    assert np.abs(plain - want).max() > 1e-3  # without --alibi it differs



def test_scale_flag(tmp_path):
    """--scale S replaces 1/sqrt(d_k) (with and without other variants)."""
    path, w, x = llama_checkpoint(tmp_path)
    want = torch_attention(w, x[None], 4, 2, 8, scale=0.25)[0]
    np.testing.assert_allclose(run(tmp_path, "--weights", path, "--heads", 4, "--scale", 0.25), want, atol=2e-5)
    want = torch_attention(w, x[None], 4, 2, 8, rope=(8, 10000.0, False), softcap=3.0, scale=0.5)[0]
    got = run(tmp_path, "--weights", path, "--heads", 4, "--rope", "halves", "--softcap", 3, "--scale", 0.5)
    np.testing.assert_allclose(got, want, atol=2e-5)

def test_qwen3_norm_names_sinks_softcap_and_native_round_trip(tmp_path):
    """q_norm.weight / k_norm.weight (Qwen 3 names: RMS QK-norm shared by
    the heads), rotary settings in the metadata, --softcap and --sinks from
    flags; converting to native keeps the norm and rotary settings."""
    rng = np.random.default_rng(33)
    path, w, x, ws = normed_checkpoint(tmp_path, rng, "qwen.safetensors", "attn.", (8, 8),
                                       {"rope": "halves", "rope_theta": 1e6}, {"sinks": rng.uniform(-1, 2, 4)})
    sinks = ws["attn.sinks"]
    want = torch_attention(w, x[None], 4, 2, 8, rope=(8, 1e6, False), qk_norm=1e-6, softcap=2.5, sinks=sinks)[0]
    got = run(tmp_path, "--weights", path, "--heads", 4, "--softcap", 2.5, "--sinks", "sinks")
    np.testing.assert_allclose(got, want, atol=2e-5)
    native = tmp_path / "native.safetensors"
    mha("convert", "--to", "native", "--heads", 4, path, native)
    meta = read_safetensors_header(native)["__metadata__"]
    assert meta["qk_norm"] == "rms" and meta["rope"] == "halves"
    # the native copy holds the norm weights and rotary settings (not the
    # flags' softcap and sinks): with --softcap alone it matches torch without sinks
    want_plain = torch_attention(w, x[None], 4, 2, 8, rope=(8, 1e6, False), qk_norm=1e-6, softcap=2.5)[0]
    np.testing.assert_allclose(run(tmp_path, "--weights", native, "--softcap", 2.5), want_plain, atol=2e-5)



def test_prefix_names_a_decoder_layer(tmp_path):
    """Two Qwen 3-style layers in one file: --prefix model.layers.1 (the
    decoder layer, no final dot) picks layer 1's attention, its norms and
    its --sinks tensor, not layer 0's."""
    rng = np.random.default_rng(35)
    layers = [normed_checkpoint(tmp_path, rng, f"l{i}.safetensors", f"model.layers.{i}.self_attn.", (8, 8), None,
                                {"sinks": rng.uniform(-1, 2, 4)}) for i in range(2)]
    _, w, x, ws = layers[1]
    model = {**layers[0][3], **ws, "model.layers.1.mlp.down_proj.weight": rng.uniform(-.4, .4, (D, 64)).astype(np.float32)}
    path = tmp_path / "model.safetensors"
    write_safetensors(path, model, {"rope": "halves", "rope_theta": 1e6})
    want = torch_attention(w, x[None], 4, 2, 8, rope=(8, 1e6, False), qk_norm=1e-6,
                           sinks=ws["model.layers.1.self_attn.sinks"])[0]
    got = run(tmp_path, "--weights", path, "--heads", 4, "--prefix", "model.layers.1", "--sinks", "sinks")
    np.testing.assert_allclose(got, want, atol=2e-5)

def test_native_metadata_keeps_every_variant(tmp_path):
    """A layer with every variant saved by the binding (native layout)
    loads with `mha run` and gives the binding's forward; labels_s kept."""
    import mha as lib
    rng = np.random.default_rng(34)
    h, d = 4, 8
    w = {"w_q": rng.uniform(-.4, .4, (D, h * d)), "w_k": rng.uniform(-.4, .4, (D, 2 * d)),
         "w_v": rng.uniform(-.4, .4, (D, 2 * d)), "w_o": rng.uniform(-.4, .4, (h * d, D)),
         "sinks": rng.uniform(-1, 2, h), "q_norm": rng.uniform(.5, 1.5, h * d), "k_norm": rng.uniform(.5, 1.5, 2 * d)}
    w = {k: np.asarray(v, dtype=np.float32) for k, v in w.items()}
    layer = lib.Layer(D, h, n_kv_heads=2, d_k=d, bias=False, weights=w, alibi=True, sinks=True, softcap=3.0,
                      qk_norm="layer", qk_norm_per_head=True, qk_norm_eps=1e-5,
                      rope={"pairing": "interleaved", "dim": 6, "theta": 5000, "scaling": "linear", "factor": 2})
    layer.permute_heads([1, 0, 3, 2])
    path = tmp_path / "all.safetensors"
    layer.save(path)
    meta = read_safetensors_header(path)["__metadata__"]
    assert meta["labels_s"] == "1,0,3,2" and meta["rope_scaling"] == "linear"
    x = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = layer.forward(x[None], causal=True, path="reference")[0]
    np.testing.assert_allclose(run(tmp_path, "--weights", path, "--path", "reference"), want, atol=1e-6)


def base_inv_freq(dim, theta):
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def llama3_inv_freq(dim, theta, factor, low, high, omp):
    """Llama 3.1's rope_type "llama3": long wavelengths divided by factor,
    short ones kept, a smooth blend between."""
    inv = base_inv_freq(dim, theta)
    wavelen = 2 * math.pi / inv
    smooth = (omp / wavelen - low) / (high - low)
    blend = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(wavelen > omp / low, inv / factor, torch.where(wavelen < omp / high, inv, blend))


def yarn_inv_freq(dim, theta, factor, omp, beta_fast=32.0, beta_slow=1.0):
    """YaRN (Peng et al. 2023): per-dimension ramp between interpolation and
    extrapolation; cos and sin times 0.1 ln(factor) + 1."""
    def correction_dim(n):
        return dim * math.log(omp / (n * 2 * math.pi)) / (2 * math.log(theta))
    lo, hi = max(math.floor(correction_dim(beta_fast)), 0), min(math.ceil(correction_dim(beta_slow)), dim - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    inv = base_inv_freq(dim, theta)
    return inv / factor * ramp + inv * (1 - ramp), 0.1 * math.log(factor) + 1


def test_rope_scale_llama3_and_yarn_flags(tmp_path):
    """--rope-scale with the rope_scaling keys of config.json reproduces
    torch's llama3 and YaRN frequencies (positions far past the original
    context so that every band is used); a missing key is refused."""
    path, w, x = llama_checkpoint(tmp_path)
    pos = (np.arange(T) * 97 + 5).astype(np.int64)
    np.save(tmp_path / "p.npy", pos)
    flags = ("--weights", path, "--heads", 4, "--rope", "halves", "--rope-theta", 10000, "--positions",
             tmp_path / "p.npy")
    cases = [("llama3:factor=8,low_freq_factor=1,high_freq_factor=4,original_max_position_embeddings=1000",
              llama3_inv_freq(8, 10000.0, 8, 1, 4, 1000), 1.0),
             ("yarn:factor=4,original_max_position_embeddings=64", *yarn_inv_freq(8, 10000.0, 4, 64)),
             ("yarn:factor=4,beta_fast=16,beta_slow=2,original_max_position_embeddings=64,attention_factor=1.3",
              yarn_inv_freq(8, 10000.0, 4, 64, 16, 2)[0], 1.3),
             ("linear:factor=2", base_inv_freq(8, 10000.0) / 2, 1.0), ("2", base_inv_freq(8, 10000.0) / 2, 1.0)]
    plain = torch_attention(w, x[None], 4, 2, 8, pos=pos[None], rope=(8, 10000.0, False))[0]
    for spec, inv, mscale in cases:
        want = torch_attention(w, x[None], 4, 2, 8, pos=pos[None], rope=(8, 10000.0, False, inv, mscale))[0]
        np.testing.assert_allclose(run(tmp_path, *flags, "--rope-scale", spec), want, atol=3e-5, err_msg=spec)
        assert np.abs(want - plain).max() > 1e-3, spec  # the scaling matters
    for spec, message in [("llama3:factor=8", "original_max_position_embeddings missing"),
                          ("yarn:factor=4,beta=3,original_max_position_embeddings=64", "'beta=3'"),
                          ("ntk:factor=2", "expected F, linear:factor=F"), ("0.5", "expected a factor in 1..1e6")]:
        r = mha("run", *flags, "--input", tmp_path / "x.npy", "--output", tmp_path / "z.npy", "--rope-scale", spec,
                check=False)
        assert r.returncode != 0 and message in r.stderr, (spec, r.stderr)
    assert not (tmp_path / "z.npy").exists()


def test_olmo2_hf_whole_width_norm_and_native_round_trip(tmp_path):
    """OLMo 2 stores q_norm.weight (h*d_k) and k_norm.weight (h_kv*d_k):
    the hf layout reads a norm over the whole width; `mha run` equals
    torch, and the native copy keeps qk_norm_whole."""
    rng = np.random.default_rng(35)
    path, w, x, _ = normed_checkpoint(tmp_path, rng, "olmo2.safetensors", "model.layers.0.self_attn.", (32, 16),
                                      {"rope": "halves", "rope_theta": 500000})
    want = torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, False), qk_norm_whole=1e-6)[0]
    np.testing.assert_allclose(run(tmp_path, "--weights", path, "--heads", 4), want, atol=2e-5)
    native = tmp_path / "native.safetensors"
    mha("convert", "--to", "native", "--heads", 4, path, native)
    assert read_safetensors_header(native)["__metadata__"]["qk_norm_whole"] == "1"
    np.testing.assert_allclose(run(tmp_path, "--weights", native), want, atol=2e-5)


def hf_permute(w, n_heads):
    """Hugging Face's convert_llama_weights_to_hf permute of q/k_proj
    (out, in): Meta's interleaved pairs (2i, 2i+1) to halves (i, i + d/2)."""
    dim1, dim2 = w.shape
    return w.reshape(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(0, 2, 1, 3).reshape(dim1, dim2)


def audit(tmp_path, path, ref, *flags):
    np.save(tmp_path / "yref.npy", ref.astype(np.float32))
    return mha("audit", "--weights", path, "--heads", 4, "--input", tmp_path / "x.npy", "--reference",
               tmp_path / "yref.npy", "--causal", *flags, check=False)


def test_audit_finds_rotary_convention_mismatch(tmp_path):
    """A checkpoint declaring halves against a reference computed with
    interleaved pairing, and a checkpoint holding Meta's (unpermuted)
    q/k_proj against Hugging Face's computation on the permuted weights:
    audit names the rotary mismatch and prints --rope interleaved, which
    reproduces the reference. A W_O order mistake in a RoPE layer is not
    taken for one."""
    path, w, x = llama_checkpoint(tmp_path, {"n_heads": 4, "rope": "halves", "rope_theta": 500000})
    ref = torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, True))[0]
    r = audit(tmp_path, path, ref)
    assert r.returncode == 1 and "rotary convention mismatch" in r.stdout, r.stdout + r.stderr
    assert "--rope interleaved" in r.stdout
    np.testing.assert_allclose(run(tmp_path, "--weights", path, "--rope", "interleaved"), ref, atol=2e-5)
    # Meta's weights in the file, HF's computation (halves on permuted q/k) as the reference
    meta = {"model.layers.0.self_attn.%s_proj.weight" % n: w["w_" + n].T.copy() for n in "qkvo"}
    meta_path = tmp_path / "meta.safetensors"
    write_safetensors(meta_path, meta, {"n_heads": 4, "rope": "halves", "rope_theta": 500000})
    w_hf = dict(w, w_q=hf_permute(w["w_q"].T, 4).T, w_k=hf_permute(w["w_k"].T, 2).T)
    ref = torch_attention(w_hf, x[None], 4, 2, 8, rope=(8, 500000.0, False))[0]
    r = audit(tmp_path, meta_path, ref)
    assert r.returncode == 1 and "rotary convention mismatch" in r.stdout and "--rope interleaved" in r.stdout
    # the matching case and a head-order mistake are not rotary findings
    want = torch_attention(w, x[None], 4, 2, 8, rope=(8, 500000.0, False))[0]
    r = audit(tmp_path, path, want)
    assert r.returncode == 0 and "rotary" not in r.stdout
    w_perm = dict(w, w_o=w["w_o"].reshape(4, 8, D)[[1, 0, 2, 3]].reshape(32, D))
    r = audit(tmp_path, path, torch_attention(w_perm, x[None], 4, 2, 8, rope=(8, 500000.0, False))[0])
    assert r.returncode == 1 and "does not explain it either" in r.stdout and "--block o" in r.stdout, r.stdout
