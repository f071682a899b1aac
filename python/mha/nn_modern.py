"""mha.nn.Attention: today's attention layer as a trainable torch module,
forward and backward computed by libmha.

    import mha.nn
    attn = mha.nn.Attention(512, 8, n_kv_heads=2, rope={"pairing": "halves", "theta": 500000},
                            qk_norm="rms", sinks=True)             # Llama / Qwen 3 / gpt-oss pieces
    y = attn(x, causal=True, window=128)                           # x (B,T,512) -> y (B,T,512)
    y.square().mean().backward()                                   # gradients from libmha

The variants are the library's (docs/VARIANTS.md): RoPE (rope=dict as
mha.Layer's: pairing 'halves' (HF Llama's rotate_half) or 'interleaved'
(GPT-J), dim, theta, scaling...), ALiBi (alibi=True), soft-capping
(softcap=c: c tanh(s/c), Gemma 2), sinks (sinks=True: one learned logit
per head in each softmax denominator, gpt-oss), QK-norm (qk_norm='rms' or
'layer', over each head's d_k with shared (d_k) weights, or per head;
qk_norm_whole: over a token's whole q and k, OLMo 2), the projections'
clamp (clip_qkv=c: q, k, v = (x W^T + b).clamp(-c, c) before QK-norm and
RoPE, OLMo 1 / DBRX / MPT; its gradient passes at the bounds, as torch's
clamp), Llama 4's query temperature (temperature=(floor_scale, attn_scale):
the query at position p times 1 + attn_scale ln(1 + floor((p + 1) /
floor_scale)), last), GQA / MQA (n_kv_heads), cross-attention (kv), and
Gemma 2's scale.

Parameters carry Hugging Face's names, so a Llama/Qwen/gpt-oss attention's
state_dict loads with load_state_dict: q_proj, k_proj, v_proj, o_proj
(torch.nn.Linear, weight (out, in)), sinks (h), q_norm.weight and
k_norm.weight ((d_k), or (h*d_k) / (h_kv*d_k) per head or whole).
alibi_slopes (h) is a buffer: saved and loaded, not trained (the library's
backward gives no slope gradient).

Autograd: mha_forward_train keeps a tape and mha_backward_tape reads it
(the fast fp32 backward, variants included); where the library answers
MHA_E_UNSUPPORTED (NaN mode with a fully masked row, scores beyond the
fast range) mha_forward_kv and the stateless mha_backward_kv,
whose AUTO path falls back to the double-accumulating reference itself.
fp32 on the CPU; first-order gradients only.

Legend: B batch, T queries, S keys, d_model, h heads, h_kv kv heads,
d = head_dim (d_k = d_v), kv_dim the width of a cross-attention source.
"""
import copy
from collections.abc import Mapping

import torch

from ._check import c_flag, c_float, c_int
from .errors import ArgumentError, ShapeError
from . import _lib
from .layer import Layer, _cu_seqlens, _temperature
from .nn import (_backward_arrays, _check_dropout, _check_inputs, _check_parameters, _dropout_options,
                 _forward_arrays, _library_weights, _mask_options, _np, _refuse_double_backward,
                 _torch_gradients, _zeros_in_graph)

# the weights the Function receives, in order, by the library's names
_NAMES = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "sinks", "q_norm", "k_norm",
          "alibi_slopes", "w_g", "b_g")
# the gradient of each input (alibi_slopes has none)
_GRAD = {"x": "dx", "kv": "dk_src", "w_q": "dw_q", "w_k": "dw_k", "w_v": "dw_v", "w_o": "dw_o",
         "b_q": "db_q", "b_k": "db_k", "b_v": "db_v", "b_o": "db_o", "sinks": "d_sinks",
         "q_norm": "d_q_norm", "k_norm": "d_k_norm", "w_g": "dw_g", "b_g": "db_g"}
_QK_NORM = {"none": "none", "rms": "rms", "layer": "layer", "layernorm": "layer"}


def _named_temperature(temperature):
    """(floor, scale, rule name) of a temperature argument, checked."""
    floor, scale, rule = _temperature(temperature)
    return floor, scale, {v: k for k, v in _lib.TEMPERATURE_RULE.items()}[rule]


def _check_empty_cu_seqlens(cu_seqlens, T, S, sink_tokens, chunk_size):
    """cu_seqlens of an empty input (B = 0 or T = 0), which the library never
    sees (it refuses empty shapes: forward answers the zeros itself), judged
    as mha_check_cu_seqlens (src/core/options.c) judges them for a non-empty
    one: the same verdicts, in its words. At T = 0 none pass: n >= 1
    sequences of at least one row each need T >= n."""
    if cu_seqlens is None:
        return
    cu = list(_cu_seqlens(cu_seqlens, T))  # ShapeError for a bad type or shape, as for T > 0
    n = len(cu) - 1
    if S != T:
        raise ArgumentError(f"options.cu_seqlens with T={T} queries and S={S} keys; expected packed "
                            "self-attention sequences (S = T)")
    if c_int("sink_tokens", sink_tokens, 0) > 0 or c_int("chunk_size", chunk_size, 0) > 0:
        raise ArgumentError(f"options.cu_seqlens with {'sink_tokens' if sink_tokens > 0 else 'chunk_size'}; "
                            "expected 0 (they would cut across the packed sequences)")
    if n > T or cu[0] != 0 or cu[n] != T:
        raise ArgumentError(f"options.cu_seqlens[0]={cu[0]}, [n_seqs={n}]={cu[n]}; expected 0 and T={T} "
                            "(n_seqs <= T)" + ("; no sequence fits in T=0 rows: pass cu_seqlens=None "
                                               "for an empty sequence dimension" if T == 0 else ""))
    for s in range(n):
        if cu[s + 1] <= cu[s]:
            raise ArgumentError(f"options.cu_seqlens[{s + 1}]={cu[s + 1]} after [{s}]={cu[s]}; expected "
                                "strictly increasing boundaries (every sequence at least one row)")


class _Function(torch.autograd.Function):
    """y = attention(x, kv) with the weights of _NAMES (w_* (out, in) as
    nn.Linear; None where the layer has no such tensor). kv None: keys and
    values from x."""

    @staticmethod
    def forward(ctx, spec, x, kv, *weights):
        # x (B,T,d_model), kv (B,S,kv_dim) or None; y (B,T,d_model)
        cfg, opts, backward = spec
        layer = Layer(weights=_library_weights(dict(zip(_NAMES, weights))), **cfg)
        xs = [_np(t, copy=backward) for t in (x, kv)] + [None]  # kept for a backward: copies
        y, _, ctx.train = _forward_arrays(layer, xs, opts, False, backward)
        ctx.layer, ctx.inputs, ctx.opts = layer, xs, opts
        return torch.from_numpy(y)

    @staticmethod
    def backward(ctx, dy):
        _refuse_double_backward("mha.nn.Attention", "a torch implementation of the layer")
        names = ("x", "kv") + _NAMES
        need = [n for n, want in zip(names, ctx.needs_input_grad[1:]) if want and n in _GRAD]
        g = _torch_gradients(_backward_arrays(ctx, ctx.opts, dy, {_GRAD[n] for n in need})) if need else {}
        return (None,) + tuple(g.get(_GRAD.get(n)) for n in names)


class _NormWeight(torch.nn.Module):
    """The weight of a q or k norm (state_dict key q_norm.weight, as Hugging
    Face's Qwen3RMSNorm keeps it); the norm itself runs in libmha."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))  # (n,) ones: the identity scale

    def extra_repr(self):
        return str(self.weight.shape[0])


class Attention(torch.nn.Module):
    """Today's attention layer (see the module's docstring), batch first.

    Attention(d_model, n_heads, n_kv_heads=None, head_dim=None, bias=False, *,
              kv_dim=None, rope=None, alibi=False, softcap=0.0, sinks=False,
              qk_norm='none', qk_norm_per_head=False, qk_norm_eps=1e-6,
              qk_norm_whole=False, clip_qkv=None, temperature=None, scale=None,
              output_gate=False, dropout=0.0, masked_rows='zero')

    head_dim: d (None: d_model / n_heads); bias: True (q, k, v and o
    biases), False, or 'qkv' (Qwen 2: q, k, v only); kv_dim: width of a
    cross-attention source (None: d_model); scale: the scores' factor
    (None: 1/sqrt(d); Gemma 2: query_pre_attn_scalar^-1/2); masked_rows:
    what a query that may attend no key gives, 'zero' (zero output before
    o_proj, zero gradient) or 'nan' (torch's softmax); output_gate: gated
    attention (Qwen3-Next, Qwen 3.5): q_proj is (2*n_heads*d, d_model),
    each head's d query rows then its d gate rows as Qwen3NextAttention
    holds them, and each head's output is multiplied by sigmoid(gate)
    before o_proj (the library's w_q and w_g are views of q_proj: one
    parameter, one gradient); dropout: attention dropout on the
    probabilities in training mode (Hugging Face's attention_dropout;
    none in eval mode), drawn by the library from a seed that torch's
    generator gives each call. The variants'
    arguments are mha.Layer's. Initialization: nn.Linear's for the
    projections, ones for the norms, zeros for the sinks, the ALiBi paper's
    slopes (BLOOM's rule).
    """

    def __init__(self, d_model, n_heads, n_kv_heads=None, head_dim=None, bias=False, *, kv_dim=None,
                 rope=None, alibi=False, softcap=0.0, sinks=False, qk_norm="none", qk_norm_per_head=False,
                 qk_norm_eps=1e-6, qk_norm_whole=False, clip_qkv=None, temperature=None, scale=None,
                 output_gate=False, dropout=0.0, masked_rows="zero",
                 device=None, dtype=None):
        super().__init__()
        if dtype not in (None, torch.float32) or (device is not None and torch.device(device).type != "cpu"):
            raise ValueError(f"device={device}, dtype={dtype}: libmha computes in float32 on the CPU; "
                             "expected device=None/'cpu', dtype=None/torch.float32")
        d_model, h = c_int("d_model", d_model, 1), c_int("n_heads", n_heads, 1)
        h_kv = h if n_kv_heads is None else c_int("n_kv_heads", n_kv_heads, 1)
        if head_dim is None and d_model % h:
            raise ValueError(f"d_model={d_model} is not a multiple of n_heads={h}; expected a multiple, "
                             "or head_dim given")
        d = d_model // h if head_dim is None else c_int("head_dim", head_dim, 1)
        kv_dim = d_model if kv_dim is None else c_int("kv_dim", kv_dim, 1)
        if not (isinstance(bias, bool) or isinstance(bias, str) and bias == "qkv"):
            raise ArgumentError(f"bias={bias!r}; expected True (q, k, v, o biases), False or 'qkv' "
                                "(q, k, v only)")
        if not isinstance(qk_norm, str) or qk_norm not in _QK_NORM:
            raise ArgumentError(f"qk_norm={qk_norm!r}; expected one of {', '.join(_QK_NORM)}")
        if masked_rows not in ("zero", "nan"):
            raise ArgumentError(f"masked_rows={masked_rows!r}; expected 'zero' or 'nan'")
        _check_dropout(dropout)
        if qk_norm != "none" and not c_float("qk_norm_eps", qk_norm_eps) > 0:  # the library reads 0 as 1e-6
            raise ArgumentError(f"qk_norm_eps={qk_norm_eps!r}; expected a number > 0")
        if clip_qkv is not None and not c_float("clip_qkv", clip_qkv) > 0:  # the library reads 0 as none
            raise ArgumentError(f"clip_qkv={clip_qkv!r}; expected None (no clamp) or a number > 0")
        if scale is not None and not c_float("scale", scale) > 0:
            raise ArgumentError(f"scale={scale!r}; expected None (1/sqrt(head_dim)) or a number > 0")
        if rope is not None and not isinstance(rope, Mapping):  # dict(True) raised "'bool' object is not iterable"
            raise ArgumentError(f"rope={rope!r}; expected None or a dict of the RoPE settings "
                                "(e.g. {'pairing': 'halves', 'theta': 10000.0}; docs/VARIANTS.md)")
        variants = dict(rope=None if rope is None else dict(rope), alibi=c_flag("alibi", alibi),
                        softcap=c_float("softcap", softcap), sinks=c_flag("sinks", sinks),
                        qk_norm=_QK_NORM[qk_norm], qk_norm_per_head=c_flag("qk_norm_per_head", qk_norm_per_head),
                        qk_norm_eps=c_float("qk_norm_eps", qk_norm_eps) if qk_norm != "none" else 0.0,
                        qk_norm_whole=c_flag("qk_norm_whole", qk_norm_whole),
                        clip_qkv=0.0 if clip_qkv is None else c_float("clip_qkv", clip_qkv),
                        temperature=None if temperature is None else _named_temperature(temperature),
                        output_gate=c_flag("output_gate", output_gate))
        # the library judges the combination (rope dim, divisors, softcap >= 0, ...) on a layer of
        # the same heads and widths 1 (no d_model-sized zeros); it also gives ALiBi's default slopes
        probe = Layer(1, h, n_kv_heads=h_kv, d_k=d, d_v=d, d_kv_in=1, bias=bias is not False, **variants)
        self._config = dict(d_model=d_model, n_heads=h, n_kv_heads=h_kv, d_k=d, d_v=d, d_kv_in=kv_dim,
                            bias=bias is not False, **variants)
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.kv_dim = d_model, h, h_kv, d, kv_dim
        self.bias, self.scale, self.masked_rows, self.dropout = bias, scale, masked_rows, float(dropout)
        gate = 2 if variants["output_gate"] else 1  # Qwen3-Next: each head's query, then its gate
        self.q_proj = torch.nn.Linear(d_model, gate * h * d, bias=bias is not False)
        self.k_proj = torch.nn.Linear(kv_dim, h_kv * d, bias=bias is not False)
        self.v_proj = torch.nn.Linear(kv_dim, h_kv * d, bias=bias is not False)
        self.o_proj = torch.nn.Linear(h * d, d_model, bias=bias is True)
        if variants["sinks"]:
            self.sinks = torch.nn.Parameter(torch.zeros(h))  # (h,) sink logits
        else:
            self.register_parameter("sinks", None)
        if variants["qk_norm"] != "none":
            wide = variants["qk_norm_per_head"] or variants["qk_norm_whole"]
            self.q_norm = _NormWeight(h * d if wide else d)       # (d) shared, or (h*d)
            self.k_norm = _NormWeight(h_kv * d if wide else d)    # (d) shared, or (h_kv*d)
        else:
            self.q_norm = self.k_norm = None
        if variants["alibi"]:
            self.register_buffer("alibi_slopes", torch.from_numpy(probe.weights()["alibi_slopes"]))  # (h,)
        else:
            self.register_buffer("alibi_slopes", None)

    @property
    def config(self):
        """The mha.Layer arguments this module runs with (a copy: the
        parameters' shapes were made for them, so they are fixed)."""
        return copy.deepcopy(self._config)

    def extra_repr(self):
        c = self._config
        variants = "".join(f", {k}={c[k]!r}" for k in ("rope", "alibi", "softcap", "sinks", "qk_norm", "clip_qkv",
                                                        "temperature", "output_gate")
                           if c[k] not in (None, 0, "none"))
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, bias={self.bias!r}{variants}")

    def _weights(self, like):
        """The tensors of _NAMES (None where absent); b_o zeros for bias='qkv';
        w_q, w_g (and b_q, b_g) the query and gate rows of a gated q_proj
        (views: autograd takes their gradients back into q_proj)."""
        b_o = self.o_proj.bias
        if self.bias == "qkv":
            b_o = like.new_zeros(self.d_model)  # the library's biases come as four; o's is a constant
        w_q, b_q, w_g, b_g = self.q_proj.weight, self.q_proj.bias, None, None
        if self._config["output_gate"]:
            h, d = self.n_heads, self.head_dim
            rows = w_q.view(h, 2, d, self.d_model)  # (h, query|gate, d, d_model)
            w_q, w_g = rows[:, 0].reshape(h * d, -1), rows[:, 1].reshape(h * d, -1)
            if b_q is not None:
                b_q, b_g = b_q.view(h, 2, d)[:, 0].reshape(-1), b_q.view(h, 2, d)[:, 1].reshape(-1)
        return (w_q, self.k_proj.weight, self.v_proj.weight, self.o_proj.weight,
                b_q, self.k_proj.bias, self.v_proj.bias, b_o, self.sinks,
                None if self.q_norm is None else self.q_norm.weight,
                None if self.k_norm is None else self.k_norm.weight, self.alibi_slopes, w_g, b_g)

    def forward(self, x, kv=None, *, causal=False, window=None, positions=None, key_positions=None,
                key_padding_mask=None, attn_mask=None, align="top_left", sink_tokens=0, chunk_size=0,
                cu_seqlens=None):
        """y (B,T,d_model) from x (B,T,d_model) and kv (B,S,kv_dim) (None: x).

        causal: key j hidden from query i > j (align 'bottom_right' lines
        the last query up with the last key when S != T); window W: query i
        sees keys i-W+1..i at most (Mistral's sliding_window; the right side
        is bounded by causal); sink_tokens n: with a window, the first n
        keys stay visible (StreamingLLM); chunk_size C: query i and key j
        only inside one chunk of C (Llama 4's chunked attention, by index
        like the window); cu_seqlens (n + 1 ints 0 = cu[0] < ... < cu[n] = T):
        packed sequences (FlashAttention's varlen), rows cu[s]..cu[s+1]-1
        attend only each other (positions: give each sequence's from 0
        where absolute positions matter); checked for an empty input too
        (B = 0 or T = 0: no boundaries fit T = 0, pass None). positions (B,T) / key_positions
        (B,S): integer token positions for RoPE and ALiBi (default 0..T-1;
        keys: the queries' when kv is None, else 0..S-1). Masks as torch's:
        key_padding_mask (B,S), attn_mask (T,S), (B*h,T,S) or
        (B|1,h|1,T,S); bool True = not allowed, float = added to the scores.
        """
        _check_inputs(x=x, kv=kv)
        _check_parameters(self)
        kv = None if kv is x else kv  # self-attention: the keys take the queries' positions
        if x.dim() != 3 or x.shape[2] != self.d_model:
            raise ShapeError(f"x has shape {tuple(x.shape)}; expected (B,T,d_model={self.d_model})")
        B, T = x.shape[0], x.shape[1]
        if kv is not None and (kv.dim() != 3 or kv.shape[0] != B or kv.shape[2] != self.kv_dim):
            raise ShapeError(f"kv has shape {tuple(kv.shape)}; expected (B={B},S,kv_dim={self.kv_dim})")
        S = T if kv is None else kv.shape[1]
        opts = _mask_options(attn_mask, key_padding_mask, c_flag("causal", causal), B, T, S, self.n_heads,
                             four_d=True)
        opts.update(masked_row=self.masked_rows, scale=self.scale or 0.0, align=align,
                    window_left=None if window is None else c_int("window", window, 1) - 1,
                    positions=positions, key_positions=key_positions, sink_tokens=sink_tokens,
                    chunk_size=chunk_size, cu_seqlens=cu_seqlens)
        _check_dropout(self.dropout)  # the attribute may be set after construction
        opts.update(_dropout_options(self.dropout, self.training))
        weights = self._weights(x)
        if B == 0 or T == 0:  # the library refuses empty inputs: empty output, zero gradients
            _check_empty_cu_seqlens(cu_seqlens, T, S, sink_tokens, chunk_size)  # as the library would
            return _zeros_in_graph(x, (B, T, self.d_model), (x, kv) + weights)
        # whether autograd records this call (the tensors apply() sees)
        backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                   for t in (x, kv) + weights)
        return _Function.apply((self._config, opts, backward), x, kv, *weights)

    def to_layer(self):
        """An mha.Layer with a copy of the current weights (for the KV cache,
        mha.Layer.save, the contract checks). Its forward takes the library's
        options: pass scale=attn.scale when set (masked_row 'zero' is its
        default too; window W is window_left=W-1; masks True = may attend)."""
        _check_parameters(self)
        like = self.q_proj.weight
        return Layer(weights=_library_weights(dict(zip(_NAMES, self._weights(like)))), **self._config)
