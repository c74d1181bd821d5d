"""Tests for attention.layers.alignment: soft, hard, local and multi-dimensional
alignment."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attention import LocalAlignment, hard_attention
from attention.layers.alignment import (
    hard_alignment,
    local_alignment,
    local_centre,
    local_window,
    soft_alignment,
    soft_attention,
)

D64 = torch.float64


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D64)


# ---------------------------------------------------------------- soft


def test_soft_alignment_is_softmax_over_keys():
    s = randn(2, 3, 5)
    torch.testing.assert_close(soft_alignment(s), torch.softmax(s, dim=-1))


def test_soft_alignment_masked_exactly_zero_and_dead_row_zero():
    s = randn(2, 3, 4)
    mask = torch.tensor(
        [
            [True, False, True, True],
            [False, False, False, False],
            [True, True, True, False],
        ]
    )  # (i, j), broadcast over b
    w = soft_alignment(s, attn_mask=mask)
    assert torch.equal(w[:, ~mask], torch.zeros_like(w[:, ~mask]))
    assert torch.equal(w[:, 1], torch.zeros(2, 4, dtype=D64))
    torch.testing.assert_close(w[:, [0, 2]].sum(-1), torch.ones(2, 2, dtype=D64))
    expected = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(
        0.0
    )
    torch.testing.assert_close(w, expected)


def test_soft_attention_is_weighted_sum():
    s, v = randn(2, 3, 5), randn(2, 5, 4, seed=1)
    context, weights = soft_attention(s, v)
    torch.testing.assert_close(context, torch.einsum("bij,bje->bie", weights, v))


def test_soft_alignment_rejects_bad_mask():
    with pytest.raises(
        ValueError,
        match=r"does not broadcast to the \(\.\.\., i, j\) scores of shape \(3, 5\)",
    ):
        soft_alignment(randn(3, 5), attn_mask=torch.ones(3, 4, dtype=torch.bool))


# ---------------------------------------------------------------- hard


def test_hard_alignment_is_reproducible_with_a_generator():
    w = soft_alignment(randn(2, 3, 6))
    a = hard_alignment(w, generator=torch.Generator().manual_seed(7), num_samples=20)
    b = hard_alignment(w, generator=torch.Generator().manual_seed(7), num_samples=20)
    assert torch.equal(a, b) and a.shape == (20, 2, 3)
    assert ((a >= 0) & (a < 6)).all()


def test_hard_alignment_never_picks_a_zero_weight_key():
    w = soft_alignment(
        randn(4, 6), attn_mask=torch.tensor([True, False, True, False, False, True])
    )
    idx = hard_alignment(w, generator=torch.Generator().manual_seed(0), num_samples=500)
    assert set(idx.unique().tolist()) <= {0, 2, 5}


def test_hard_attention_output_is_one_value_vector():
    w, v = soft_alignment(randn(2, 3, 6)), randn(2, 6, 4, seed=1)
    context, idx = hard_attention(w, v, generator=torch.Generator().manual_seed(0))
    assert context.shape == (2, 3, 4) and idx.shape == (2, 3)
    for b in range(2):
        for i in range(3):
            assert torch.equal(context[b, i], v[b, idx[b, i]])


def test_hard_attention_expectation_is_soft_attention():
    """Monte-Carlo mean of n draws = soft context, within 5 standard errors."""
    w, v = soft_alignment(randn(2, 3, 6)), randn(2, 6, 4, seed=1)
    n = 20_000
    contexts, _ = hard_attention(
        w, v, generator=torch.Generator().manual_seed(0), num_samples=n
    )
    soft = w @ v
    # per-coordinate variance of one draw: sum_j w_ij (v_jc - soft_ic)^2
    var = torch.einsum(
        "bij,bijc->bic", w, (v[:, None, :, :] - soft[:, :, None, :]) ** 2
    )
    assert ((contexts.mean(0) - soft).abs() <= 5 * (var / n).sqrt() + 1e-12).all()
    # and the sample variance matches the formula
    torch.testing.assert_close(contexts.var(0), var, rtol=0.1, atol=1e-3)


def test_hard_attention_dead_row_gives_index_minus_one_and_zero_context():
    w = soft_alignment(
        randn(2, 3),
        attn_mask=torch.tensor([[True, True, False], [False, False, False]]),
    )
    context, idx = hard_attention(
        w, randn(3, 4), generator=torch.Generator().manual_seed(0)
    )
    assert idx[1].item() == -1 and torch.equal(context[1], torch.zeros(4, dtype=D64))


def test_hard_alignment_rejects_negative_weights():
    with pytest.raises(ValueError, match=r"weights must be finite and >= 0"):
        hard_alignment(torch.tensor([[0.5, -0.1, 0.6]]))


# ---------------------------------------------------------------- local


def test_local_centre_formula():
    q, w_p, v_p = randn(2, 3, 4), randn(5, 4, seed=1), randn(5, seed=2)
    expected = 10 * torch.sigmoid(
        torch.einsum("h,bih->bi", v_p, torch.tanh(torch.einsum("hd,bid->bih", w_p, q)))
    )
    p = local_centre(q, w_p, v_p, 10)
    torch.testing.assert_close(p, expected)
    assert ((p > 0) & (p < 10)).all()


@given(centre=st.floats(0.0, 12.0), d=st.floats(0.0, 5.0))
def test_local_alignment_is_exactly_zero_outside_the_window(centre, d):
    s = randn(1, 12)
    p = torch.tensor([centre], dtype=D64)
    w = local_alignment(s, p, d)
    pos = torch.arange(12, dtype=D64)
    outside = (pos - centre).abs() > d
    assert torch.equal(w[0, outside], torch.zeros(int(outside.sum()), dtype=D64))
    assert w.sum() <= 1 + 1e-12


def test_local_alignment_matches_formula():
    s, p, d = randn(2, 9), torch.tensor([3.3, 6.0], dtype=D64), 2.0
    pos = torch.arange(9, dtype=D64)
    inside = (pos - p[:, None]).abs() <= d
    soft = torch.softmax(s.masked_fill(~inside, float("-inf")), dim=-1)
    expected = soft * torch.exp(-((pos - p[:, None]) ** 2) / (2 * (d / 2) ** 2))
    torch.testing.assert_close(local_alignment(s, p, d), expected)
    assert torch.equal(local_window(p, 9, d), inside)


def test_local_alignment_respects_mask_and_sigma_zero_means_no_damping():
    s, p = randn(1, 9), torch.tensor([4.0], dtype=D64)
    mask = torch.ones(1, 9, dtype=torch.bool)
    mask[0, 5] = False
    w = local_alignment(s, p, 2, sigma=0.0, attn_mask=mask)
    assert w[0, 5] == 0 and (w[0, :2] == 0).all() and (w[0, 7:] == 0).all()
    torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=D64))


def test_local_alignment_module_shapes_and_gradient_to_predictor():
    align = LocalAlignment(4, 6, half_width=2.0).to(D64)
    q, s, v = randn(2, 3, 4), randn(2, 3, 10, seed=1), randn(2, 10, 5, seed=2)
    context, weights = align(q, s, v)
    centre = align.centre(q, 10)
    assert (
        context.shape == (2, 3, 5)
        and weights.shape == (2, 3, 10)
        and centre.shape == (2, 3)
    )
    torch.testing.assert_close(weights, local_alignment(s, centre, 2.0))
    torch.testing.assert_close(context, weights @ v)
    assert set(n for n, _ in align.named_parameters()) == {"w_p", "v_p"}
    weights.sum().backward()
    assert align.w_p.grad.abs().sum() > 0  # the Gaussian factor carries a gradient to p


def test_gradcheck_local_alignment():
    s = randn(2, 8).requires_grad_(True)
    p = torch.tensor([2.7, 5.2], dtype=D64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, p: local_alignment(s, p, 2.5), (s, p))


def test_negative_half_width_is_rejected():
    msg = r"half_width D must be >= 0, got -1"
    with pytest.raises(ValueError, match=msg):
        local_alignment(randn(1, 5), torch.tensor([2.0], dtype=D64), -1)
    with pytest.raises(ValueError, match=msg):
        LocalAlignment(4, 6, half_width=-1)
    with pytest.raises(ValueError, match=msg):
        local_window(torch.tensor([2.0]), 5, -1)


def test_local_alignment_rejects_wrong_centre_shape():
    with pytest.raises(
        ValueError,
        match=r"centre must hold one position per query, shape scores.shape\[:-1\] = "
        r"\(2,\), got \(3,\)",
    ):
        local_alignment(randn(2, 5), torch.zeros(3, dtype=D64), 1.0)


# ---------------------------------------------------------------- multi-dimensional


def test_local_alignment_entropy_sanity():
    """A wide window with tiny sigma concentrates the weight near p (a sharp prior)."""
    s = torch.zeros(1, 21, dtype=D64)
    w = local_alignment(s, torch.tensor([10.0], dtype=D64), 10, sigma=0.5)
    assert w.argmax().item() == 10 and math.isclose(w[0, 10].item(), 1 / 21)


# ---------------------------------------------------------------- edge and bad input


def test_hard_alignment_with_no_keys_gives_minus_one_and_zero_context():
    idx = hard_alignment(torch.zeros(2, 3, 0, dtype=D64))
    assert idx.shape == (2, 3) and (idx == -1).all()
    context, idx = hard_attention(
        torch.zeros(3, 0, dtype=D64), torch.zeros(0, 4, dtype=D64), num_samples=2
    )
    assert context.shape == (2, 3, 4) and (context == 0).all()


def test_local_alignment_ignores_a_nan_outside_the_window():
    s = randn(1, 12)
    s[0, 11] = float("nan")  # far outside the window around 3
    w = local_alignment(s, torch.tensor([3.0], dtype=D64), 2.0)
    assert not w.isnan().any()
    s[0, 3] = float("nan")  # inside the window: the row is NaN, as a softmax over it is
    assert local_alignment(s, torch.tensor([3.0], dtype=D64), 2.0).isnan().all()


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda: hard_alignment(torch.ones(2, 3), generator=0),
            TypeError,
            "generator must be a torch.Generator or None, got int",
        ),
        (
            lambda: hard_alignment(torch.ones(2, 3), num_samples=0),
            ValueError,
            "num_samples must be >= 1, got 0",
        ),
        (
            lambda: soft_attention(randn(2, 3), randn(3, 4).to("meta")),
            ValueError,
            "value and weights must be on the same device, got meta and cpu",
        ),
        (
            lambda: soft_attention(randn(2, 2, 3), randn(3, 3, 4)),
            ValueError,
            r"batch dims of weights and value must broadcast",
        ),
        (
            lambda: local_alignment(randn(2, 5), torch.zeros(2), 1.0),
            TypeError,
            r"centre must have the dtype of scores \(torch.float64\)",
        ),
        (
            lambda: local_alignment(
                randn(2, 5), torch.zeros(2, dtype=D64), 1.0, sigma="1"
            ),
            TypeError,
            "sigma must be a float",
        ),
        (
            lambda: LocalAlignment(4, 6, 2.0, sigma=-1.0),
            ValueError,
            "sigma must be >= 0, got -1.0",
        ),
        (
            lambda: local_centre(randn(2, 4), torch.zeros(3, 4), torch.zeros(3), 5),
            TypeError,
            r"the dtype of w_p|v_p",
        ),
    ],
)
def test_bad_input_classes(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
