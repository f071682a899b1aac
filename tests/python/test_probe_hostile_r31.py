"""Hostile-input probe, round 31: the newest readers attacked as an
independent checker would (q/k norms under LFM2's and Ling's names, the
gated and int8 native files, config.json's per-layer lists, the flags).
Each test states the input, what happened before its fix, and checks the
refusal names the problem; inputs that were found handled keep one
regression test each. The expectations come from docs/FILES.md and from
the modeling code the docs cite (Hugging Face's config classes), not from
the library."""
import json
import os
import subprocess

import numpy as np
import pytest

import mha
from io_helpers import MHA, ROOT, write_safetensors, write_safetensors_raw

ASAN_MHA = os.path.join(ROOT, "build-asan", "mha")
D, H, G, DK = 32, 4, 2, 8
P = "model.layers.0.self_attn."


def hf_layer(seed=0, prefix=P):
    rng = np.random.default_rng(seed)
    return {prefix + "q_proj.weight": (rng.standard_normal((H * DK, D)) * 0.2).astype(np.float32),
            prefix + "k_proj.weight": (rng.standard_normal((G * DK, D)) * 0.2).astype(np.float32),
            prefix + "v_proj.weight": (rng.standard_normal((G * DK, D)) * 0.2).astype(np.float32),
            prefix + "o_proj.weight": (rng.standard_normal((D, H * DK)) * 0.2).astype(np.float32)}


def run_cli(*args, binary=MHA):
    return subprocess.run([binary] + [str(a) for a in args], capture_output=True, text=True, timeout=120)


def binaries():
    return [b for b in (MHA, ASAN_MHA) if os.path.exists(b)]


def refused_by_cli(tmp_path, weights, words, *flags):
    """mha run (and its ASan build, when built) refuses weights: exit 1, no
    output, no sanitizer report, one line naming every word."""
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(5).standard_normal((1, 6, D)).astype(np.float32))
    for binary in binaries():
        y = tmp_path / "y.npy"
        r = run_cli("run", "--weights", weights, "--input", x, "--output", y, *flags, binary=binary)
        assert r.returncode == 1 and not y.exists(), (binary, r.returncode, r.stderr)
        assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        for w in words:
            assert w in r.stderr, (w, r.stderr)


# ------------------------------------------------------ q/k norms (hf)

@pytest.mark.parametrize("q_name,k_name", [("q_norm.weight", "k_norm.weight"),
                                           ("q_layernorm.weight", "k_layernorm.weight"),  # LFM2
                                           ("query_layernorm.weight", "key_layernorm.weight")])  # Ling
def test_shared_q_norm_beside_per_head_k_norm(tmp_path, q_name, k_name):
    """q's norm (d_k), one shared by every head, beside k's (h_kv*d_k), one
    per kv head. Before: k's size switched the layer to per-head norms after
    q's d_k floats were copied, and the layer read h*d_k floats from them (a
    heap over-read under ASan, garbage norms otherwise; exit 0). Now refused
    naming q's tensor and the per-head shape it must then have."""
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {**hf_layer(), P + q_name: np.ones(DK, np.float32),
                             P + k_name: np.ones(G * DK, np.float32)})
    with pytest.raises(mha.ShapeError, match=r"%s has 8 elements .*expected \(heads, d_k\)" % q_name):
        mha.Layer.load(path, n_heads=H, n_kv_heads=G, config_json="ignore")
    refused_by_cli(tmp_path, path, [q_name, "(heads, d_k)"], "--heads", H, "--kv-heads", G)
    # both per head, or both shared, load
    for q, k in ((np.ones(H * DK), np.ones(G * DK)), (np.ones(DK), np.ones(DK))):
        write_safetensors(path, {**hf_layer(), P + q_name: q.astype(np.float32), P + k_name: k.astype(np.float32)})
        mha.Layer.load(path, n_heads=H, n_kv_heads=G, config_json="ignore")


@pytest.mark.parametrize("norm", ["query_layernorm", "key_layernorm"])
def test_ling_named_norm_with_bias_refused(tmp_path, norm):
    """Ling's names with a bias beside the weight (a LayerNorm with bias,
    which no reader implements). Before: the bias was not read and the layer
    ran the RMSNorm without it (exit 0), where q_layernorm.bias (LFM2's
    names) was refused. Now refused naming the tensor."""
    path = tmp_path / "model.safetensors"
    w = {**hf_layer(), P + "query_layernorm.weight": np.ones(DK, np.float32),
         P + "key_layernorm.weight": np.ones(DK, np.float32), P + norm + ".bias": np.zeros(DK, np.float32)}
    write_safetensors(path, w)
    with pytest.raises(mha.FormatError, match="a q/k LayerNorm .*bias is not implemented"):
        mha.Layer.load(path, n_heads=H, n_kv_heads=G, config_json="ignore")
    refused_by_cli(tmp_path, path, ["layernorm", "with a bias" if norm == "key_layernorm" else "bias"],
                   "--heads", H, "--kv-heads", G)
