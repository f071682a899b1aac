"""Probes of the PyTorch side (mha.nn, torch_forward, the array helpers)
that found defects: each defect's test failed before its fix (a few guard
that the working cases still work).

- double backward (create_graph=True) returned gradients without a graph,
  so a gradient penalty silently acted as a constant;
- an input refilled in place between forward and backward changed the
  gradients (the forward kept a view of the tensor, not a copy);
- a float attn_mask that requires grad (a learned bias) was detached
  silently: it never trained;
- .double(), .half() or .to('meta') on the module slipped past the
  constructor's float32/CPU rule (silent float32 compute, or torch's
  own error deep inside);
- masks that are not CPU tensors, and an unbatched key_padding_mask of
  the wrong length, failed inside torch instead of naming the mask;
- bfloat16 tensors (a bf16 state dict, bf16 inputs) and tensors off the
  CPU failed inside torch's .numpy(); a 0-d array was reported as (1,).
- None, a dict or a string as an array was reported as 'dtype object'
  (or numpy's bare ValueError for a list of strings).
- from_torch_state_dict: a list or None as the state dict, or an int
  prefix, failed with AttributeError/TypeError; an entry None was read as
  an object array instead of an absent tensor.
- mha.nn's num_kv_heads went through int(): 2.9 became 2, '2' and True
  were accepted.
- interventions: {True: op} acted on head 1; ('scale',) was an
  IndexError and ('scale', s, extra) dropped the extra silently;
  interventions=5 was a bare TypeError and 'zero' four one-letter ops.
- cache_bytes_for of a too-large cache blamed batch/capacity ("expected
  batch >= 1") when both were valid: the size limit was the reason.
- Layer.load took any truthy add_zero_attn ('no' meant True), against
  the documented flag rule.
- mha.nn's (L,N,E) output (batch_first=False, torch's default) was a
  transposed view: out.view(L*N, E), fine on torch's contiguous output,
  raised.
- Layer.save/load passed a path (and load a prefix) with an embedded NUL
  to C, which stopped there: save('out\\0.st') wrote 'out'.
- layer.add_zero_attn = True (a torch module's habit) made a Python
  attribute that read back True and changed nothing in C.
- mha.nn: m.dropout = 0.1 after construction (torch's forward reads it: applied in training)
  was ignored silently in training.
- mha.nn.head_attribution took any truthy dz ('no' meant True).
- errors read 'mha_forward: mha_forward: B=0 ...': the binding prefixed
  the call's name to a message that already began with it.
"""

import numpy as np
import pytest

from conftest import TORCH_SKIP_REASON, torch

if torch is None:
    pytest.skip(TORCH_SKIP_REASON, allow_module_level=True)

import mha  # noqa: E402
import mha.nn  # noqa: E402
from test_nn import randomize as randomize_nn  # noqa: E402

E, H, B, T, S = 16, 4, 2, 5, 7


def randomize(m, seed=0):
    return randomize_nn(m, seed)  # test_nn's: every parameter random, biases too


def pair(**kw):
    t = randomize(torch.nn.MultiheadAttention(E, H, batch_first=True, **kw))
    m = mha.nn.MultiheadAttention(E, H, batch_first=True, **kw)
    m.load_state_dict(t.state_dict())
    return t, m


def data(shape=(B, T, E), seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------ autograd

@pytest.mark.parametrize("need_weights", [False, True])
def test_double_backward_is_refused_not_silently_first_order(need_weights):
    _, m = pair()
    q = data().requires_grad_()
    y, _ = m(q, q, q, need_weights=need_weights)
    # y.sum(): a dy that does not require grad (once_differentiable misses it)
    with pytest.raises(mha.UnsupportedError, match="create_graph"):
        torch.autograd.grad(y.sum(), q, create_graph=True)


def test_first_order_backward_still_works_after_the_refusal():
    t, m = pair()
    for mod in (t, m):
        mod.zero_grad(set_to_none=True)
        y, _ = mod(data(), data(), data())
        y.pow(2).sum().backward()
    assert torch.allclose(m.in_proj_weight.grad, t.in_proj_weight.grad, atol=1e-4)


@pytest.mark.parametrize("need_weights", [False, True])  # stateless pair and tape
def test_input_refilled_between_forward_and_backward_keeps_gradients(need_weights):
    t, m = pair()
    want = []
    for mod in (t, m):
        mod.zero_grad(set_to_none=True)
        x = data()
        y, _ = mod(x, x, x, need_weights=need_weights)
        x.mul_(5.0)  # e.g. a preallocated batch buffer refilled before backward
        y.sum().backward()
        want.append(mod.in_proj_weight.grad.clone())
    assert torch.allclose(want[1], want[0], atol=1e-4), "gradients read the refilled input"


def test_mask_that_requires_grad_is_refused_in_training_accepted_under_no_grad():
    _, m = pair()
    x = data()
    bias = torch.zeros(T, T, requires_grad=True)  # a learned additive bias
    with pytest.raises(mha.ArgumentError, match="attn_mask requires grad"):
        m(x, x, x, attn_mask=bias)
    pad = torch.zeros(B, T, requires_grad=True)
    with pytest.raises(mha.ArgumentError, match="key_padding_mask requires grad"):
        m(x, x, x, key_padding_mask=pad)
    with torch.no_grad():
        y, _ = m(x, x, x, attn_mask=bias)
    assert torch.allclose(y, m(x, x, x, attn_mask=bias.detach())[0])


@pytest.mark.parametrize("convert", ["double", "half", "meta"])
def test_parameters_converted_after_construction_are_refused(convert):
    _, m = pair()
    if convert == "meta":
        m.to("meta")
    else:
        getattr(m, convert)()
    x = data()
    with pytest.raises(TypeError, match="parameter in_proj_weight .*expected torch.float32 on cpu"):
        m(x, x, x)


# ----------------------------------------------------------------- masks

@pytest.mark.parametrize("mask", [np.zeros((T, T), dtype=bool), [[0.0] * T] * T],
                         ids=["numpy", "list"])
def test_mask_that_is_not_a_tensor_names_the_mask(mask):
    _, m = pair()
    x = data()
    with pytest.raises(TypeError, match="attn_mask is a .*; expected a torch.Tensor"):
        m(x, x, x, attn_mask=mask)


def test_mask_off_the_cpu_names_the_device():
    _, m = pair()
    x = data()
    with pytest.raises(TypeError, match="attn_mask is on device 'meta'"):
        m(x, x, x, attn_mask=torch.zeros(T, T, device="meta"))


def test_unbatched_key_padding_mask_of_wrong_length_is_a_shape_error():
    _, m = pair()
    x = data((T, E))
    with pytest.raises(mha.ShapeError, match=r"key_padding_mask has shape \(6,\); expected \(S,\) = \(5,\)"):
        m(x, x, x, key_padding_mask=torch.zeros(T + 1, dtype=torch.bool))


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


@pytest.mark.parametrize("given, what", [(None, "x is a NoneType"), ({}, "x is a dict"),
                                         ("abc", "x is a str"), ([[["a"]]], "x is a list that is not"),
                                         ([[[1.0], [1.0, 2.0]]], "x is a list that is not")],
                         ids=["None", "dict", "str", "list-of-str", "ragged"])
def test_non_array_input_is_named_by_its_type(given, what):
    layer = mha.Layer(E, H)
    with pytest.raises(mha.DTypeError, match=what):
        layer.forward(given)


# ------------------------------------------------- from_torch_state_dict

def test_state_dict_that_is_not_a_mapping_or_prefix_not_a_string_is_named():
    t, _ = pair()
    with pytest.raises(mha.ArgumentError, match="state_dict is a list; expected a mapping"):
        mha.from_torch_state_dict(list(t.state_dict().items()), num_heads=H)
    with pytest.raises(mha.ArgumentError, match="prefix=3; expected None or a module path"):
        mha.from_torch_state_dict(t.state_dict(), num_heads=H, prefix=3)


def test_state_dict_entry_none_means_absent_like_a_modules_none_parameter():
    t, _ = pair(add_bias_kv=False)
    sd = dict(t.state_dict(), bias_k=None, bias_v=None)
    layer = mha.from_torch_state_dict(sd, num_heads=H)
    assert layer.config["add_bias_kv"] == 0
    with pytest.raises(mha.ArgumentError, match="no 'out_proj.weight'"):
        mha.from_torch_state_dict(dict(sd, **{"out_proj.weight": None}), num_heads=H)


@pytest.mark.parametrize("bad", [2.9, "2", True, 0])
def test_num_kv_heads_follows_the_bindings_integer_rule(bad):
    with pytest.raises(mha.ArgumentError, match="num_kv_heads="):
        mha.nn.MultiheadAttention(E, H, num_kv_heads=bad)


# --------------------------------------------------------- interventions

def test_intervention_key_true_is_not_head_one():
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ArgumentError, match=r"interventions keys \[True\]"):
        layer.forward(data().numpy(), interventions={True: "zero"})


@pytest.mark.parametrize("op", [("scale",), ("scale", 1.0, 2.0), 3])
def test_malformed_intervention_is_an_argument_error(op):
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ArgumentError, match=r"interventions\[0\]="):
        layer.forward(data().numpy(), interventions={0: op})


# ------------------------------------------------------------------ cache

def test_cache_bytes_for_beyond_the_size_limit_says_so():
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ArgumentError, match="exceed the size mha_cache_create allows"):
        mha.cache_bytes_for(layer, 2 ** 20, 2 ** 20)  # valid ints, 2^46 bytes


# ------------------------------------------------------------------ files

def test_load_add_zero_attn_is_a_flag_not_any_truthy_value(tmp_path):
    path = str(tmp_path / "layer.safetensors")
    mha.Layer(E, H).save(path)
    with pytest.raises(mha.ArgumentError, match="add_zero_attn='no'"):
        mha.Layer.load(path, add_zero_attn="no")
    assert mha.Layer.load(path, add_zero_attn=0).config["add_zero_attn"] == 0


# ------------------------------------------------------------ output layout

def test_sequence_first_output_is_contiguous_like_torchs():
    t = randomize(torch.nn.MultiheadAttention(E, H))  # batch_first=False, torch's default
    m = mha.nn.MultiheadAttention(E, H)
    m.load_state_dict(t.state_dict())
    x = data((T, B, E))
    want, _ = t(x, x, x)
    got, _ = m(x, x, x)
    assert want.is_contiguous() and got.is_contiguous()
    assert torch.allclose(got.view(T * B, E), want.view(T * B, E), atol=1e-5)  # a common reshape


def test_path_or_prefix_with_a_nul_is_refused_not_cut_short(tmp_path):
    short = tmp_path / "layer"
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ArgumentError, match="NUL"):
        layer.save(str(short) + "\0.safetensors")
    assert not short.exists(), "the C string ended at the NUL: another file was written"
    path = str(tmp_path / "ok.safetensors")
    layer.save(path)
    with pytest.raises(mha.ArgumentError, match="NUL"):
        mha.Layer.load(path + "\0x")
    with pytest.raises(mha.ArgumentError, match="NUL"):
        mha.Layer.load(path, prefix="layers.0\0.self_attn")


def test_config_field_cannot_be_shadowed_by_an_attribute():
    layer = mha.Layer(E, H)
    with pytest.raises(AttributeError, match="add_zero_attn is part of the layer's config"):
        layer.add_zero_attn = True  # on a torch module this would change the forward
    assert layer.add_zero_attn == 0
    layer.batch_first = True  # torch_forward's layout: an attribute of the binding, allowed
    assert layer.batch_first is True


def test_dropout_set_after_construction_counts_in_training_like_in_the_constructor():
    _, m = pair()
    x = data()
    with torch.no_grad():
        y_plain = m(x, x, x)[0]
        m.dropout = 0.1  # torch's module applies it in training, read at each forward
        assert not torch.allclose(m(x, x, x)[0], y_plain)
        m.eval()  # torch applies no dropout in eval
        assert torch.equal(m(x, x, x)[0], y_plain)
        m.train()
        m.dropout = 1.5
        with pytest.raises(ValueError, match="dropout=1.5"):
            m(x, x, x)


def test_head_attribution_dz_is_a_flag():
    layer = mha.Layer(E, H)
    x = data().numpy()
    with pytest.raises(mha.ArgumentError, match="dz='no'"):
        mha.nn.head_attribution(layer, x, x, dz="no")
    assert mha.nn.head_attribution(layer, x, x, dz=0).shape == (H, B, T)


# ---------------------------------------------------------------- messages

def test_library_message_is_not_prefixed_twice_with_its_function():
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ShapeError) as err:
        layer.forward(np.zeros((0, T, E), dtype=np.float32))
    assert str(err.value).startswith("mha_forward: B=0 T=5 S=5; expected all >= 1"), str(err.value)


def test_positions_tensor_off_the_cpu_is_named():
    layer = mha.Layer(E, H, rope={"pairing": "halves"})
    x = np.zeros((1, 3, E), dtype=np.float32)
    assert layer.forward(x, positions=torch.tensor([[0, 1, 2]])).shape == (1, 3, E)
    with pytest.raises(mha.ArgumentError, match="positions is a tensor on device 'meta'"):
        layer.forward(x, positions=torch.zeros(1, 3, dtype=torch.int64, device="meta"))


@pytest.mark.parametrize("spec", [5, 0.5, True, object(), "zero"], ids=["int", "float", "bool", "object", "str"])
def test_interventions_that_are_not_a_list_or_dict_are_an_argument_error(spec):
    layer = mha.Layer(E, H)
    with pytest.raises(mha.ArgumentError, match="expected a list of h=4 ops or a dict"):
        layer.forward(data().numpy(), interventions=spec)


def test_functional_call_weights_that_require_grad_keep_the_input_copy():
    """The module's own parameters frozen, the weights passed through
    functional_call (fast weights, meta-learning): autograd still records
    the call, so the inputs must be copied for the backward."""
    from torch.nn.utils.stateless import functional_call
    t, m = pair()
    for mod in (t, m):
        for p in mod.parameters():
            p.requires_grad_(False)
    fast = {n: p.detach().clone().requires_grad_() for n, p in t.named_parameters()}
    grads = []
    for mod in (t, m):
        x = data()
        y, _ = functional_call(mod, fast, (x, x, x), {"need_weights": False})
        x.mul_(5.0)  # refilled before backward
        grads.append(torch.autograd.grad(y.sum(), fast["in_proj_weight"])[0])
    assert torch.allclose(grads[1], grads[0], atol=1e-4)
