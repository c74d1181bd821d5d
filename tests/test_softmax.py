"""Tests for attention/foundations/softmax.py against torch's built-ins and autograd."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attention import entropy, log_softmax, logsumexp, softmax
from attention.foundations.softmax import softmax_jacobian, three_pass_softmax

finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False)
rows = st.lists(finite, min_size=1, max_size=12)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_torch(dim, dtype):
    x = (
        torch.randn(4, 5, 6, dtype=dtype, generator=torch.Generator().manual_seed(0))
        * 10
    )
    torch.testing.assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim))
    torch.testing.assert_close(log_softmax(x, dim=dim), torch.log_softmax(x, dim=dim))
    torch.testing.assert_close(logsumexp(x, dim=dim), torch.logsumexp(x, dim=dim))


def test_three_pass_matches_softmax():
    x = torch.randn(3, 7, dtype=torch.float64) * 5
    torch.testing.assert_close(three_pass_softmax(x), softmax(x))


def test_finite_where_naive_exp_overflows():
    x = torch.tensor([10.0, 50.0, 100.0, 1000.0])
    naive = torch.exp(x) / torch.exp(x).sum()
    assert torch.isnan(naive).any()  # the problem being solved is real
    s = softmax(x)
    assert torch.isfinite(s).all()
    assert s[-1] == 1.0 and s[0] == 0.0
    assert torch.isfinite(log_softmax(torch.tensor([0.0, -1e4]))).all()


@given(rows)
def test_positive_and_sums_to_one(values):
    x = torch.tensor(values, dtype=torch.float64)
    s = softmax(x)
    assert torch.isfinite(s).all()
    assert (s >= 0).all()
    assert math.isclose(float(s.sum()), 1.0, rel_tol=1e-12)


@given(rows, st.floats(min_value=-1e3, max_value=1e3))
def test_shift_invariant(values, c):
    x = torch.tensor(values, dtype=torch.float64)
    torch.testing.assert_close(softmax(x + c), softmax(x), atol=1e-12, rtol=1e-9)


def test_neg_inf_gets_zero_weight_and_all_neg_inf_row_is_nan_like_torch():
    x = torch.tensor([[0.0, float("-inf"), 1.0], [float("-inf")] * 3])
    s = softmax(x)
    assert s[0, 1] == 0.0
    assert torch.isnan(s[1]).all() and torch.isnan(torch.softmax(x, -1)[1]).all()


@pytest.mark.parametrize("n", [1, 2, 5])
def test_jacobian_matches_autograd(n):
    z = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    expected = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), z)
    torch.testing.assert_close(softmax_jacobian(z), expected)


def test_jacobian_batched_entries():
    z = torch.randn(2, 3, 4, dtype=torch.float64)
    J = softmax_jacobian(z)
    s = torch.softmax(z, -1)
    assert J.shape == (2, 3, 4, 4)
    torch.testing.assert_close(torch.diagonal(J, dim1=-2, dim2=-1), s * (1 - s))
    torch.testing.assert_close(J[0, 1, 0, 2], -s[0, 1, 0] * s[0, 1, 2])
    torch.testing.assert_close(J, J.transpose(-1, -2))  # symmetric
    torch.testing.assert_close(J.sum(-1), torch.zeros(2, 3, 4, dtype=torch.float64))


def test_softmax_gradcheck():
    z = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: softmax(t, dim=-1), (z,))
    assert torch.autograd.gradcheck(lambda t: log_softmax(t, dim=0), (z,))


def test_entropy_limits():
    n = 8
    uniform = torch.full((n,), 1.0 / n, dtype=torch.float64)
    one_hot = torch.zeros(n, dtype=torch.float64)
    one_hot[3] = 1
    assert math.isclose(float(entropy(uniform)), math.log(n))
    assert float(entropy(one_hot)) == 0.0


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: softmax([1.0, 2.0]), TypeError, "x must be a torch.Tensor, got list"),
        (
            lambda: softmax(torch.tensor([1, 2])),
            TypeError,
            "floating-point dtype, got torch.int64",
        ),
        (
            lambda: softmax_jacobian(torch.tensor(1.0)),
            ValueError,
            "at least 1 dimensions",
        ),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------- edge cases, as torch

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    "row",
    [[INF, 1.0], [INF, INF], [-INF, -INF], [NAN, 1.0], [-INF, 1.0], [-INF, INF], []],
)
def test_inf_nan_and_empty_rows_as_torch(row):
    x = torch.tensor(row, dtype=torch.float64).reshape(1, len(row))
    for ours, theirs in (
        (softmax, torch.softmax),
        (log_softmax, torch.log_softmax),
        (logsumexp, torch.logsumexp),
    ):
        torch.testing.assert_close(ours(x, dim=-1), theirs(x, dim=-1), equal_nan=True)


def test_entropy_propagates_nan_and_handles_empty_and_zero():
    assert entropy(torch.tensor([NAN, 0.5])).isnan()
    assert entropy(torch.zeros(2, 0)).tolist() == [0.0, 0.0]
    assert (
        entropy(torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float64))[0] == 0.0
    )
    torch.testing.assert_close(
        entropy(torch.tensor([0.2, 0.8], dtype=torch.float64)),
        torch.distributions.Categorical(
            probs=torch.tensor([0.2, 0.8], dtype=torch.float64)
        ).entropy(),
    )


def test_softmax_jacobian_and_three_pass_of_empty_rows():
    assert softmax_jacobian(torch.zeros(3, 0)).shape == (3, 0, 0)
    assert three_pass_softmax(torch.zeros(3, 0)).shape == (3, 0)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda: softmax(torch.zeros(2, 3), dim=2),
            ValueError,
            r"dim must lie in \[-2, 1\]",
        ),
        (lambda: softmax(torch.zeros(2, 3), dim=1.0), TypeError, "dim must be an int"),
        (
            lambda: entropy(torch.zeros(2, 3), dim=-3),
            ValueError,
            r"dim must lie in \[-2, 1\]",
        ),
        (
            lambda: logsumexp(torch.zeros(2, 3), keepdim="yes"),
            TypeError,
            "keepdim must be a bool",
        ),
        (
            lambda: three_pass_softmax(torch.tensor(1.0)),
            ValueError,
            "at least 1 dimensions",
        ),
    ],
)
def test_bad_dim_and_flags(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
