"""Tests of attention/layers/self_attention.py against the manual formulas and torch's
SDPA."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attention import SelfAttention, causal_mask, padding_mask

DT = torch.float64


def make(d_in=16, d_kq=24, d_v=28, *, bias=False, seed=0):
    torch.manual_seed(seed)
    return SelfAttention(d_in, d_kq, d_v, bias=bias).to(DT)


def manual(module, x, mask=None):
    """softmax(Q K^T / sqrt(d) + mask) V with the projections written out as W x."""
    wq, wk, wv = module.w_query.weight, module.w_key.weight, module.w_value.weight
    q, k, v = x @ wq.T, x @ wk.T, x @ wv.T
    if module.w_query.bias is not None:
        q, k, v = (
            q + module.w_query.bias,
            k + module.w_key.bias,
            v + module.w_value.bias,
        )
    scores = q @ k.transpose(-2, -1) / math.sqrt(wq.shape[0])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ v, w


def test_walkthrough_values():
    """Raschka's walk-through: the module reproduces omega_2 and the weights of token
    2."""
    sentence = "Life is short, eat dessert first".replace(",", "").split()
    vocab = {s: i for i, s in enumerate(sorted(sentence))}
    torch.manual_seed(123)
    x = torch.nn.Embedding(6, 16)(torch.tensor([vocab[s] for s in sentence])).detach()
    torch.manual_seed(123)
    w_q, w_k, w_v = torch.rand(24, 16), torch.rand(24, 16), torch.rand(28, 16)
    attn = SelfAttention(16, 24, 28)
    with torch.no_grad():
        for layer, w in ((attn.w_query, w_q), (attn.w_key, w_k), (attn.w_value, w_v)):
            layer.weight.copy_(w)
        out, weights = attn(x, need_weights=True)
    expected = torch.tensor([0.2912, 0.0106, 0.0982, 0.0625, 0.4917, 0.0458])
    torch.testing.assert_close(weights[1], expected, atol=1e-4, rtol=0)
    omega_2 = (w_q @ x[1]) @ (w_k @ x.T)
    torch.testing.assert_close(omega_2[4], torch.tensor(11.1466), atol=1e-4, rtol=0)
    torch.testing.assert_close(out[1], weights[1] @ (x @ w_v.T))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(6, 16), (3, 6, 16), (2, 3, 5, 16)])
def test_matches_manual_formula(shape, bias):
    attn = make(bias=bias)
    x = torch.randn(shape, dtype=DT)
    out, w = attn(x, need_weights=True)
    ref_out, ref_w = manual(attn, x)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    assert out.shape == (*shape[:-1], 28)
    assert w.shape == (*shape[:-1], shape[-2])


@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_torch_sdpa(is_causal):
    attn = make()
    x = torch.randn(2, 7, 16, dtype=DT)
    q, k, v = attn.w_query(x), attn.w_key(x), attn.w_value(x)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(attn(x, is_causal=is_causal)[0], ref)


def test_need_weights_does_not_change_output():
    attn = make()
    x = torch.randn(2, 5, 16, dtype=DT)
    out, _ = attn(x, need_weights=True)
    torch.testing.assert_close(attn(x)[0], out)
    assert attn(x)[1] is None


def test_weights_rows_are_convex_combinations():
    attn = make()
    x = torch.randn(4, 9, 16, dtype=DT)
    out, w = attn(x, need_weights=True)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 9, dtype=DT))
    torch.testing.assert_close(out, w @ attn.w_value(x))


def test_causal_equals_causal_mask():
    attn = make()
    x = torch.randn(2, 6, 16, dtype=DT)
    a, wa = attn(x, is_causal=True, need_weights=True)
    b, wb = attn(x, attn_mask=causal_mask(6), need_weights=True)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(wa, wb)
    assert (wa.triu(1) == 0).all()


def test_padding_mask_blocks_padded_keys():
    attn = make()
    x = torch.randn(2, 5, 16, dtype=DT)
    mask = padding_mask([3, 5], 5)[:, 0]  # (b, 1, j) for single-head (b, i, j) scores
    out, w = attn(x, attn_mask=mask, need_weights=True)
    assert (w[0, :, 3:] == 0).all()
    ref_out, ref_w = manual(attn, x, mask)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    # the padded tokens' features do not reach the real ones
    x2 = x.clone()
    x2[0, 3:] = 100.0
    torch.testing.assert_close(attn(x2, attn_mask=mask)[0][0, :3], out[0, :3])
    ref = F.scaled_dot_product_attention(
        attn.w_query(x), attn.w_key(x), attn.w_value(x), attn_mask=mask
    )
    torch.testing.assert_close(out, ref)


def test_float_mask_is_added():
    attn = make()
    x = torch.randn(5, 16, dtype=DT)
    bias = torch.randn(5, 5, dtype=DT)
    q, k, v = attn.w_query(x), attn.w_key(x), attn.w_value(x)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(attn(x, attn_mask=bias)[0], ref)


@given(st.permutations(range(6)))
def test_permutation_equivariance(perm):
    attn = make()
    x = torch.randn(6, 16, dtype=DT, generator=torch.Generator().manual_seed(1))
    p = torch.tensor(perm)
    torch.testing.assert_close(attn(x[p])[0], attn(x)[0][p])


def test_gradients_flow_to_all_projections():
    attn = make()
    attn(torch.randn(3, 16, dtype=DT))[0].sum().backward()
    for layer in (attn.w_query, attn.w_key, attn.w_value):
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_parameter_names_and_shapes():
    attn = SelfAttention(16, 24, 28)
    shapes = {name: tuple(p.shape) for name, p in attn.named_parameters()}
    assert shapes == {
        "w_query.weight": (24, 16),
        "w_key.weight": (24, 16),
        "w_value.weight": (28, 16),
    }
    assert len(list(SelfAttention(4, 3, 2, bias=True).parameters())) == 6


def test_wrong_feature_size():
    with pytest.raises(
        ValueError, match="x must have d_in=16 features in its last dimension, got 24"
    ):
        make()(torch.randn(6, 24, dtype=DT))


def test_wrong_dtype():
    with pytest.raises(
        TypeError,
        match=r"x must have the dtype of the module\'s parameters \(torch.float64\), "
        r"got torch.float32",
    ):
        make()(torch.randn(6, 16))


def test_integer_input():
    with pytest.raises(TypeError, match="x must have a floating-point dtype"):
        make()(torch.ones(6, 16, dtype=torch.long))


def test_one_dimensional_input():
    with pytest.raises(ValueError, match="x must have at least 2 dimensions"):
        make()(torch.randn(16, dtype=DT))


def test_mask_and_causal_together():
    with pytest.raises(ValueError, match="pass either attn_mask or is_causal=True"):
        make()(torch.randn(6, 16, dtype=DT), attn_mask=causal_mask(6), is_causal=True)


def test_bad_mask_shape():
    with pytest.raises(ValueError, match="does not broadcast"):
        make()(
            torch.randn(6, 16, dtype=DT), attn_mask=torch.ones(5, 5, dtype=torch.bool)
        )


@pytest.mark.parametrize("arg", ["d_in", "d_out_kq", "d_out_v"])
def test_bad_sizes(arg):
    sizes = {"d_in": 4, "d_out_kq": 4, "d_out_v": 4, arg: 0}
    with pytest.raises(ValueError, match=f"{arg} must be >= 1, got 0"):
        SelfAttention(sizes["d_in"], sizes["d_out_kq"], sizes["d_out_v"])
    sizes[arg] = 2.0
    with pytest.raises(TypeError, match=f"{arg} must be an int, got float"):
        SelfAttention(sizes["d_in"], sizes["d_out_kq"], sizes["d_out_v"])


def test_always_returns_output_and_weights_or_none():
    attn = make()
    x = torch.randn(2, 5, 16, dtype=DT)
    out, w = attn(x)
    assert out.shape == (2, 5, 28) and w is None


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"need_weights": "no"}, TypeError, "need_weights must be a bool"),
        ({"is_causal": "yes"}, TypeError, "is_causal must be a bool"),
        (
            {"attn_mask": causal_mask(6, device="meta")},
            ValueError,
            "query and attn_mask must be on the same device|x and attn_mask",
        ),
    ],
)
def test_bad_flags_and_mask_device(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        make()(torch.randn(6, 16, dtype=DT), **kwargs)


def test_options_are_keyword_only():
    with pytest.raises(TypeError, match="positional argument"):
        make()(torch.randn(6, 16, dtype=DT), causal_mask(6))


def test_empty_sequence():
    out, w = make()(torch.randn(2, 0, 16, dtype=DT), need_weights=True)
    assert out.shape == (2, 0, 28) and w.shape == (2, 0, 0)
