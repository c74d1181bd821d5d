"""Tests for attention.practice.head_stats: every statistic against a loop, its
extremes, and the boundary checks (NaN propagates, positions must be ints in range)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import (
    attention_share,
    head_diversity,
    mean_attention_entropy,
    sink_share,
)
from attention.practice.head_stats import head_distances, top_heads


def test_attention_share_against_a_loop():
    w = torch.softmax(
        torch.randn(3, 4, 6, 7, generator=torch.Generator().manual_seed(0)), -1
    )
    got = attention_share(w, 2, [0, 5])
    expected = torch.tensor(
        [[float(w[a, b, 2, 0] + w[a, b, 2, 5]) for b in range(4)] for a in range(3)]
    )
    assert_close(got, expected)
    assert_close(attention_share(w, 1, 3), w[..., 1, 3])


@pytest.mark.parametrize(
    ("query", "keys", "message"),
    [
        (6, [0], r"query must be a position in \[0, 6\), got 6"),
        (0, [], r"keys must be a non-empty list of positions in \[0, 7\), got \[\]"),
        (0, [7], r"keys must be a non-empty list of positions in \[0, 7\), got \[7\]"),
    ],
)
def test_attention_share_bad_positions(query, keys, message):
    with pytest.raises(ValueError, match=message):
        attention_share(torch.rand(6, 7), query, keys)


def test_top_heads_against_sorting():
    share = torch.rand(6, 12, generator=torch.Generator().manual_seed(1))
    expected = sorted(
        ((float(share[r, c]), r, c) for r in range(6) for c in range(12)), reverse=True
    )
    assert top_heads(share, k=5) == [(r, c, v) for v, r, c in expected[:5]]
    assert len(top_heads(share, k=100)) == 72
    with pytest.raises(
        ValueError, match=r"share must be a \(num_layers, h\) table, got shape \(72,\)"
    ):
        top_heads(share.flatten())
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        top_heads(share, k=0)


def _rows(seed, *shape):
    return torch.softmax(
        3
        * torch.randn(
            *shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        ),
        dim=-1,
    )


def test_entropy_limits_and_loop():
    n = 5
    uniform = torch.full((2, n, n), 1.0 / n, dtype=torch.float64)
    one_hot = torch.eye(n, dtype=torch.float64).expand(2, n, n)
    assert_close(
        mean_attention_entropy(uniform),
        torch.full((2,), math.log(n), dtype=torch.float64),
    )
    assert_close(mean_attention_entropy(one_hot), torch.zeros(2, dtype=torch.float64))
    w = _rows(0, 3, 4, 6)
    expected = torch.tensor(
        [
            sum(-sum(p * math.log(p) for p in row.tolist()) for row in w[a]) / 4
            for a in range(3)
        ],
        dtype=torch.float64,
    )
    assert_close(mean_attention_entropy(w), expected)


def test_sink_share_against_a_loop():
    w = _rows(1, 2, 3, 5, 5)
    got = sink_share(w, [0, 4])
    expected = torch.tensor(
        [
            [
                sum(float(w[a, b, i, 0] + w[a, b, i, 4]) for i in range(5)) / 5
                for b in range(3)
            ]
            for a in range(2)
        ],
        dtype=torch.float64,
    )
    assert_close(got, expected)
    with pytest.raises(
        ValueError,
        match=r"keys must be a non-empty list of positions in \[0, 5\), got \[5\]",
    ):
        sink_share(w, 5)


def _js_distance_loop(p, q):
    """Jensen-Shannon distance in bits between two lists, term by term."""
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    kl = lambda x: sum(a * math.log2(a / c) for a, c in zip(x, m, strict=True) if a > 0)
    return math.sqrt(max(0.0, 0.5 * kl(p) + 0.5 * kl(q)))


def test_head_distances_against_a_loop():
    w = _rows(2, 4, 3, 5)  # (h, i, j)
    w[1, 0] = torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64)  # zeros are fine
    got = head_distances(w)
    for a, b in itertools.product(range(4), repeat=2):
        expected = (
            sum(_js_distance_loop(w[a, i].tolist(), w[b, i].tolist()) for i in range(3))
            / 3
        )
        assert math.isclose(
            float(got[a, b]), expected, abs_tol=1e-6
        )  # sqrt near 0 is steep


def test_head_diversity_extremes():
    same = _rows(3, 1, 4, 4).expand(6, 4, 4)
    assert_close(
        head_diversity(same), torch.tensor(0.0, dtype=torch.float64), atol=1e-6, rtol=0
    )
    disjoint = torch.eye(4, dtype=torch.float64)[:, None, :].expand(
        4, 3, 4
    )  # head n looks at key n
    assert_close(head_diversity(disjoint), torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(
        ValueError, match="head diversity needs at least 2 heads, got 1"
    ):
        head_diversity(_rows(0, 1, 3, 3))


@given(st.integers(2, 5), st.integers(1, 4), st.integers(2, 6), st.integers(0, 10_000))
def test_head_distances_is_a_bounded_symmetric_matrix(h, i, j, seed):
    d = head_distances(_rows(seed, h, i, j))
    assert d.shape == (h, h)
    assert_close(d, d.T)
    assert torch.all(d.diagonal() == 0) and torch.all((d >= 0) & (d <= 1))
    pairs = [float(d[a, b]) for a, b in itertools.combinations(range(h), 2)]
    assert math.isclose(
        float(head_diversity(_rows(seed, h, i, j))),
        sum(pairs) / len(pairs),
        rel_tol=1e-9,
        abs_tol=1e-12,
    )


@pytest.mark.parametrize(
    "stat",
    [
        mean_attention_entropy,
        lambda a: sink_share(a, 0),
        lambda a: attention_share(a, 1, [0, 2]),
        head_distances,
        head_diversity,
    ],
)
def test_nan_propagates(stat):
    w = _rows(4, 3, 4, 5)
    w[1, 1, 0] = float("nan")  # read by every statistic below
    out = stat(w)
    assert out.isnan().any()
    clean = stat(_rows(4, 3, 4, 5))
    assert not clean.isnan().any()


@pytest.mark.parametrize("keys", [1.5, [0, 2.0], True, "0"])
def test_positions_must_be_ints(keys):
    with pytest.raises(TypeError, match="keys must be an int"):
        sink_share(_rows(0, 2, 3, 4), keys)


def test_tensor_positions_are_accepted():
    w = _rows(5, 2, 3, 4)
    assert_close(sink_share(w, torch.tensor([0, 3])), sink_share(w, [0, 3]))
    with pytest.raises(TypeError, match="keys must be integer positions"):
        sink_share(w, torch.tensor([0.0]))


def test_statistics_refuse_non_float_maps():
    with pytest.raises(TypeError, match="attentions must have a floating-point dtype"):
        mean_attention_entropy(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="attentions must have at least 3 dimensions"):
        head_distances(torch.ones(2, 2))
