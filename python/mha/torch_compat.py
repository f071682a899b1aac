"""PyTorch conventions at the boundary: state dicts and forward arguments of
torch.nn.MultiheadAttention, converted to the library's layout and masks.
torch itself is never imported.

Mask conventions (the one thing most likely to go wrong):
  PyTorch attn_mask / key_padding_mask, bool: True  = NOT allowed to attend
  mha keep_mask / key_keep,             bool: True  = may attend
  float masks are added to the scaled scores in both (-inf forbids).
torch_forward takes PyTorch's arrays unchanged and inverts bool masks here.
"""
import ctypes

import numpy as np

from . import _lib
from ._arrays import _array, floats, host
from ._check import c_flag, c_int
from .errors import ArgumentError, DTypeError, ShapeError, check

# state-dict name -> mha_torch_weights field
_TORCH_KEYS = {
    "in_proj_weight": "in_proj_weight", "in_proj_bias": "in_proj_bias",
    "q_proj_weight": "q_proj_weight", "k_proj_weight": "k_proj_weight",
    "v_proj_weight": "v_proj_weight", "out_proj.weight": "out_proj_weight",
    "out_proj.bias": "out_proj_bias", "bias_k": "bias_k", "bias_v": "bias_v",
}


def _find_prefix(keys, prefix=None):
    """The path before the one 'out_proj.weight' inside module prefix
    (None: anywhere; '': the top level; 'layers.0' and 'layers.0.' both mean module
    layers.0 and all in it): '' for a bare module, 'layers.0.self_attn.'
    for prefix 'layers.0' of a TransformerEncoder's state dict."""
    if prefix is not None and (prefix == "" or prefix + "out_proj.weight" in keys):
        return prefix  # '': the bare module's entries, all of them
    inside = prefix.rstrip(".") + "." if prefix else ""
    hits = [k[: -len("out_proj.weight")] for k in keys if k.endswith("out_proj.weight")]
    hits = [p for p in hits if (p == "" or p.endswith(".")) and p.startswith(inside)]
    if len(hits) != 1:
        where = f" inside prefix {prefix!r}" if prefix else ""
        raise ArgumentError(
            f"state dict has {len(hits)} '*out_proj.weight' entries{where} {hits}; expected one "
            "(pass prefix= to choose a layer, e.g. prefix='layers.0.self_attn.' or 'layers.0')")
    return hits[0]


def from_torch_state_dict(state_dict, num_heads, *, kdim=None, vdim=None, add_zero_attn=False,
                          batch_first=False, prefix=None, cls=None):
    """A Layer from nn.MultiheadAttention.state_dict() given as numpy arrays
    (torch tensors work too). The conversion is the C library's
    mha_layer_from_torch, the same one the checkpoint loader uses.

    num_heads, add_zero_attn and batch_first are module settings a state
    dict does not record; kdim/vdim are read from the weights and, if given,
    checked. bias and add_bias_kv follow from which tensors are present.
    prefix selects one layer of a larger state dict: the attention's own
    path or a module holding only it ('layers.3'); found when unique.
    """
    from .layer import Layer
    cls = cls or Layer
    if not hasattr(state_dict, "items"):
        raise ArgumentError(f"state_dict is a {type(state_dict).__name__}; expected a mapping of names to "
                            "arrays (module.state_dict(), np.load('x.npz'))")
    if prefix is not None and not isinstance(prefix, str):
        raise ArgumentError(f"prefix={prefix!r}; expected None or a module path such as 'layers.3'")
    sd = {k: v for k, v in state_dict.items()}
    prefix = _find_prefix(sd, prefix)
    # None stands for an absent tensor (as a module's None parameter does); host(): numpy from a numpy
    # array or a torch tensor (the parameters are copied, so requires_grad does not matter here;
    # bfloat16 widened to float32, a tensor off the CPU refused naming it), without importing torch
    own = {k[len(prefix):]: None if v is None else host(k, v) for k, v in sd.items() if k.startswith(prefix)}
    unknown = sorted(set(own) - set(_TORCH_KEYS))
    if unknown:
        raise ArgumentError(f"state dict entries {[prefix + u for u in unknown]} are not "
                            f"nn.MultiheadAttention tensors; expected {list(_TORCH_KEYS)}")
    if own.get("out_proj.weight") is None:
        raise ArgumentError(f"state dict has no '{prefix}out_proj.weight'")
    ow = own["out_proj.weight"]
    if ow.ndim != 2 or ow.shape[0] != ow.shape[1]:
        raise ShapeError(f"out_proj.weight has shape {ow.shape}; expected (E,E)")
    E = ow.shape[0]
    k_w, v_w = own.get("k_proj_weight"), own.get("v_proj_weight")
    got_kdim = k_w.shape[1] if k_w is not None and k_w.ndim == 2 else E
    got_vdim = v_w.shape[1] if v_w is not None and v_w.ndim == 2 else E
    for name, given, got in (("kdim", kdim, got_kdim), ("vdim", vdim, got_vdim)):
        if given is not None and c_int(name, given, 1) != got:
            raise ShapeError(f"{name}={given} but the weights give {name}={got}")
    shapes = {
        "in_proj_weight": (3 * E, E), "in_proj_bias": (3 * E,), "q_proj_weight": (E, E),
        "k_proj_weight": (E, got_kdim), "v_proj_weight": (E, got_vdim),
        "out_proj.weight": (E, E), "out_proj.bias": (E,), "bias_k": (1, 1, E), "bias_v": (1, 1, E),
    }
    tw, keep = _lib.TorchWeights(), []
    tw.embed_dim, tw.num_heads = c_int("embed_dim", E, 1), c_int("num_heads", num_heads, 1)
    tw.kdim, tw.vdim = c_int("kdim", got_kdim, 1), c_int("vdim", got_vdim, 1)
    tw.add_zero_attn = c_flag("add_zero_attn", add_zero_attn)
    batch_first = bool(c_flag("batch_first", batch_first))
    for key, field in _TORCH_KEYS.items():
        if own.get(key) is None:
            continue
        a = own[key]
        if key in ("bias_k", "bias_v") and a.shape == (E,):
            a = a.reshape(1, 1, E)
        a = floats(prefix + key, a, shapes[key])
        keep.append(a)
        setattr(tw, field, a.ctypes.data_as(_lib.F32P))
    handle = _lib.LayerP()
    check(_lib.lib.mha_layer_from_torch(ctypes.byref(handle), ctypes.byref(tw)), "mha_layer_from_torch")
    layer = cls._adopt(handle)
    layer.batch_first = batch_first
    return layer


def check_qkv_shapes(query, key, value, batched, batch_first, E, kdim, vdim):
    """query, key and value shapes (tuples; key, value None: not given)
    against the widths E, kdim, vdim and each other, in the caller's own
    layout and names: (L,N,E), (N,L,E) with batch_first, or (L,E)
    unbatched. The library would see them batch first and call them x and
    kv, which names neither what the caller passed nor its shape."""
    n_axis = (0 if batch_first else 1) if batched else None

    def layout(seq, width, n="N"):
        dims = [seq, width]
        if batched:
            dims.insert(n_axis, n)
        return "(" + ",".join(dims) + ")" + ("" if batched else " unbatched")

    if query[-1] != E:
        raise ShapeError(f"query has shape {tuple(query)}; expected {layout('L', f'E={E}')}")
    n = f"N={query[n_axis]}" if batched else "N"
    seq = None
    if key is not None:
        if key[-1] != kdim or (batched and key[n_axis] != query[n_axis]):
            raise ShapeError(f"key has shape {tuple(key)}; expected {layout('S', f'kdim={kdim}', n)}")
        seq = f"S={key[1 - n_axis if batched else 0]}"
    if value is not None:
        if value[-1] != vdim or (key is not None and tuple(value[:-1]) != tuple(key[:-1])) or (
                batched and value[n_axis] != query[n_axis]):
            raise ShapeError(f"value has shape {tuple(value)}; expected "
                             f"{layout(seq or 'S', f'vdim={vdim}', n)}")


def _mask_kind(name, m):
    """'bool' (PyTorch: True = not allowed) or 'float' (added)."""
    if m.dtype == np.bool_ or m.dtype == np.uint8:  # uint8: torch's deprecated byte mask
        return "bool"
    if np.issubdtype(m.dtype, np.floating):
        return "float"
    raise DTypeError(f"{name} has dtype {m.dtype}; expected bool (True = not allowed) or float (added)")


def torch_forward(layer, query, key=None, value=None, key_padding_mask=None, need_weights=True,
                  attn_mask=None, average_attn_weights=True, is_causal=False, *, batch_first=None,
                  masked_row="nan", path="auto"):
    """nn.MultiheadAttention.forward on a Layer: same arguments, shapes and
    results, (attn_output, attn_weights or None).

    query (L,N,E), or (N,L,E) with batch_first, or unbatched (L,E); key and
    value likewise with S; None means self-attention. attn_mask: (L,S) or
    (N*h,L,S) ((h,L,S) unbatched), bool True = not allowed, or float added.
    key_padding_mask: (N,S) ((S,) unbatched), bool True = padding, or float
    added. is_causal: key j is hidden from query i when j > i (the mask
    torch.triu(ones(L,S), 1) gives); attn_mask may be given as well (PyTorch
    2 treats is_causal as a hint that it is causal). attn_weights: (N,L,S')
    averaged over heads, or (N,h,L,S') per head, S' = S + add_bias_kv +
    add_zero_attn. masked_row: 'nan' (the default: PyTorch's result, NaN
    output and weights, for a query that may attend to no key) or 'zero'
    (the library's own default: Z^(r) = 0 and zero weights for that head).

    PyTorch projects K from key and V from value; so does the library
    (mha_forward_kv): a value that is not key is passed as the layer's value
    source (B,S,vdim), and value None means key, as it is for
    self-attention and the usual encoder-decoder memory.
    """
    bf = bool(c_flag("batch_first", layer.batch_first if batch_first is None else batch_first))
    need_weights = c_flag("need_weights", need_weights)
    average_attn_weights = c_flag("average_attn_weights", average_attn_weights)
    q = floats("query", query)
    batched = q.ndim == 3
    if q.ndim not in (2, 3):
        raise ShapeError(f"query has shape {q.shape}; expected (L,N,E), (N,L,E) with batch_first, or (L,E)")
    self_attn = key is None or key is query
    k = q if self_attn else floats("key", key)
    # a value that is the key source (or None) is not a second source
    own_value = value is not None and value is not (query if self_attn else key)
    v = floats("value", value) if own_value else None
    if k.ndim != q.ndim:
        raise ShapeError(f"key has shape {k.shape} but query {q.shape}; expected both batched or both unbatched")
    if v is not None and (v.ndim != k.ndim or v.shape[:-1] != k.shape[:-1]):
        keys = "key" if key is not None else "query (key None: self-attention)"
        raise ShapeError(f"value has shape {v.shape} but {keys} {k.shape}; expected the same "
                         f"{'(S,N)' if batched and not bf else '(N,S)' if batched else '(S,)'} "
                         "leading dimensions, vdim last")
    c = layer.config
    check_qkv_shapes(q.shape, None if self_attn else k.shape, None if v is None else v.shape, batched, bf,
                     c["d_model"], c["d_kv_in"], c["d_v_in"])

    def to_bte(a):  # -> (B, T, features)
        if not batched:
            return a[None]
        return a if bf else a.transpose(1, 0, 2)

    x = to_bte(q)
    kv = None if self_attn else to_bte(k)
    vs = None if v is None else to_bte(v)
    B, T = x.shape[0], x.shape[1]
    S = T if kv is None else kv.shape[1]
    h = c["n_heads"]
    opts = dict(masked_row=masked_row, path=path, causal=c_flag("is_causal", is_causal), align="top_left")

    if attn_mask is not None:
        m = _array("attn_mask", attn_mask)  # refuses a mask that requires grad, as for query
        kind = _mask_kind("attn_mask", m)
        nb = B * h if batched else h
        if m.ndim == 2:
            if m.shape != (T, S):
                raise ShapeError(f"attn_mask has shape {m.shape}; expected (L,S) = ({T},{S})")
        elif m.ndim == 3:
            if m.shape != (nb, T, S):
                raise ShapeError(f"attn_mask has shape {m.shape}; expected "
                                 f"({'N*num_heads' if batched else 'num_heads'},L,S) = ({nb},{T},{S})")
            m = m.reshape(B, h, T, S)  # PyTorch's index n*h + r = (batch n, head r)
        else:
            raise ShapeError(f"attn_mask has {m.ndim} dimensions; expected 2 (L,S) or 3")
        if kind == "bool":
            opts["keep_mask"] = m == 0
        else:
            opts["additive_mask"] = m
    if key_padding_mask is not None:
        p = _array("key_padding_mask", key_padding_mask)
        kind = _mask_kind("key_padding_mask", p)
        want = (B, S) if batched else (S,)
        if p.shape != want:
            raise ShapeError(f"key_padding_mask has shape {p.shape}; expected {want}")
        p = p.reshape(B, S)
        if kind == "bool":
            opts["key_keep"] = p == 0
        else:
            opts["key_additive"] = p

    if B == 0 or T == 0:  # the library refuses empty inputs; torch returns empty results
        c = layer._inputs(x, kv, vs)[0]  # the shapes still checked
        S_all = S + bool(c["add_bias_kv"]) + bool(c["add_zero_attn"])
        y, caps = np.zeros((B, T, c["d_model"]), np.float32), {"probs": np.zeros((B, h, T, S_all), np.float32)}
    elif need_weights:
        y, caps = layer.forward(x, kv, vs, capture=("probs",), **opts)
    else:
        y, caps = layer.forward(x, kv, vs, **opts), None
    if need_weights:
        w = caps["probs"]  # (B,h,T,S')
        if average_attn_weights:
            w = w.mean(axis=1, dtype=np.float64).astype(np.float32)
        if not batched:
            w = w[0]
    else:
        w = None
    if not batched:
        y = y[0]
    elif not bf:
        y = np.ascontiguousarray(y.transpose(1, 0, 2))
    return y, w
