"""Probes of the PyTorch side (mha.nn, torch_forward, the array helpers)
that found defects: each test failed before its fix.

- bfloat16 tensors (a bf16 state dict, bf16 inputs) and tensors off the
  CPU failed inside torch's .numpy(); a 0-d array was reported as (1,).
"""
import math

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
import mha.nn  # noqa: E402

E, H, B, T, S = 16, 4, 2, 5, 7


def randomize(m, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            bound = 1.0 if "bias" in name else 2.0 / math.sqrt(p.shape[-1])
            p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
    return m


def pair(**kw):
    t = randomize(torch.nn.MultiheadAttention(E, H, batch_first=True, **kw))
    m = mha.nn.MultiheadAttention(E, H, batch_first=True, **kw)
    m.load_state_dict(t.state_dict())
    return t, m


def data(shape=(B, T, E), seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------ torch tensors as arrays

def test_torch_forward_refuses_a_mask_that_requires_grad_with_the_bindings_error():
    t, _ = pair()
    layer = mha.from_torch_state_dict(t.state_dict(), num_heads=H, batch_first=True)
    x = data().numpy()
    with pytest.raises(mha.ArgumentError, match="attn_mask is a tensor that requires grad"):
        layer.torch_forward(x, x, x, attn_mask=torch.zeros(T, T, requires_grad=True))


# ------------------------------------------------------ dtypes, devices

def test_bf16_state_dict_converts_like_its_float32_widening():
    t, _ = pair()
    sd16 = {k: v.detach().bfloat16() for k, v in t.state_dict().items()}
    a = mha.from_torch_state_dict(sd16, num_heads=H)
    b = mha.from_torch_state_dict({k: v.float() for k, v in sd16.items()}, num_heads=H)
    for name, w in a.weights().items():
        assert np.array_equal(w, b.weights()[name]), name


def test_bf16_inputs_are_widened_to_float32():
    t, _ = pair()
    layer = mha.from_torch_state_dict(t.state_dict(), num_heads=H, batch_first=True)
    x16 = data().bfloat16()
    want = layer.forward(x16.float())
    assert np.array_equal(layer.forward(x16), want)
    assert np.array_equal(layer.torch_forward(x16, x16, x16, need_weights=False)[0],
                          layer.torch_forward(x16.float(), x16.float(), x16.float(), need_weights=False)[0])


def test_tensor_off_the_cpu_is_an_argument_error_naming_it():
    t, _ = pair()
    layer = mha.from_torch_state_dict(t.state_dict(), num_heads=H, batch_first=True)
    with pytest.raises(mha.ArgumentError, match="x is a tensor on device 'meta'"):
        layer.forward(torch.empty(B, T, E, device="meta"))
    sd = {k: v.to("meta") for k, v in t.state_dict().items()}
    with pytest.raises(mha.ArgumentError, match="in_proj_weight is a tensor on device 'meta'"):
        mha.from_torch_state_dict(sd, num_heads=H)


@pytest.mark.parametrize("scalar", [np.float32(1.0), np.array(1.0)], ids=["numpy-scalar", "0-d"])
def test_scalar_input_reports_its_own_shape(scalar):
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ShapeError, match=r"x has shape \(\); expected \(B,T,d_model=16\)"):
        layer.forward(scalar)
