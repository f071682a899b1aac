"""torch-layout checkpoints taken from real torch.nn.MultiheadAttention
modules (their own state_dict names and layouts), written to safetensors
with an independent writer, run through the `mha` CLI, must give PyTorch's
output — with masks, cross-attention, add_bias_kv/add_zero_attn, unbatched
input and attention probabilities. Also: `mha convert --from torch` then
running the native file gives the same Y."""
import os
import subprocess

import pytest

from conftest import require

np = require("numpy")
torch = require("torch")
from io_helpers import MHA, mha, write_safetensors  # noqa: E402
TOL = 2e-5


@pytest.fixture(autouse=True)
def _binary():
    if not os.access(MHA, os.X_OK):
        pytest.fail("build/mha is missing: run 'make' before the python tests")


def module(E, h, seed, **kw):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, h, batch_first=True, **kw)
    with torch.no_grad():  # non-zero biases, so a bias mix-up shows
        for name, p in m.named_parameters():
            if "bias" in name:
                p.uniform_(-0.5, 0.5)
    return m.eval()


def save_module(m, path, metadata=None):
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    write_safetensors(path, sd, metadata)
    return sd


def torch_out(m, x, kv=None, **kw):
    with torch.no_grad():
        q = torch.from_numpy(x)
        k = torch.from_numpy(kv) if kv is not None else q
        y, p = m(q, k, k, need_weights=True, average_attn_weights=False, **kw)
    return y.numpy(), p.numpy()


def test_packed_in_proj_batched(tmp_path):
    E, h, B, T = 16, 4, 2, 7
    m = module(E, h, 1)
    sd = save_module(m, tmp_path / "m.safetensors")
    assert "in_proj_weight" in sd and "out_proj.weight" in sd
    x = np.random.RandomState(1).randn(B, T, E).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mha("run", "--weights", tmp_path / "m.safetensors", "--heads", h, "--input", tmp_path / "x.npy",
        "--output", tmp_path / "y.npy", "--save-probs", tmp_path / "p.npy")
    y_ref, p_ref = torch_out(m, x)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), y_ref, atol=TOL)
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), p_ref, atol=TOL)


@pytest.mark.parametrize("kind", ["bool", "float", "causal_flag"])
def test_masks_follow_pytorch_meaning(tmp_path, kind):
    E, h, B, T = 12, 3, 2, 6
    m = module(E, h, 2)
    save_module(m, tmp_path / "m.safetensors", {"n_heads": h})
    rs = np.random.RandomState(2)
    x = rs.randn(B, T, E).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    causal = np.triu(np.ones((T, T), bool), 1)
    kpm = np.zeros((B, T), bool)
    kpm[0, -1] = kpm[1, -3:] = True  # True = padding, ignored
    np.save(tmp_path / "kpm.npy", kpm)
    args = ["run", "--weights", tmp_path / "m.safetensors", "--input", tmp_path / "x.npy",
            "--output", tmp_path / "y.npy", "--key-padding-mask", tmp_path / "kpm.npy"]
    if kind == "bool":
        mask = rs.rand(B * h, T, T) < 0.3  # per batch and head, True = not allowed
        mask[..., 0] = False  # keep every row attendable (PyTorch gives NaN otherwise)
        kpm_t = torch.from_numpy(kpm)
        np.save(tmp_path / "m.npy", mask)
        args += ["--attn-mask", tmp_path / "m.npy"]
        y_ref, _ = torch_out(m, x, attn_mask=torch.from_numpy(mask), key_padding_mask=kpm_t)
    elif kind == "float":
        mask = (rs.randn(T, T) * 2).astype(np.float32)
        np.save(tmp_path / "m.npy", mask)
        args += ["--attn-mask", tmp_path / "m.npy"]
        y_ref, _ = torch_out(m, x, attn_mask=torch.from_numpy(mask),
                             key_padding_mask=torch.from_numpy(kpm))
    else:
        args += ["--causal"]
        y_ref, _ = torch_out(m, x, attn_mask=torch.from_numpy(causal),
                             key_padding_mask=torch.from_numpy(kpm))
    mha(*args)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), y_ref, atol=TOL)


def test_separate_projections_cross_attention(tmp_path):
    E, h, B, T, S, kd = 8, 2, 2, 3, 5, 6
    m = module(E, h, 3, kdim=kd, vdim=kd)
    sd = save_module(m, tmp_path / "m.safetensors")
    assert "q_proj_weight" in sd and "in_proj_weight" not in sd
    rs = np.random.RandomState(3)
    x = rs.randn(B, T, E).astype(np.float32)
    kv = rs.randn(B, S, kd).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "kv.npy", kv)
    mha("run", "--weights", tmp_path / "m.safetensors", "--layout", "torch", "--heads", h,
        "--input", tmp_path / "x.npy", "--kv-input", tmp_path / "kv.npy", "--output", tmp_path / "y.npy")
    y_ref, _ = torch_out(m, x, kv)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), y_ref, atol=TOL)


def test_bias_kv_zero_attn_unbatched(tmp_path):
    E, h, T = 8, 2, 5
    m = module(E, h, 4, add_bias_kv=True, add_zero_attn=True)
    sd = save_module(m, tmp_path / "m.safetensors", {"add_zero_attn": 1})  # a module flag, not a tensor
    assert "bias_k" in sd
    x = np.random.RandomState(4).randn(T, E).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mha("run", "--weights", tmp_path / "m.safetensors", "--heads", h, "--input", tmp_path / "x.npy",
        "--output", tmp_path / "y.npy", "--save-probs", tmp_path / "p.npy")
    with torch.no_grad():
        xt = torch.from_numpy(x)
        y_ref, p_ref = m(xt, xt, xt, need_weights=True, average_attn_weights=False)
    y = np.load(tmp_path / "y.npy")
    assert y.shape == (T, E)
    np.testing.assert_allclose(y, y_ref.numpy(), atol=TOL)
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), p_ref.numpy(), atol=TOL)


def test_convert_from_torch_then_run(tmp_path):
    E, h, B, T = 16, 8, 1, 4
    m = module(E, h, 5)
    save_module(m, tmp_path / "m.safetensors")
    x = np.random.RandomState(5).randn(B, T, E).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mha("convert", "--from", "torch", "--heads", h, "--to", "native", tmp_path / "m.safetensors",
        tmp_path / "n.safetensors")
    mha("run", "--weights", tmp_path / "n.safetensors", "--input", tmp_path / "x.npy", "--output",
        tmp_path / "y.npy")
    y_ref, _ = torch_out(m, x)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), y_ref, atol=TOL)


def test_torch_float16_checkpoint(tmp_path):
    """A half-precision state dict (F16 tensors) is widened on load."""
    E, h, B, T = 8, 2, 1, 3
    m = module(E, h, 6)
    sd = {k: v.detach().half().numpy() for k, v in m.state_dict().items()}
    write_safetensors(tmp_path / "m.safetensors", sd)
    with torch.no_grad():  # the module PyTorch would get from the same file
        m.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in sd.items()})
    x = np.random.RandomState(6).randn(B, T, E).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mha("run", "--weights", tmp_path / "m.safetensors", "--heads", h, "--input", tmp_path / "x.npy",
        "--output", tmp_path / "y.npy")
    y_ref, _ = torch_out(m, x)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), y_ref, atol=TOL)


def test_wrong_head_count_is_an_error(tmp_path):
    m = module(12, 3, 7)
    save_module(m, tmp_path / "m.safetensors")
    np.save(tmp_path / "x.npy", np.zeros((2, 12), np.float32))
    p = mha("run", "--weights", tmp_path / "m.safetensors", "--heads", 5, "--input", tmp_path / "x.npy",
            "--output", tmp_path / "y.npy", check=False)
    assert p.returncode == 1 and p.stderr.startswith("mha run: ")
    assert isinstance(p, subprocess.CompletedProcess)
