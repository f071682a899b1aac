"""Probes of the Python surface with the inputs users pass (numpy arrays of
every layout, torch tensors into mha.nn, torch's argument conventions)
that found defects; each test failed before its fix.

- a library message that names another function than the call was
  prefixed again: 'mha_forward_kv: mha_forward: B=2 T=5 S=0 ...' (S = 0
  keys through mha.nn or Layer.forward with a value source);
- mha.nn.MultiheadAttention and torch_forward reported a query, key or
  value of the wrong width or batch as 'x' or 'kv' (names the caller
  never used) with the batch-first shape, not the (L,N,E) one passed;
- mha.nn: a numpy array as query read 'got float32 on -'; embed_dim 16.0,
  '16' or True, and kdim -1 or 2.5 failed inside torch.empty naming no
  argument, and kdim=0 made a module whose every forward failed naming w_k;
- Layer(weights=[]) and set_weights([]) raised AttributeError ('list'
  object has no attribute 'get'), set_weights('w_q') listed its letters
  as unknown weight names;
- head_intervene(z, ['replace', a], ...), a list as Layer.forward's
  interventions take it, was refused as 'expected (1,rows,d)';
- Cache.forward(n_new=[True, 1]) read True as 1 token (the binding's rule:
  a bool is not an integer).
"""

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
import mha.nn  # noqa: E402

E, H, B, T, S = 16, 4, 2, 5, 7


def data(shape, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------- the library's own prefix

def test_zero_keys_through_mha_forward_kv_is_named_once():
    layer = mha.Layer(E, H)
    x = np.ones((B, T, E), np.float32)
    with pytest.raises(mha.ShapeError) as err:
        layer.forward(x, np.ones((B, 0, E), np.float32), np.ones((B, 0, E), np.float32))
    assert str(err.value).startswith("mha_forward: B=2 T=5 S=0; expected all >= 1"), str(err.value)
    m = mha.nn.MultiheadAttention(E, H, batch_first=True)
    k = data((B, 0, E))
    with pytest.raises(mha.ShapeError) as err:
        m(data((B, T, E)), k, data((B, 0, E)))
    assert str(err.value).startswith("mha_forward: B=2 T=5 S=0"), str(err.value)
