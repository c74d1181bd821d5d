"""Tests for attention.layers.scoring: every score against its formula, gradients,
masks, bad input."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attention import AdditiveAttention, AdditiveScore, GeneralScore
from attention.layers.scoring import (
    ACTIVATIONS,
    additive_scores,
    cosine_scores,
    dot_scores,
    general_scores,
    get_activation,
    scaled_dot_scores,
)

D64 = torch.float64
ACTS = {
    "identity": lambda x: x,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def qk(b=2, i=3, j=5, d_q=4, d_k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, i, d_q, generator=g, dtype=D64),
        torch.randn(b, j, d_k, generator=g, dtype=D64),
    )


# ------------------------------------------------------------- formulas, float64 einsum


def test_dot_matches_einsum():
    q, k = qk()
    torch.testing.assert_close(dot_scores(q, k), torch.einsum("bid,bjd->bij", q, k))


@pytest.mark.parametrize("d", [1, 4, 64])
def test_scaled_dot_matches_einsum(d):
    q, k = qk(d_q=d, d_k=d)
    torch.testing.assert_close(
        scaled_dot_scores(q, k), torch.einsum("bid,bjd->bij", q, k) / math.sqrt(d)
    )
    torch.testing.assert_close(
        scaled_dot_scores(q, k, scale=0.5), 0.5 * torch.einsum("bid,bjd->bij", q, k)
    )


def test_cosine_matches_formula_and_is_bounded():
    q, k = qk()
    expected = torch.einsum("bid,bjd->bij", q, k) / (
        q.norm(dim=-1)[:, :, None] * k.norm(dim=-1)[:, None, :]
    )
    s = cosine_scores(q, k)
    torch.testing.assert_close(s, expected)
    assert (s.abs() <= 1 + 1e-12).all()


def test_cosine_of_zero_vector_is_zero_not_nan():
    s = cosine_scores(torch.zeros(1, 3, dtype=D64), torch.ones(2, 3, dtype=D64))
    assert torch.equal(s, torch.zeros(1, 2, dtype=D64))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", [None, "identity", "tanh", "relu", "sigmoid"])
def test_general_matches_einsum(bias, activation):
    q, k = qk(d_q=3, d_k=5)
    score = GeneralScore(3, 5, bias=bias, activation=activation).to(D64)
    pre = torch.einsum("bjk,kq,biq->bij", k, score.weight, q)
    if bias and activation is None:  # biased general: k^T (W q + b), b a vector
        pre = pre + torch.einsum("bjk,k->bj", k, score.bias)[:, None, :]  # k^T b
    elif bias:  # activated general: act(k^T W q + b), b a scalar
        assert score.bias.shape == ()
        pre = pre + score.bias
    expected = ACTS[activation or "identity"](pre)
    torch.testing.assert_close(score(q, k), expected)
    torch.testing.assert_close(
        general_scores(q, k, score.weight, score.bias, activation), expected
    )


def test_activated_general_adds_a_scalar_inside_the_activation():
    q, k = qk(d_q=3, d_k=5)
    w, b = torch.randn(5, 3, dtype=D64), torch.tensor(0.7, dtype=D64)
    expected = torch.tanh(torch.einsum("bjk,kq,biq->bij", k, w, q) + 0.7)
    torch.testing.assert_close(general_scores(q, k, w, b, "tanh"), expected)
    with pytest.raises(TypeError, match="query must have the dtype of bias"):
        general_scores(q, k, w, b.float(), "tanh")


def test_general_with_identity_weight_is_dot():
    q, k = qk()
    torch.testing.assert_close(
        general_scores(q, k, torch.eye(4, dtype=D64)), dot_scores(q, k)
    )


@pytest.mark.parametrize("activation", ["tanh", "relu", "sigmoid", "identity"])
def test_additive_matches_loop_formula(activation):
    q, k = qk(d_q=3, d_k=6)
    score = AdditiveScore(3, 6, 7, activation).to(D64)
    act = ACTS[activation]
    expected = torch.empty(2, 3, 5, dtype=D64)
    for b in range(2):
        for i in range(3):
            for j in range(5):
                hidden = score.w_query @ q[b, i] + score.w_key @ k[b, j] + score.bias
                expected[b, i, j] = score.v @ act(hidden)
    torch.testing.assert_close(score(q, k), expected)


def test_additive_is_concat_form():
    """v^T tanh(W1 q + W2 k + b) = v^T tanh(W [q; k] + b) with W = [W1 W2]."""
    q, k = qk(d_q=3, d_k=6)
    score = AdditiveScore(3, 6, 7).to(D64)
    w = torch.cat([score.w_query, score.w_key], dim=1)  # (h, d_q + d_k)
    pairs = torch.cat(
        [
            q[:, :, None, :].expand(-1, -1, 5, -1),
            k[:, None, :, :].expand(-1, 3, -1, -1),
        ],
        dim=-1,
    )  # (b, i, j, d_q + d_k)
    expected = torch.einsum(
        "h,bijh->bij",
        score.v,
        torch.tanh(torch.einsum("hc,bijc->bijh", w, pairs) + score.bias),
    )
    torch.testing.assert_close(score(q, k), expected)


def test_parameter_names_and_shapes():
    g = GeneralScore(3, 5, bias=True)
    assert {n: tuple(p.shape) for n, p in g.named_parameters()} == {
        "weight": (5, 3),
        "bias": (5,),
    }
    assert [n for n, _ in GeneralScore(3, 5).named_parameters()] == ["weight"]
    activated = GeneralScore(3, 5, bias=True, activation="tanh")
    assert {n: tuple(p.shape) for n, p in activated.named_parameters()} == {
        "weight": (5, 3),
        "bias": (),
    }
    a = AdditiveScore(3, 5, 8)
    assert {n: tuple(p.shape) for n, p in a.named_parameters()} == {
        "w_query": (8, 3),
        "w_key": (8, 5),
        "bias": (8,),
        "v": (8,),
    }


@given(
    i=st.integers(1, 4),
    j=st.integers(1, 4),
    d=st.integers(1, 6),
    lead=st.integers(0, 2),
)
def test_every_score_maps_to_i_by_j(i, j, d, lead):
    batch = (2,) * lead
    q, k = torch.randn(*batch, i, d), torch.randn(*batch, j, d)
    for score in (
        dot_scores,
        scaled_dot_scores,
        cosine_scores,
        GeneralScore(d, d),
        GeneralScore(d, d, bias=True, activation="tanh"),
        AdditiveScore(d, d, 3),
    ):
        assert score(q, k).shape == (*batch, i, j)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize(
    "module",
    [
        GeneralScore(3, 5),
        GeneralScore(3, 5, bias=True, activation="tanh"),
        AdditiveScore(3, 5, 4),
        AdditiveScore(3, 5, 4, "sigmoid", bias=False),
    ],
)
def test_gradcheck_learnable_scores(module):
    module = module.to(D64)
    q, k = qk(b=1, i=2, j=3, d_q=3, d_k=5)
    q.requires_grad_(True)
    k.requires_grad_(True)
    names = [n for n, _ in module.named_parameters()]

    def f(q, k, *ps):  # scores as a function of the inputs and of every parameter
        return torch.func.functional_call(module, dict(zip(names, ps)), (q, k))

    inputs = (
        q,
        k,
        *(p.detach().clone().requires_grad_(True) for p in module.parameters()),
    )
    assert torch.autograd.gradcheck(f, inputs)


# ---------------------------------------------------------------- AdditiveAttention


# ---------------------------------------------------------------- bad input


def test_unknown_activation_lists_allowed_names():
    msg = (
        r"activation must be one of 'identity', 'relu', 'sigmoid', 'tanh' or None, "
        r"got 'gelu'"
    )
    with pytest.raises(ValueError, match=msg):
        get_activation("gelu")
    with pytest.raises(ValueError, match=msg):
        GeneralScore(3, 3, activation="gelu")
    with pytest.raises(ValueError, match=msg):
        AdditiveScore(3, 3, 4, activation="gelu")
    assert sorted(ACTIVATIONS) == ["identity", "relu", "sigmoid", "tanh"]


def test_learnable_score_rejects_wrong_query_size():
    with pytest.raises(
        ValueError,
        match=r"query must have d_q = 3 features \(its last dimension\), got 4",
    ):
        GeneralScore(3, 5)(torch.randn(2, 4), torch.randn(6, 5))


def test_learnable_score_rejects_wrong_key_size():
    with pytest.raises(
        ValueError,
        match=r"key must have d_k = 5 features \(its last dimension\), got 3",
    ):
        AdditiveScore(3, 5, 8)(torch.randn(2, 3), torch.randn(6, 3))


def test_parameter_free_scores_reject_different_sizes():
    for f in (dot_scores, scaled_dot_scores, cosine_scores):
        with pytest.raises(
            ValueError,
            match=r"query and key must share their last dimension d, got 24 and 16",
        ):
            f(torch.randn(3, 24), torch.randn(4, 16))


def test_functional_additive_rejects_hidden_mismatch():
    with pytest.raises(
        ValueError,
        match=r"w_query and w_key must project to the same hidden size a, got 4 and 5",
    ):
        additive_scores(
            torch.randn(2, 3),
            torch.randn(2, 3),
            torch.randn(4, 3),
            torch.randn(5, 3),
            torch.randn(4),
        )


def test_bad_sizes_in_constructor():
    with pytest.raises(ValueError, match=r"d_hidden must be >= 1, got 0"):
        AdditiveScore(3, 5, 0)


# ------------------------------------------------------ one test per class of bad input


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda: dot_scores(torch.randn(2, 3, 4), torch.randn(3, 5, 4)),
            ValueError,
            r"batch dims of query and key must broadcast .* got \(2,\) and \(3,\)",
        ),
        (
            lambda: GeneralScore(3, 3)(
                torch.randn(2, 3, dtype=D64), torch.randn(2, 3, dtype=D64)
            ),
            TypeError,
            r"query must have the dtype of weight \(torch.float32\), got torch.float64",
        ),
        (
            lambda: AdditiveAttention(3, 3)(
                torch.randn(2, 3, dtype=D64), torch.randn(2, 4, 3, dtype=D64)
            ),
            TypeError,
            r"the dtype of the module's parameters \(torch.float32\)",
        ),
        (
            lambda: dot_scores(torch.randn(2, 3), torch.randn(2, 3, device="meta")),
            ValueError,
            "query and key must be on the same device, got cpu and meta",
        ),
        (
            lambda: scaled_dot_scores(torch.randn(2, 3), torch.randn(2, 3), scale=True),
            TypeError,
            "scale must be a float or None, got bool",
        ),
        (
            lambda: cosine_scores(torch.randn(2, 3), torch.randn(2, 3), eps=0.0),
            ValueError,
            "eps must be > 0, got 0.0",
        ),
        (lambda: get_activation(3), TypeError, "activation must be one of .* got int"),
        (lambda: GeneralScore(3, 3, bias="no"), TypeError, "bias must be a bool"),
        (
            lambda: general_scores(
                torch.randn(2, 3), torch.randn(2, 3), torch.eye(3), torch.zeros(2)
            ),
            ValueError,
            r"bias must have shape \(d_k,\) \(or a 0-d scalar\) = \(3,\), got \(2,\)",
        ),
        (
            lambda: AdditiveAttention(3, 3)(
                torch.randn(2, 3), torch.randn(2, 4, 3), torch.randn(2, 4, 2, dtype=D64)
            ),
            TypeError,
            "value must have the dtype of query",
        ),
        (
            lambda: AdditiveAttention(3, 3)(
                torch.randn(2, 3),
                torch.randn(2, 4, 3),
                attn_mask=torch.ones(2, 4, dtype=torch.bool, device="meta"),
            ),
            ValueError,
            "query and attn_mask must be on the same device",
        ),
    ],
)
def test_bad_input_classes(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_scores_with_no_keys_and_d_zero():
    assert dot_scores(torch.randn(2, 3, 4), torch.randn(2, 0, 4)).shape == (2, 3, 0)
    assert torch.equal(
        scaled_dot_scores(torch.randn(3, 0), torch.randn(2, 0)), torch.zeros(3, 2)
    )
    context, weights = AdditiveAttention(3, 5, 2, d_hidden=4)(
        torch.randn(2, 3), torch.randn(2, 0, 5), torch.randn(2, 0, 2)
    )
    assert torch.equal(context, torch.zeros(2, 2)) and weights.shape == (2, 0)
