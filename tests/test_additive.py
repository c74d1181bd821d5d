"""Tests for attention.layers.additive: Bahdanau's AdditiveAttention and the
multi-dimensional (feature-wise) attention, against manual formulas, einsum and
autograd; bad input."""

import pytest
import torch

from attention import AdditiveAttention, MultiDimensionalAttention
from attention.layers.additive import (
    multidimensional_attention,
    multidimensional_scores,
    multidimensional_weights,
)
from attention.layers.alignment import soft_alignment

D64 = torch.float64


def qk(b=2, i=3, j=5, d_q=4, d_k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, i, d_q, generator=g, dtype=D64),
        torch.randn(b, j, d_k, generator=g, dtype=D64),
    )


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D64)


# ---------------------------------------------------------------- AdditiveAttention


def test_gradcheck_additive_attention():
    attn = AdditiveAttention(3, 5, 2, d_hidden=4).to(D64)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, generator=g, dtype=D64, requires_grad=True)
    k = torch.randn(2, 4, 5, generator=g, dtype=D64, requires_grad=True)
    v = torch.randn(2, 4, 2, generator=g, dtype=D64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True], [True, False, False, False]])
    names = [n for n, _ in attn.named_parameters()]

    def f(q, k, v, *ps):
        return torch.func.functional_call(
            attn, dict(zip(names, ps)), (q, k, v), {"attn_mask": mask}
        )

    ps = tuple(p.detach().clone().requires_grad_(True) for p in attn.parameters())
    assert torch.autograd.gradcheck(f, (q, k, v, *ps))


def test_additive_attention_matches_manual_softmax():
    attn = AdditiveAttention(3, 5, 2, d_hidden=4).to(D64)
    q, k = qk(d_q=3, d_k=5, i=3, j=4)
    v = torch.randn(2, 4, 2, dtype=D64)
    context, weights = attn(q, k, v)
    expected_w = torch.softmax(attn.score(q, k), dim=-1)
    torch.testing.assert_close(weights, expected_w)
    torch.testing.assert_close(context, torch.einsum("bij,bje->bie", expected_w, v))


def test_additive_attention_single_and_sequence_shapes():
    attn = AdditiveAttention(3, 5, 7, d_hidden=4)
    k, v = torch.randn(2, 6, 5), torch.randn(2, 6, 7)
    c1, w1 = attn(torch.randn(2, 3), k, v)
    assert c1.shape == (2, 7) and w1.shape == (2, 6)
    c2, w2 = attn(torch.randn(2, 4, 3), k, v)
    assert c2.shape == (2, 4, 7) and w2.shape == (2, 4, 6)
    q = torch.randn(2, 3)  # a single query equals a sequence of length one
    torch.testing.assert_close(attn(q, k, v)[0], attn(q[:, None], k, v)[0][:, 0])


def test_additive_attention_values_default_to_keys():
    attn = AdditiveAttention(3, 5, d_hidden=4)
    k = torch.randn(2, 6, 5)
    context, weights = attn(torch.randn(2, 3), k)
    torch.testing.assert_close(context, torch.einsum("bj,bje->be", weights, k))


def test_additive_attention_masks():
    attn = AdditiveAttention(3, 5, 2, d_hidden=4)
    k, v = torch.randn(2, 4, 5), torch.randn(2, 4, 2)
    mask = torch.tensor([[True, False, True, False], [False, False, False, False]])
    context, weights = attn(torch.randn(2, 3), k, v, attn_mask=mask)
    assert torch.equal(weights[~mask], torch.zeros(int((~mask).sum())))
    torch.testing.assert_close(weights[0].sum(), torch.tensor(1.0))
    assert torch.equal(weights[1], torch.zeros(4)) and torch.equal(
        context[1], torch.zeros(2)
    )
    seq_mask = mask[:, None, :].expand(2, 3, 4)
    _, w_seq = attn(torch.randn(2, 3, 3), k, v, attn_mask=seq_mask)
    assert (w_seq[~seq_mask] == 0).all() and (w_seq[1] == 0).all()


def test_additive_attention_fully_masked_row_has_finite_gradient():
    attn = AdditiveAttention(3, 5, 2, d_hidden=4)
    q = torch.randn(1, 3, requires_grad=True)
    context, _ = attn(
        q,
        torch.randn(1, 4, 5),
        torch.randn(1, 4, 2),
        attn_mask=torch.zeros(1, 4, dtype=torch.bool),
    )
    context.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_additive_attention_rejects_wrong_key_size():
    with pytest.raises(ValueError, match=r"key must have d_k = 5 features"):
        AdditiveAttention(3, 5, d_hidden=4)(torch.randn(2, 3), torch.randn(2, 6, 4))


def test_additive_attention_rejects_wrong_value_size():
    with pytest.raises(
        ValueError,
        match=r"value must have d_v = 7 features \(its last dimension\), got 2",
    ):
        AdditiveAttention(3, 5, 7, 4)(
            torch.randn(2, 3), torch.randn(2, 6, 5), torch.randn(2, 6, 2)
        )


def test_additive_attention_rejects_key_value_length_mismatch():
    with pytest.raises(
        ValueError, match=r"value must have one row per key position: j = 6, got 5 rows"
    ):
        AdditiveAttention(3, 5, d_hidden=4)(
            torch.randn(2, 3), torch.randn(2, 6, 5), torch.randn(2, 5, 2)
        )


def test_additive_attention_rejects_bad_mask_shape():
    with pytest.raises(ValueError, match=r"does not broadcast"):
        AdditiveAttention(3, 5, d_hidden=4)(
            torch.randn(2, 3),
            torch.randn(2, 6, 5),
            attn_mask=torch.ones(2, 5, dtype=torch.bool),
        )


def test_additive_attention_propagates_nan_from_a_key():
    attn = AdditiveAttention(3, 5, 2, d_hidden=4)
    k = torch.randn(2, 4, 5)
    k[0, 1, 0] = float("nan")
    context, weights = attn(torch.randn(2, 3), k, torch.randn(2, 4, 2))
    assert context[0].isnan().all() and not context[1].isnan().any()


# ---------------------------------------------------------------- multi-dimensional


def test_multidimensional_weights_sum_to_one_over_keys_for_every_feature():
    s = randn(2, 3, 5, 7)
    w = multidimensional_weights(s)
    torch.testing.assert_close(w.sum(dim=-2), torch.ones(2, 3, 7, dtype=D64))
    torch.testing.assert_close(w, torch.softmax(s, dim=-2))


def test_multidimensional_masks():
    s = randn(2, 3, 4, 6)
    mask = torch.tensor([True, False, True, True])  # broadcasts to (b, i, j)
    w = multidimensional_weights(s, attn_mask=mask)
    assert (w[:, :, 1] == 0).all()
    torch.testing.assert_close(w.sum(-2), torch.ones(2, 3, 6, dtype=D64))
    dead = multidimensional_weights(s, attn_mask=torch.zeros(4, dtype=torch.bool))
    assert torch.equal(dead, torch.zeros_like(dead))


def test_multidimensional_scores_and_context_match_einsum():
    q, k, v = randn(2, 3, 4), randn(2, 5, 6, seed=1), randn(2, 5, 7, seed=2)
    w1, w2, b, wo, bo = (
        randn(8, 4, seed=3),
        randn(8, 6, seed=4),
        randn(8, seed=5),
        randn(7, 8, seed=6),
        randn(7, seed=7),
    )
    hidden = torch.tanh(
        torch.einsum("hd,bid->bih", w1, q)[:, :, None]
        + torch.einsum("hd,bjd->bjh", w2, k)[:, None]
        + b
    )
    expected_s = torch.einsum("fh,bijh->bijf", wo, hidden) + bo
    s = multidimensional_scores(q, k, w1, w2, wo, b, bo)
    torch.testing.assert_close(s, expected_s)
    w = multidimensional_weights(s)
    torch.testing.assert_close(
        multidimensional_attention(w, v), torch.einsum("bijf,bjf->bif", w, v)
    )


def test_multidimensional_with_equal_feature_scores_is_single_dimensional():
    s1 = randn(2, 3, 5)
    w = multidimensional_weights(s1[..., None].expand(-1, -1, -1, 4))
    torch.testing.assert_close(w, soft_alignment(s1)[..., None].expand(-1, -1, -1, 4))


def test_multidimensional_attention_module_shapes_and_gradcheck():
    attn = MultiDimensionalAttention(3, 5, 4, 6).to(D64)
    k, v = randn(2, 7, 5), randn(2, 7, 4, seed=1)
    c1, w1 = attn(randn(2, 3, seed=2), k, v)
    assert c1.shape == (2, 4) and w1.shape == (2, 7, 4)
    c2, w2 = attn(randn(2, 6, 3, seed=2), k, v)
    assert c2.shape == (2, 6, 4) and w2.shape == (2, 6, 7, 4)
    mask = torch.tensor([[True] * 7, [True, True, False, False, False, False, False]])
    _, wm = attn(randn(2, 3, seed=2), k, v, attn_mask=mask)
    assert (wm[1, 2:] == 0).all()

    names = [n for n, _ in attn.named_parameters()]
    q = randn(1, 2, 3, seed=3).requires_grad_(True)
    kk = k[:1, :3].clone().requires_grad_(True)
    vv = v[:1, :3].clone().requires_grad_(True)
    ps = tuple(p.detach().clone().requires_grad_(True) for p in attn.parameters())
    assert torch.autograd.gradcheck(
        lambda q, k, v, *ps: torch.func.functional_call(
            attn, dict(zip(names, ps)), (q, k, v)
        ),
        (q, kk, vv, *ps),
    )


def test_multidimensional_attention_rejects_wrong_value_size():
    with pytest.raises(
        ValueError,
        match=r"value must have d_v = 4 features \(its last dimension\), got 3",
    ):
        MultiDimensionalAttention(3, 5, 4, 6)(
            torch.randn(2, 3), torch.randn(2, 7, 5), torch.randn(2, 7, 3)
        )


def test_multidimensional_attention_rejects_values_of_another_dtype():
    with pytest.raises(TypeError, match="value must have the dtype of weights"):
        multidimensional_attention(randn(1, 2, 3, 4), randn(3, 4).float())
