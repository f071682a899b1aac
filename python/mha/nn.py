"""mha.nn: torch.nn.MultiheadAttention with libmha's forward and backward.

    import mha.nn
    attn = mha.nn.MultiheadAttention(64, 4, batch_first=True)   # torch's arguments
    attn.load_state_dict(torch_attn.state_dict())               # and torch's parameters
    y, w = attn(x, x, x, key_padding_mask=pad, attn_mask=mask)
    y.sum().backward()                                          # gradients from libmha

fp32 on the CPU. Without need_weights the forward runs mha_forward_train,
which keeps a tape (Q, K, V, Z and each row's log-sum-exp) in ctx, and
the backward mha_backward_tape: the fast fp32 backward (FlashAttention-2
tiles, threaded) without recomputing the forward. Where the tape is
refused (a fully masked query row in NaN mode, the default here; the
reference path) and with need_weights (the tape forward captures no
probabilities), the forward runs mha_forward_kv and the backward the
stateless mha_backward_kv, which falls back to the double-accumulating
reference backward itself. First-order gradients only (create_graph=True
is refused); masks get none (a mask that requires grad is refused).

mha.nn.Attention (nn_modern.py) is today's attention layer (RoPE, ALiBi,
soft-capping, sinks, QK-norm) on the same forward and backward helpers.

Legend: B batch (N in torch), T queries (L), S keys, E = embed_dim,
h heads, h_kv kv heads, d = E / h per head.
"""
import ctypes
import numbers

import numpy as np
import torch

from . import _lib
from ._arrays import floats, fptr
from ._check import c_flag, c_int
from ._owner import COwner
from .errors import ArgumentError, ShapeError, UnsupportedError, check
from .layer import Layer
from .torch_compat import check_qkv_shapes

_L = _lib.lib


class _Tape(COwner):
    """What mha_forward_train kept for mha_backward_tape; freed with ctx."""
    _free_name = "mha_tape_free"
    _kind = "tape"


def _forward_train(layer, xs, opts):
    """(y, tape, opt, keep) from mha_forward_train, or None where the
    library refuses a tape (MHA_E_UNSUPPORTED: the caller runs the
    stateless pair). opt and the arrays in keep are the ones the backward
    must pass again: the tape checks that masks are the same arrays."""
    c, x, k_src, v_src, B, T, S = layer._inputs(*xs)
    keep = [x, k_src, v_src]
    opt = layer._options(c, B, T, S, keep, **opts)
    y = np.empty((B, T, c["d_model"]), dtype=np.float32)
    handle = _lib.TapeP()
    with layer._borrow() as ptr:
        st = _L.mha_forward_train(ptr, fptr(y), ctypes.byref(handle), fptr(x), fptr(k_src), fptr(v_src),
                                  B, T, S, ctypes.byref(opt))
    try:
        check(st, "mha_forward_train")
    except UnsupportedError:
        return None
    tape = _Tape()
    tape._ptr = handle.value
    return y, tape, opt, keep


def _np(t, copy=False):
    """A float32 C-contiguous numpy array of a tensor (None stays None);
    it may share the tensor's memory unless copy. The forward's inputs are
    copies: they are kept in ctx until the backward, and a caller refilling
    its input buffer in between would otherwise change the gradients."""
    if t is None:
        return None
    a = t.detach().cpu().numpy()
    # np.array(copy=False) raises under numpy 2 where a copy is needed: asarray instead
    return np.array(a, dtype=np.float32, order="C") if copy else np.asarray(a, dtype=np.float32, order="C")


def _mask_options(attn_mask, key_padding_mask, is_causal, B, T, S, h, four_d=False):
    """PyTorch's masks as Layer.forward options (bool True = NOT allowed in
    torch, True = may attend in mha; float masks are added in both).
    four_d: attn_mask may also be (B|1, h|1, T, S), Hugging Face's shape
    (torch.nn.MultiheadAttention refuses it, so mha.nn's does)."""
    opts = {"causal": bool(is_causal)}
    attn_shapes = {(T, S): (1, 1), (B * h, T, S): (B, h)}
    if four_d:
        attn_shapes.update({(b, r, T, S): (b, r) for b in (1, B) for r in (1, h)})
    for name, m, shapes in (("attn_mask", attn_mask, attn_shapes),
                            ("key_padding_mask", key_padding_mask, {(B, S): None})):
        if m is None:
            continue
        _check_mask_tensor(name, m)
        m = m.detach()
        if tuple(m.shape) not in shapes:
            raise ShapeError(f"{name} has shape {tuple(m.shape)}; expected one of {list(shapes)}")
        is_bool = m.dtype in (torch.bool, torch.uint8)
        if not is_bool and not m.dtype.is_floating_point:
            raise ArgumentError(f"{name} has dtype {m.dtype}; expected bool (True = not allowed) or float (added)")
        # a float32 mask would be shared with the caller: copied when a
        # backward may come, so refilling it before backward() (as the
        # inputs, see _np) cannot change the gradients
        a = (m == 0).numpy() if is_bool else m.to(torch.float32, copy=torch.is_grad_enabled()).numpy()
        if name == "attn_mask":
            a = a.reshape(*shapes[tuple(m.shape)], T, S)
            opts["keep_mask" if is_bool else "additive_mask"] = a
        else:
            opts["key_keep" if is_bool else "key_additive"] = a
    return opts


def _check_mask_tensor(name, m):
    """A mask is a CPU tensor, as in torch; a float mask that requires grad
    (a learned bias passed as attn_mask) is refused: the library computes
    no gradient for masks, and detaching it would leave it untrained."""
    if not isinstance(m, torch.Tensor):
        raise TypeError(f"{name} is a {type(m).__name__}; expected a torch.Tensor (bool: True = not "
                        "allowed, or float: added)")
    if m.device.type != "cpu":
        raise TypeError(f"{name} is on device '{m.device.type}'; expected a CPU tensor")
    if m.layout != torch.strided:  # a sparse mask failed inside torch's == (NotImplementedError)
        raise TypeError(f"{name} has layout {m.layout}; expected a dense (strided) tensor ({name}.to_dense())")
    if m.requires_grad and torch.is_grad_enabled():
        raise ArgumentError(f"{name} requires grad; mha.nn computes no gradient for masks: pass "
                            f"{name}.detach() (or use torch.nn.MultiheadAttention to train it)")


def _check_parameters(module):
    """The parameters are float32 CPU tensors: the constructor refuses other
    dtypes and devices, and .double(), .half() or .to('meta') must not
    slip past it (the forward would compute in float32 from copies)."""
    for name, p in module.named_parameters():
        if p.dtype != torch.float32 or p.device.type != "cpu":
            raise TypeError(f"parameter {name} is {p.dtype} on {p.device.type}; libmha computes in "
                            "float32 on the CPU: expected torch.float32 on cpu (module.float().cpu())")


def _check_inputs(**tensors):
    """Each input is a float32 CPU tensor (None: not given)."""
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):  # a numpy array has a dtype too: say what it is
            raise TypeError(f"{name} is a {type(t).__module__}.{type(t).__name__}, not a tensor; expected a "
                            f"float32 CPU tensor (torch.from_numpy({name}) for numpy data)")
        if t.dtype != torch.float32 or t.device.type != "cpu":
            raise TypeError(f"{name} must be a float32 CPU tensor; got {t.dtype} on {t.device}")
        if t.layout != torch.strided:  # sparse, mkldnn: torch's .numpy() error names no argument
            raise TypeError(f"{name} has layout {t.layout}; expected a dense (strided) float32 CPU tensor "
                            f"({name}.to_dense())")


def _zeros_in_graph(like, shape, tensors):
    """Zeros of shape (the result of an empty batch) that stay in the graph
    of every tensor that requires grad, so a backward gives them zero
    gradients, as torch's layers do."""
    y = like.new_zeros(shape)
    anchor = [t.sum() * 0 for t in tensors if t is not None and t.requires_grad]
    if anchor and torch.is_grad_enabled():
        y = y + sum(anchor)
    return y


def _refuse_double_backward(who, instead):
    """The gradients come from C and carry no graph. Grad mode is on in a
    backward only under create_graph=True (double backward, gradient
    penalties): refuse it, rather than return gradients that silently act
    as constants there (torch's once_differentiable catches only a dy that
    requires grad, not y.sum()'s constant one)."""
    if torch.is_grad_enabled():
        raise UnsupportedError(f"{who}: backward with create_graph=True (double backward) is not "
                               f"supported; expected first-order gradients only (use {instead} for "
                               "higher orders)")


def _forward_arrays(layer, xs, opts, want_probs, backward):
    """(y, probs or None, train) of layer on xs = [x, k_src, v_src] (numpy).
    train: mha_forward_train's (y, tape, opt, keep) when a backward is to
    come and the tape is granted; None otherwise (no backward: nothing to
    keep; want_probs: the tape captures no probabilities; refused: the
    stateless pair)."""
    train = None if want_probs or not backward else _forward_train(layer, xs, opts)
    if train:
        return train[0], None, train
    out = layer.forward(*xs, capture=("probs",) if want_probs else (), **opts)
    y, probs = (out[0], out[1]["probs"]) if want_probs else (out, None)
    return y, probs, None


def _backward_arrays(ctx, opts, dy, wanted):
    """{name: gradient} (numpy, the library's layout) of <dy, y> for the
    names in wanted (among _lib.GRAD_NAMES): mha_backward_tape from the
    forward's tape, else (no tape, or its fp32 sums overflowed) the
    stateless mha_backward_kv. ctx holds the forward's layer, inputs
    [x, k_src, v_src] and train (_forward_arrays'); opts its options."""
    layer, (x, k_src, v_src) = ctx.layer, ctx.inputs
    c, x, k_src, v_src, B, T, S = layer._inputs(x, k_src, v_src)
    if ctx.train:  # the forward's own options and arrays: the tape compares them
        _, tape, opt, keep = ctx.train
        x, k_src, v_src = keep[:3]
    else:
        keep = []
        opt = layer._options(c, B, T, S, keep, **opts)
    shapes = _grad_shapes(c, B, T, S)
    g = {n: np.zeros(shapes[n], dtype=np.float32) for n in wanted}
    grads = _lib.Gradients(*(fptr(g.get(n)) for n in _lib.GRAD_NAMES))
    dy = floats("dy", _np(dy), (B, T, c["d_model"]))
    st = None
    if ctx.train:
        with layer._borrow() as ptr, tape._borrow() as tp:
            st = _L.mha_backward_tape(ptr, tp, ctypes.byref(grads), fptr(dy), fptr(x), fptr(k_src),
                                      fptr(v_src), B, T, S, ctypes.byref(opt))
    # no tape, or its fp32 sums overflowed (dy near FLT_MAX): the stateless
    # backward, whose AUTO path recomputes in double (Inf only where exact)
    if st is None or st == _lib.E_NONFINITE:
        with layer._borrow() as ptr:
            st = _L.mha_backward_kv(ptr, ctypes.byref(grads), fptr(dy), fptr(x), fptr(k_src),
                                    fptr(v_src), B, T, S, ctypes.byref(opt))
        check(st, "mha_backward_kv")
    else:
        check(st, "mha_backward_tape")
    return g


def _check_dropout(p):
    """dropout as the library takes it: a real number 0 <= p < 1, also in
    float32 (options.dropout_p: 1 - 1e-9 rounds to 1)."""
    if (isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0
            or np.float32(p) >= 1.0):
        raise ValueError(f"dropout={p!r}; expected a number 0 <= dropout < 1 in float32 (attention dropout "
                         "on the probabilities in training; 0: none)")


def _dropout_options(p, training):
    """The options of attention dropout for one call: none in eval mode; in
    training p and a seed drawn from torch's generator (torch.manual_seed
    makes a run repeatable; a forward and its backward share the seed)."""
    if not training or p == 0.0:
        return {}
    return {"dropout_p": float(p), "dropout_seed": int(torch.randint(0, 2 ** 62, (1,)).item())}


def _torch_gradients(g):
    """The library's gradients as tensors in torch's layout: dw_* (in, out)
    back to (out, in) as nn.Linear's weights."""
    return {n: torch.from_numpy(a.T.copy() if n.startswith("dw_") else a) for n, a in g.items()}


class _Attention(torch.autograd.Function):
    """Y, probs = layer(x, k_src, v_src) with torch-layout weights (out, in).
    k_src None: keys from x; v_src None: values from the key source. The
    gradients of x (and k_src) include every path that reads them."""

    @staticmethod
    def forward(ctx, spec, x, k_src, v_src, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, bias_k, bias_v):
        # x (B,T,E), k_src (B,S,kdim), v_src (B,S,vdim); w_* (out, in) as nn.Linear
        cfg, opts, want_probs, backward = spec
        tensors = (w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, bias_k, bias_v)
        layer = Layer(weights=_library_weights(dict(zip(_TORCH_ORDER, tensors))), **cfg)
        xs = [_np(t, copy=backward) for t in (x, k_src, v_src)]  # kept for a backward: copies
        # no backward to come (no_grad, inference, nothing requires grad): no tape to build
        y, probs, ctx.train = _forward_arrays(layer, xs, opts, want_probs, backward)
        ctx.spec, ctx.layer, ctx.inputs = spec, layer, xs
        ctx.has = [t is not None for t in (k_src, v_src, b_q, bias_k)]
        probs_t = torch.from_numpy(probs) if want_probs else x.new_zeros(0)
        ctx.mark_non_differentiable(probs_t)
        return torch.from_numpy(y), probs_t

    @staticmethod
    def backward(ctx, dy, _dprobs):
        _refuse_double_backward("mha.nn.MultiheadAttention", "torch.nn.MultiheadAttention")
        _, opts, _, _ = ctx.spec
        has_k, has_v, has_bias, has_bias_kv = ctx.has
        wanted = {"dx", "dw_q", "dw_k", "dw_v", "dw_o"}
        wanted |= {"dk_src"} if has_k else set()
        wanted |= {"dv_src"} if has_v else set()
        wanted |= {"db_q", "db_k", "db_v", "db_o"} if has_bias else set()
        wanted |= {"dbias_k", "dbias_v"} if has_bias_kv else set()
        t = _torch_gradients(_backward_arrays(ctx, opts, dy, wanted))
        kv_shape = (1, 1, -1)
        return (None, t["dx"], t.get("dk_src"), t.get("dv_src"), t["dw_q"], t["dw_k"], t["dw_v"],
                t["dw_o"], t.get("db_q"), t.get("db_k"), t.get("db_v"), t.get("db_o"),
                t["dbias_k"].reshape(kv_shape) if has_bias_kv else None,
                t["dbias_v"].reshape(kv_shape) if has_bias_kv else None)


_TORCH_ORDER = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "bias_k", "bias_v")


def _library_weights(tensors):
    """{name: tensor} of the library's weight names, w_* in torch's layout
    (out, in) -> numpy arrays as mha_weights holds them: w_* (in, out),
    every other tensor flat. None entries are left out."""
    return {n: _np(a.t()) if n.startswith("w_") else _np(a).reshape(-1)
            for n, a in tensors.items() if a is not None}


def _grad_shapes(c, B, T, S):
    h, g, dk, dv, E = c["n_heads"], c["n_kv_heads"], c["d_k"], c["d_v"], c["d_model"]
    per_head = c["qk_norm_per_head"]  # whole-width norms have per-head weights too
    return {"dx": (B, T, E), "dk_src": (B, S, c["d_kv_in"]), "dv_src": (B, S, c["d_v_in"]),
            "dw_q": (E, h * dk), "dw_k": (c["d_kv_in"], g * dk), "dw_v": (c["d_v_in"], g * dv),
            "dw_o": (h * dv, E), "db_q": (h * dk,), "db_k": (g * dk,), "db_v": (g * dv,), "db_o": (E,),
            "dbias_k": (g * dk,), "dbias_v": (g * dv,), "d_sinks": (h,),
            "d_q_norm": (h * dk if per_head else dk,), "d_k_norm": (g * dk if per_head else dk,),
            "dw_g": (E, h * dv), "db_g": (h * dv,)}


class MultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention computed by libmha (forward and backward).

    Same constructor arguments, same parameter names
    and shapes (load_state_dict works both ways), same forward arguments
    and results. Extra: num_kv_heads (GQA/MQA: h_kv kv heads shared by
    groups of h / h_kv query heads; then k/v_proj_weight are (h_kv*d, kdim)
    and in_proj_bias is (E + 2*h_kv*d,)), and masked_rows: 'nan' (torch's
    result for a query that may attend to no key) or 'zero' (the library's
    default: zero output and zero gradient).
    attn_weights are returned without a gradient.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None, dtype=None,
                 *, num_kv_heads=None, masked_rows="nan"):
        super().__init__()
        _check_dropout(dropout)
        if dtype not in (None, torch.float32) or (device is not None and torch.device(device).type != "cpu"):
            raise ValueError(f"device={device}, dtype={dtype}: libmha computes in float32 on the CPU; "
                             "expected device=None/'cpu', dtype=None/torch.float32")
        # the binding's integer rule: torch.empty's own error for 16.0, '16' or -1 names no argument,
        # and kdim=0 (a zero-width key source) made a module whose forward failed naming w_k
        embed_dim, num_heads = c_int("embed_dim", embed_dim, 1), c_int("num_heads", num_heads, 1)
        kdim = None if kdim is None else c_int("kdim", kdim, 1)
        vdim = None if vdim is None else c_int("vdim", vdim, 1)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be a positive multiple of num_heads={num_heads}")
        # an extension of ours, so the binding's integer rule: int(2.9) would quietly be 2
        h_kv = num_heads if num_kv_heads is None else c_int("num_kv_heads", num_kv_heads, 1)
        if h_kv <= 0 or num_heads % h_kv:
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}")
        if masked_rows not in ("nan", "zero"):
            raise ValueError(f"masked_rows={masked_rows!r}; expected 'nan' or 'zero'")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, h_kv
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.head_dim = embed_dim // num_heads
        self.dropout, self.batch_first, self.add_zero_attn = float(dropout), batch_first, add_zero_attn
        self.masked_rows = masked_rows
        kv_width = h_kv * self.head_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim and h_kv == num_heads
        P = torch.nn.Parameter
        if self._qkv_same_embed_dim:
            self.in_proj_weight = P(torch.empty(3 * embed_dim, embed_dim))
            for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(n, None)
        else:
            self.q_proj_weight = P(torch.empty(embed_dim, embed_dim))
            self.k_proj_weight = P(torch.empty(kv_width, self.kdim))
            self.v_proj_weight = P(torch.empty(kv_width, self.vdim))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = P(torch.empty(embed_dim + 2 * kv_width))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        if add_bias_kv:
            self.bias_k = P(torch.empty(1, 1, kv_width))
            self.bias_v = P(torch.empty(1, 1, kv_width))
        else:
            self.bias_k = self.bias_v = None
        self._reset_parameters()

    def _reset_parameters(self):
        """The initialization torch's module uses."""
        if self._qkv_same_embed_dim:
            torch.nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                torch.nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            torch.nn.init.constant_(self.in_proj_bias, 0.0)
            torch.nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            torch.nn.init.xavier_normal_(self.bias_k)
            torch.nn.init.xavier_normal_(self.bias_v)

    def _projections(self):
        """W_q, W_k, W_v (out, in) and b_q, b_k, b_v as views of the parameters."""
        E, kvw = self.embed_dim, self.num_kv_heads * self.head_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            ws = (w[:E], w[E:2 * E], w[2 * E:])
        else:
            ws = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = self.in_proj_bias
        bs = (None, None, None) if b is None else (b[:E], b[E:E + kvw], b[E + kvw:])
        return ws, bs

    def _empty(self, args, B, T, S):
        """torch's results for B = 0 or T = 0: y (B,T,E) and probs
        (B,h,T,S') empty; y stays in the graph of every tensor in args, so
        a backward gives them zero gradients as torch's does."""
        # the shapes were checked in forward (check_qkv_shapes), as for a non-empty call
        S_all = S + (self.bias_k is not None) + bool(self.add_zero_attn)
        y = _zeros_in_graph(args[0], (B, T, self.embed_dim), args)
        return y, args[0].new_zeros(B, self.num_heads, T, S_all)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """(attn_output, attn_weights) as torch's: query (L,N,E) or (N,L,E)
        with batch_first or unbatched (L,E); key (S,N,kdim), value
        (S,N,vdim) likewise. attn_weights (N,L,S') averaged over heads or
        (N,h,L,S'), S' = S + add_bias_kv + add_zero_attn; None without
        need_weights. is_causal: query i may not see key j > i."""
        _check_inputs(query=query, key=key, value=value)
        _check_parameters(self)
        _check_dropout(self.dropout)  # torch's forward reads the attribute: set later, it counts
        batched = query.dim() == 3
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise ShapeError(f"query/key/value have {query.dim()}/{key.dim()}/{value.dim()} dims; "
                             "expected all 3 (batched) or all 2 (unbatched)")
        # in the caller's layout and names (the library would say x and kv, batch first)
        check_qkv_shapes(query.shape, key.shape, value.shape, batched, self.batch_first, self.embed_dim,
                         self.kdim, self.vdim)
        same_kv, same_v = key is query, value is key

        def to_bte(t):  # -> (B, T, features)
            return t.unsqueeze(0) if not batched else (t if self.batch_first else t.transpose(0, 1))

        x = to_bte(query)
        k_src = None if same_kv else to_bte(key)
        v_src = None if same_v else to_bte(value)
        B, T, S = x.shape[0], x.shape[1], (x if same_kv else k_src).shape[1]
        if not batched and key_padding_mask is not None:  # (S,) -> (1,S); a 3-D attn_mask is (h,L,S) = (B*h,L,S)
            _check_mask_tensor("key_padding_mask", key_padding_mask)
            if tuple(key_padding_mask.shape) != (S,):
                raise ShapeError(f"key_padding_mask has shape {tuple(key_padding_mask.shape)}; "
                                 f"expected (S,) = ({S},) for unbatched inputs")
            key_padding_mask = key_padding_mask.reshape(1, S)
        opts = _mask_options(attn_mask, key_padding_mask, is_causal, B, T, S, self.num_heads)
        opts["masked_row"] = self.masked_rows
        opts.update(_dropout_options(self.dropout, self.training))
        cfg = dict(d_model=self.embed_dim, n_heads=self.num_heads, n_kv_heads=self.num_kv_heads,
                   d_kv_in=self.kdim, d_v_in=self.vdim, bias=self.in_proj_bias is not None,
                   add_bias_kv=self.bias_k is not None, add_zero_attn=self.add_zero_attn)
        (w_q, w_k, w_v), (b_q, b_k, b_v) = self._projections()
        args = (x, k_src, v_src, w_q, w_k, w_v, self.out_proj.weight, b_q, b_k, b_v, self.out_proj.bias,
                self.bias_k, self.bias_v)
        # whether autograd records this call (the tensors apply() sees, not self.parameters(): a
        # functional_call or a parametrization passes others)
        backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args)
        if B == 0 or T == 0:  # the library refuses empty inputs; torch returns empty results
            y, probs = self._empty(args, B, T, S)
        else:
            y, probs = _Attention.apply((cfg, opts, need_weights, backward), *args)
        if batched and not self.batch_first:
            # contiguous, as torch's (L,N,E) output is: callers .view() it
            y = y.transpose(0, 1).contiguous()
        if not batched:
            y = y[0]
        if not need_weights:
            return y, None
        w = probs.mean(dim=1) if average_attn_weights else probs  # (B,T,S') or (B,h,T,S')
        return y, (w if batched else w[0])


def head_attribution(layer, x, dy, kv=None, value=None, *, dz=False, **options):
    """Per-head attribution of the metric <dy, Y> for an mha.Layer:
    (h,B,T) = sum over d_v of Z^(r) * dZ^(r) (mha_head_attribution), and
    dZ (B,T,h*d_v) too when dz=True. x (B,T,d_model), dy like Y; kv, value
    and options as Layer.forward. Exactly the change of <dy, Y> when head r
    is zeroed (docs/BACKWARD.md)."""
    dz = c_flag("dz", dz)  # a flag like every other: dz="no" is not True
    c, x, kv, value, B, T, S = layer._inputs(x, kv, value)
    keep = [x, kv, value]
    opt = layer._options(c, B, T, S, keep, **options)
    dy = floats("dy", dy, (B, T, c["d_model"]))
    attr = np.empty((c["n_heads"], B, T), dtype=np.float32)
    dz_arr = np.empty((B, T, c["n_heads"] * c["d_v"]), dtype=np.float32) if dz else None
    with layer._borrow() as ptr:
        check(_L.mha_head_attribution(ptr, fptr(attr), fptr(dz_arr), fptr(dy), fptr(x),
                                      fptr(kv), fptr(value), B, T, S, ctypes.byref(opt)),
              "mha_head_attribution")
    return (attr, dz_arr) if dz else attr


# today's attention layer (RoPE, ALiBi, softcap, sinks, QK-norm), built on the helpers above
from .nn_modern import Attention  # noqa: E402,F401  (mha.nn.Attention)
