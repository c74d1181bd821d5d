"""Checkers for chapter 9's exercises: the cosine score, the additive score and local
alignment.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch09
    ch09.check_cosine_scores(my_cosine_scores)

Every input is float64; the tolerance is stated in the ``✓`` line. Shape legend: ``i``
queries, ``j`` keys, ``d`` query/key size, ``h`` hidden size of the additive score,
``S`` source positions. Weight convention of the additive score: ``W_1`` of shape
``(h, d_q)``, ``W_2`` of shape ``(h, d_k)``, as ``nn.Linear`` stores them.
"""

from __future__ import annotations

import math

import torch

from ..layers.alignment import local_alignment
from ..layers.scoring import additive_scores, cosine_scores
from ._checker import Case, Mistake, Property, check, randn

__all__ = [
    "check_cosine_scores",
    "check_additive_scores",
    "check_local_alignment",
]


# ---------------------------------------------------------------------- cosine


def _cosine(q, k):
    """The reference: the package's cosine scores."""
    return cosine_scores(q, k)


def _cos_dot(q, k):
    return q @ k.transpose(-2, -1)


def _cos_query_only(q, k):
    return (q / q.norm(dim=-1, keepdim=True)) @ k.transpose(-2, -1)


def _cos_wrong_axis(q, k):
    qn = q / q.norm(dim=-2, keepdim=True)
    kn = k / k.norm(dim=-2, keepdim=True)
    return qn @ kn.transpose(-2, -1)


def _bounded(out, q, k):
    return out.abs() <= 1 + 1e-12


def check_cosine_scores(fn) -> None:
    r"""Check ``fn(q, k)``: cosine scores, :math:`s_{ij} = q_i^\top k_j /
    (\lVert q_i\rVert\,\lVert k_j\rVert)`.

    Args of ``fn``: q ``(..., i, d)``, k ``(..., j, d)``. Returns ``(..., i, j)``. The
    inputs have vectors of very different lengths (a missing normalisation shows), and
    ``i != j``. Known mistakes are named: the plain dot product, only the queries
    normalised, the norm over the wrong axis. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_cosine_scores(q, k):
        ...     q = q / q.norm(dim=-1, keepdim=True)
        ...     k = k / k.norm(dim=-1, keepdim=True)
        ...     return q @ k.transpose(-2, -1)
        >>> check_cosine_scores(my_cosine_scores)  # doctest: +ELLIPSIS
        ✓ my_cosine_scores: ... (3 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    scale = torch.tensor([[0.1], [1.0], [7.0]], dtype=torch.float64)
    cases = [
        Case("3 queries, 5 keys, d = 4", (randn(3, 4, seed=0), randn(5, 4, seed=1))),
        Case(
            "queries of lengths 0.1 to 7",
            (scale * randn(3, 6, seed=2), randn(4, 6, seed=3, scale=3.0)),
        ),
        Case("a batch of 2", (randn(2, 3, 4, seed=4), randn(2, 5, 4, seed=5))),
    ]
    check(
        fn,
        _cosine,
        cases,
        what="q.k / (|q| |k|)",
        properties=[Property("every cosine lies in [-1, 1]", _bounded)],
        mistakes=[
            Mistake("this is the plain dot product: divide by |q_i| |k_j|", _cos_dot),
            Mistake(
                "only the queries are normalised: divide by |k_j| as well",
                _cos_query_only,
            ),
            Mistake(
                "the norms run over the tokens (dim=-2): each vector's norm is over "
                "its features, norm(dim=-1)",
                _cos_wrong_axis,
            ),
        ],
    )


# ---------------------------------------------------------------------- additive


def _additive(q, k, w_q, w_k, v):
    """The reference: the package's additive scores, no bias."""
    return additive_scores(q, k, w_q, w_k, v)


def _add_no_tanh(q, k, w_q, w_k, v):
    hidden = (q @ w_q.T)[..., :, None, :] + (k @ w_k.T)[..., None, :, :]
    return hidden @ v


def _add_tanh_outside(q, k, w_q, w_k, v):
    return torch.tanh(_add_no_tanh(q, k, w_q, w_k, v))


def _add_sum(q, k, w_q, w_k, v):
    hidden = (q @ w_q.T)[..., :, None, :] + (k @ w_k.T)[..., None, :, :]
    return torch.tanh(hidden).sum(-1)


def _additive_cases() -> list[Case]:
    def weights(h, d_q, d_k, seed):
        return (
            randn(h, d_q, seed=seed, scale=d_q**-0.5),
            randn(h, d_k, seed=seed + 1, scale=d_k**-0.5),
            randn(h, seed=seed + 2),
        )

    return [
        Case(
            "2 queries (d_q = 3), 4 keys (d_k = 5), h = 6",
            (randn(2, 3, seed=0, scale=2.0), randn(4, 5, seed=1, scale=2.0))
            + weights(6, 3, 5, seed=2),
        ),
        Case(
            "a batch of 2: q (2, 3, 4), k (2, 5, 4), h = 3",
            (randn(2, 3, 4, seed=5, scale=2.0), randn(2, 5, 4, seed=6, scale=2.0))
            + weights(3, 4, 4, seed=7),
        ),
    ]


def check_additive_scores(fn) -> None:
    r"""Check ``fn(q, k, w_q, w_k, v)``: additive scores,
    :math:`s_{ij} = v^\top \tanh(W_1 q_i + W_2 k_j)`.

    Args of ``fn``: q ``(..., i, d_q)``, k ``(..., j, d_k)``, w_q ``(h, d_q)``, w_k
    ``(h, d_k)``, v ``(h,)``. Returns ``(..., i, j)``. The query and key sizes differ
    in the first case. Known mistakes are named: no tanh, the tanh applied after
    ``v``, a plain sum over the hidden units instead of ``v``. Tolerance: 1e-10.

    Example:
        >>> def my_additive_scores(q, k, w_q, w_k, v):
        ...     hidden = (q @ w_q.T)[..., :, None, :] + (k @ w_k.T)[..., None, :, :]
        ...     return torch.tanh(hidden) @ v
        >>> check_additive_scores(my_additive_scores)  # doctest: +ELLIPSIS
        ✓ my_additive_scores: ... (2 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _additive,
        _additive_cases(),
        what="v . tanh(W1 q + W2 k)",
        mistakes=[
            Mistake(
                "the tanh is missing: v . tanh(W1 q + W2 k), not v . (W1 q + W2 k)",
                _add_no_tanh,
            ),
            Mistake(
                "the tanh is applied after v: tanh goes on the hidden vector, "
                "then the dot product with v",
                _add_tanh_outside,
            ),
            Mistake(
                "the hidden units are summed: weigh them by v, tanh(...) @ v",
                _add_sum,
            ),
        ],
    )


# ---------------------------------------------------------------------- local


def _local(scores, centre, half_width):
    """The reference: the package's local-p alignment, sigma = D / 2."""
    return local_alignment(scores, centre, half_width)


def _loc_global_softmax(scores, centre, half_width):
    pos = torch.arange(scores.shape[-1], dtype=scores.dtype)
    dist = pos - centre[..., None]
    inside = dist.abs() <= half_width
    gauss = torch.exp(-(dist**2) / (2 * (half_width / 2) ** 2))
    return torch.softmax(scores, -1) * inside * gauss


def _loc_no_gauss(scores, centre, half_width):
    pos = torch.arange(scores.shape[-1], dtype=scores.dtype)
    inside = (pos - centre[..., None]).abs() <= half_width
    return torch.softmax(scores.masked_fill(~inside, -math.inf), -1)


def _loc_renormalised(scores, centre, half_width):
    w = local_alignment(scores, centre, half_width)
    return w / w.sum(-1, keepdim=True)


def _outside_zero(out, scores, centre, half_width):
    pos = torch.arange(scores.shape[-1], dtype=scores.dtype)
    outside = (pos - centre[..., None]).abs() > half_width
    return (out == 0) | ~outside


def check_local_alignment(fn) -> None:
    r"""Check ``fn(scores, centre, half_width)``: Luong's local-p alignment.

    .. math:: a_{il} = \operatorname{softmax}_{l \in W_i}(s_{il})\,
        \exp\!\Big(-\frac{(l - p_i)^2}{2 (D/2)^2}\Big), \qquad
        W_i = \{l : |l - p_i| \le D\}

    Args of ``fn``: scores ``(i, S)``, centre ``(i,)`` real positions :math:`p_i`,
    half_width :math:`D` (a float). Returns ``(i, S)``: exactly 0 outside the window,
    the softmax over the window only, damped by the Gaussian (not renormalised).
    Known mistakes are named: the softmax over every key, no Gaussian, renormalised
    after the Gaussian. Tolerance: 1e-10.

    Example:
        >>> def my_local_alignment(scores, centre, half_width):
        ...     dist = torch.arange(scores.shape[-1]) - centre[:, None]
        ...     inside = dist.abs() <= half_width
        ...     w = torch.softmax(scores.masked_fill(~inside, float("-inf")), -1)
        ...     return w * torch.exp(-(dist**2) / (2 * (half_width / 2) ** 2))
        >>> check_local_alignment(my_local_alignment)  # doctest: +ELLIPSIS
        ✓ my_local_alignment: ... (2 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    cases = [
        Case(
            "2 queries, S = 10 positions, D = 2, centres 3.4 and 7.0",
            (randn(2, 10, seed=0), torch.tensor([3.4, 7.0], dtype=torch.float64), 2.0),
        ),
        Case(
            "3 queries, S = 12, D = 3, a centre near each edge",
            (
                randn(3, 12, seed=1, scale=2.0),
                torch.tensor([0.5, 6.2, 11.0], dtype=torch.float64),
                3.0,
            ),
        ),
    ]
    check(
        fn,
        _local,
        cases,
        what="window softmax times the Gaussian",
        properties=[
            Property("weights outside the window must be exactly 0", _outside_zero)
        ],
        mistakes=[
            Mistake(
                "the softmax runs over every key: take it over the window only "
                "(mask the scores outside it with -inf first)",
                _loc_global_softmax,
            ),
            Mistake(
                "the Gaussian factor is missing: multiply by "
                "exp(-(l - p)^2 / (2 (D/2)^2))",
                _loc_no_gauss,
            ),
            Mistake(
                "the weights are renormalised after the Gaussian: local-p does not "
                "renormalise, a row sums to less than 1",
                _loc_renormalised,
            ),
        ],
    )
