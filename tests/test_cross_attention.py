"""Tests of attention/layers/cross_attention.py against the manual formulas and torch's
SDPA."""

import math

import pytest
import torch
import torch.nn.functional as F

from attention import CrossAttention, SelfAttention, padding_mask

DT = torch.float64


def make(d_q_in=16, d_kv_in=12, d_kq=24, d_v=28, *, bias=False, seed=0):
    torch.manual_seed(seed)
    return CrossAttention(d_q_in, d_kv_in, d_kq, d_v, bias=bias).to(DT)


def manual(m, xq, xc, mask=None):
    q = xq @ m.w_query.weight.T
    k = xc @ m.w_key.weight.T
    v = xc @ m.w_value.weight.T
    if m.w_query.bias is not None:
        q, k, v = q + m.w_query.bias, k + m.w_key.bias, v + m.w_value.bias
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ v, w


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_matches_manual_formula_with_different_lengths(batch, bias):
    m = make(bias=bias)
    xq, xc = torch.randn(*batch, 6, 16, dtype=DT), torch.randn(*batch, 8, 12, dtype=DT)
    out, w = m(xq, xc, need_weights=True)
    assert out.shape == (*batch, 6, 28) and w.shape == (*batch, 6, 8)
    ref_out, ref_w = manual(m, xq, xc)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)


def test_matches_torch_sdpa():
    m = make()
    xq, xc = torch.randn(2, 6, 16, dtype=DT), torch.randn(2, 8, 12, dtype=DT)
    ref = F.scaled_dot_product_attention(m.w_query(xq), m.w_key(xc), m.w_value(xc))
    torch.testing.assert_close(m(xq, xc)[0], ref)


def test_context_broadcasts_over_query_batch():
    m = make()
    xq, xc = torch.randn(4, 6, 16, dtype=DT), torch.randn(8, 12, dtype=DT)
    out, _ = m(xq, xc)
    assert out.shape == (4, 6, 28)
    torch.testing.assert_close(out[2], m(xq[2], xc)[0])


def test_same_input_is_self_attention():
    torch.manual_seed(0)
    sa = SelfAttention(16, 24, 28).to(DT)
    ca = CrossAttention(16, 16, 24, 28).to(DT)
    ca.load_state_dict(sa.state_dict())  # same parameter names and shapes
    x = torch.randn(2, 6, 16, dtype=DT)
    a, wa = ca(x, x, need_weights=True)
    b, wb = sa(x, need_weights=True)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(wa, wb)


def test_padding_mask_of_the_context():
    m = make()
    xq, xc = torch.randn(2, 6, 16, dtype=DT), torch.randn(2, 8, 12, dtype=DT)
    mask = padding_mask([5, 8], 8)[:, 0]  # (b, 1, j)
    out, w = m(xq, xc, attn_mask=mask, need_weights=True)
    assert (w[0, :, 5:] == 0).all() and (w[1] > 0).all()
    ref_out, ref_w = manual(m, xq, xc, mask)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    ref = F.scaled_dot_product_attention(
        m.w_query(xq), m.w_key(xc), m.w_value(xc), attn_mask=mask
    )
    torch.testing.assert_close(out, ref)


def test_query_positions_are_independent():
    """Each query row attends on its own: dropping a query does not change the
    others."""
    m = make()
    xq, xc = torch.randn(6, 16, dtype=DT), torch.randn(8, 12, dtype=DT)
    torch.testing.assert_close(m(xq[:4], xc)[0], m(xq, xc)[0][:4])


def test_context_order_does_not_matter():
    m = make()
    xq, xc = torch.randn(6, 16, dtype=DT), torch.randn(8, 12, dtype=DT)
    p = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    out, w = m(xq, xc, need_weights=True)
    out_p, w_p = m(xq, xc[p], need_weights=True)
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(w_p, w[:, p])


def test_parameter_shapes():
    m = CrossAttention(16, 12, 24, 28)
    shapes = {name: tuple(p.shape) for name, p in m.named_parameters()}
    assert shapes == {
        "w_query.weight": (24, 16),
        "w_key.weight": (24, 12),
        "w_value.weight": (28, 12),
    }


def test_wrong_query_features():
    with pytest.raises(
        ValueError,
        match="x_query must have d_q_in=16 features in its last dimension, got 12",
    ):
        make()(torch.randn(6, 12, dtype=DT), torch.randn(8, 12, dtype=DT))


def test_wrong_context_features():
    with pytest.raises(
        ValueError,
        match="x_context must have d_kv_in=12 features in its last dimension, got 16",
    ):
        make()(torch.randn(6, 16, dtype=DT), torch.randn(8, 16, dtype=DT))


def test_wrong_dtype():
    with pytest.raises(
        TypeError,
        match=r"x_context must have the dtype of the module\'s parameters "
        r"\(torch.float64\)",
    ):
        make()(torch.randn(6, 16, dtype=DT), torch.randn(8, 12))


def test_batches_that_do_not_broadcast():
    with pytest.raises(ValueError, match="batch dims of the two inputs must broadcast"):
        make()(torch.randn(2, 6, 16, dtype=DT), torch.randn(3, 8, 12, dtype=DT))


def test_mask_of_the_wrong_length():
    with pytest.raises(ValueError, match="does not broadcast"):
        make()(
            torch.randn(6, 16, dtype=DT),
            torch.randn(8, 12, dtype=DT),
            attn_mask=torch.ones(6, 6, dtype=torch.bool),
        )


def test_bad_size():
    with pytest.raises(ValueError, match="d_kv_in must be >= 1, got 0"):
        CrossAttention(4, 0, 4, 4)


def test_empty_context_gives_zeros_as_torch():
    m = CrossAttention(16, 12, 24, 28).to(torch.float64)
    out, w = m(
        torch.randn(3, 16, dtype=torch.float64),
        torch.randn(0, 12, dtype=torch.float64),
        need_weights=True,
    )
    assert torch.equal(out, torch.zeros(3, 28, dtype=torch.float64)) and w.shape == (
        3,
        0,
    )


def test_need_weights_must_be_a_bool_and_options_keyword_only():
    m = CrossAttention(16, 12, 24, 28)
    with pytest.raises(TypeError, match="need_weights must be a bool"):
        m(torch.randn(3, 16), torch.randn(4, 12), need_weights="no")
    with pytest.raises(TypeError, match="positional argument"):
        m(torch.randn(3, 16), torch.randn(4, 12), torch.ones(3, 4, dtype=torch.bool))
