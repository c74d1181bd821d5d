"""Checkers for chapter 19's exercises: a previous-token score, an induction score and
the QK circuit of a head read between tokens.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch19
    ch19.check_previous_token_score(my_previous_token_score)

Every input is float64; the tolerance is stated in the ``✓`` line. Shape legend: ``n``
positions, ``i`` queries, ``j`` keys, ``V`` vocabulary size, ``D`` model size, ``d``
head size, ``h`` heads. Maps are ``(..., n, n)``, row ``i`` the weights of query ``i``.
Weight convention: the package's, ``q = x @ w_query`` with ``w_query`` of shape
``(D, d)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..reading.circuits import induction_score, previous_token_score, qk_circuit
from ._checker import Case, Mistake, Property, check, randn

__all__ = [
    "check_previous_token_score",
    "check_induction_score",
    "check_token_qk_circuit",
]


def _maps(*shape: int, seed: int, causal: bool = False) -> Tensor:
    """Random attention maps ``(..., n, n)``: rows of a softmax, causal if asked."""
    scores = randn(*shape, seed=seed, scale=1.5)
    if causal:
        n = shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1)


def _in_unit_interval(out, *args, **kwargs):
    """A mean of weights lies in [0, 1]."""
    return (out >= -1e-12) & (out <= 1 + 1e-12)


# ------------------------------------------------------------------ previous token


def _next_token(weights):
    return weights.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)


def _own_token(weights):
    return weights.diagonal(dim1=-2, dim2=-1).mean(-1)


def _over_all_queries(weights):
    n = weights.shape[-1]
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / n


def _summed(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1)


def _previous_cases() -> list[Case]:
    return [
        Case("one map of 6 positions", (_maps(6, 6, seed=0),)),
        Case("a causal map of 5 positions", (_maps(5, 5, seed=1, causal=True),)),
        Case("maps (b, h, n, n) = (2, 3, 7, 7)", (_maps(2, 3, 7, 7, seed=2),)),
        Case("two positions", (_maps(2, 2, seed=3),)),
    ]


def check_previous_token_score(fn) -> None:
    r"""Check ``fn(weights)``: the mean weight a query puts on the token just before it.

    .. math:: \frac{1}{n - 1} \sum_{i=1}^{n-1} A_{i,\,i-1}

    Args of ``fn``:
        weights: ``(..., n, n)`` attention maps, ``n >= 2``; row ``i`` holds the
            weights of query ``i`` over the keys.

    ``fn`` returns ``(...)``, one score per map. Query 0 has no previous token, so it
    is left out of the mean. The inputs: maps with weight above the diagonal too (so
    the next token differs from the previous one), a causal map, a batch of heads, the
    shortest map (``n = 2``). Known mistakes are named: the next token (the diagonal
    above the main one), the token itself, a mean that counts query 0, a sum instead
    of a mean. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_previous_token_score(weights):
        ...     return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)
        >>> check_previous_token_score(my_previous_token_score)  # doctest: +ELLIPSIS
        ✓ my_previous_token_score: mean of A[i, i - 1] over i >= 1 (4 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        previous_token_score,
        _previous_cases(),
        what="mean of A[i, i - 1] over i >= 1",
        properties=[
            Property("a mean of weights must lie in [0, 1]", _in_unit_interval)
        ],
        mistakes=[
            Mistake(
                "it reads the diagonal above the main one, the next token: the "
                "previous token of query i is key i - 1 (offset=-1)",
                _next_token,
            ),
            Mistake(
                "it reads the main diagonal, each query's weight on itself: the "
                "previous token of query i is key i - 1 (offset=-1)",
                _own_token,
            ),
            Mistake(
                "it divides by n: query 0 has no previous token, so average over "
                "the n - 1 queries 1 ... n - 1",
                _over_all_queries,
            ),
            Mistake(
                "it sums the weights: average them over the n - 1 queries",
                _summed,
            ),
        ],
    )


# ---------------------------------------------------------------------- induction


def _induction(weights, period):
    """The reference: the package's score from the period."""
    return induction_score(weights, period)


def _the_copy_itself(weights, period):
    return weights.diagonal(offset=-period, dim1=-2, dim2=-1).mean(-1)


def _with_the_first_repeat(weights, period):
    return weights.diagonal(offset=1 - period, dim1=-2, dim2=-1).mean(-1)


def _one_key_too_far(weights, period):
    return weights.diagonal(offset=2 - period, dim1=-2, dim2=-1)[..., 2:].mean(-1)


def _above_the_diagonal(weights, period):
    return weights.diagonal(offset=period - 1, dim1=-2, dim2=-1)[..., 1:].mean(-1)


def _induction_cases() -> list[Case]:
    return [
        Case("a map of 8 positions, period 3", (_maps(8, 8, seed=10), 3)),
        Case(
            "a causal map of 10 positions, period 5 (two copies)",
            (_maps(10, 10, seed=11, causal=True), 5),
        ),
        Case(
            "maps (b, h, n, n) = (2, 2, 9, 9), period 4",
            (_maps(2, 2, 9, 9, seed=12), 4),
        ),
        Case("period 1 (every token repeats the last)", (_maps(5, 5, seed=13), 1)),
    ]


def check_induction_score(fn) -> None:
    r"""Check ``fn(weights, period)``: the mean weight on each query's induction key.

    The sequence repeats itself after ``period`` tokens, ``t_i = t_{i-p}`` for
    ``i >= p``. Query ``i >= p`` has an earlier copy of its token at ``i - p``; its
    induction key is the token after that copy, ``i - p + 1``:

    .. math:: \frac{1}{n - p} \sum_{i=p}^{n-1} A_{i,\,i-p+1}

    Args of ``fn``:
        weights: ``(..., n, n)`` attention maps; row ``i`` holds query ``i``'s weights.
        period: ``p``, an int with ``1 <= p < n``.

    ``fn`` returns ``(...)``, one score per map. Queries ``0 ... p - 1`` have no
    earlier copy and are left out. The inputs: maps with weight everywhere, a causal
    map of two copies, a batch of heads, period 1. Known mistakes are named: the copy
    itself (key ``i - p``, off by one), query ``p - 1`` counted (the first entry of the
    shifted diagonal), one key too far, keys above the diagonal. Tolerance: 1e-10.

    Example:
        >>> def my_induction_score(weights, period):
        ...     stripe = weights.diagonal(offset=1 - period, dim1=-2, dim2=-1)
        ...     return stripe[..., 1:].mean(-1)  # from query p on
        >>> check_induction_score(my_induction_score)  # doctest: +ELLIPSIS
        ✓ my_induction_score: mean of A[i, i - p + 1] over i >= p (4 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _induction,
        _induction_cases(),
        what="mean of A[i, i - p + 1] over i >= p",
        properties=[
            Property("a mean of weights must lie in [0, 1]", _in_unit_interval)
        ],
        mistakes=[
            Mistake(
                "it reads key i - p, the earlier copy of the current token itself "
                "(a duplicate-token score): the induction key is the token after "
                "it, i - p + 1",
                _the_copy_itself,
            ),
            Mistake(
                "it counts query p - 1, the first entry of the diagonal at offset "
                "1 - p, whose token has no earlier copy: start at query p",
                _with_the_first_repeat,
            ),
            Mistake(
                "it reads key i - p + 2, one key too far: the induction key is the "
                "token right after the earlier copy, i - p + 1",
                _one_key_too_far,
            ),
            Mistake(
                "it reads above the main diagonal (keys after the query): the "
                "induction key lies p - 1 positions before the query, offset 1 - p",
                _above_the_diagonal,
            ),
        ],
    )


# --------------------------------------------------------------------- QK circuit


def _token_qk(w_embed, w_query, w_key):
    """The reference: W_E W_Q W_K^T W_E^T from the package's qk_circuit."""
    return w_embed @ qk_circuit(w_query, w_key) @ w_embed.T


def _query_key_swapped(w_embed, w_query, w_key):
    return w_embed @ w_key @ w_query.transpose(-2, -1) @ w_embed.T


def _linear_weights(w_embed, w_query, w_key):
    return w_embed @ w_query.transpose(-2, -1) @ w_key @ w_embed.T


def _with_the_scale(w_embed, w_query, w_key):
    d = w_query.shape[-1]
    return w_embed @ w_query @ w_key.transpose(-2, -1) @ w_embed.T / math.sqrt(d)


def _stream_circuit(w_embed, w_query, w_key):
    return w_query @ w_key.transpose(-2, -1)


def _dot_t(w_embed, w_query, w_key):
    reversed_key = w_key.permute(*reversed(range(w_key.dim())))
    return w_embed @ w_query @ reversed_key @ w_embed.T


def _qk_cases() -> list[Case]:
    def weights(v, big_d, d, heads=(), seed=0):
        scale = big_d**-0.5
        return (
            randn(v, big_d, seed=seed),
            randn(*heads, big_d, d, seed=seed + 1, scale=scale),
            randn(*heads, big_d, d, seed=seed + 2, scale=scale),
        )

    return [
        Case("V = 6 tokens, D = 5, d = 3", weights(6, 5, 3, seed=20)),
        Case("a square case: V = D = d = 4", weights(4, 4, 4, seed=23)),
        Case("two heads: w_query and w_key (2, 5, 3)", weights(6, 5, 3, (2,), seed=26)),
    ]


def check_token_qk_circuit(fn) -> None:
    r"""Check ``fn(w_embed, w_query, w_key)``: a head's QK circuit between tokens.

    .. math:: W_E\, W_Q\, W_K^\top\, W_E^\top

    Entry ``(a, b)`` is the score (before the ``1/sqrt(d)``) of a query whose token is
    ``a`` for a key whose token is ``b``, along the direct path from the embeddings.

    Args of ``fn``:
        w_embed: ``(V, D)`` the token embeddings, one row per token.
        w_query, w_key: ``(..., D, d)`` the head's projections, ``q = x @ w_query``
            (a leading axis of heads allowed).

    ``fn`` returns ``(..., V, V)``: rows are query tokens, columns key tokens. The
    inputs: sizes that all differ (most misplaced transposes raise), a square case
    (where they run and are wrong), two heads (``.T`` reverses every axis there).
    Known mistakes are named: query and key swapped (the transpose of the answer),
    the projections transposed as ``nn.Linear`` stores them, a ``1/sqrt(d)``, the
    circuit on the stream without the embeddings, ``.T`` on a stack of heads.
    Tolerance: 1e-10 (float64).

    Example:
        >>> def my_token_qk_circuit(w_embed, w_query, w_key):
        ...     queries, keys = w_embed @ w_query, w_embed @ w_key  # (..., V, d)
        ...     return queries @ keys.transpose(-2, -1)
        >>> check_token_qk_circuit(my_token_qk_circuit)  # doctest: +ELLIPSIS
        ✓ my_token_qk_circuit: W_E W_Q W_K^T W_E^T (3 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _token_qk,
        _qk_cases(),
        what="W_E W_Q W_K^T W_E^T",
        mistakes=[
            Mistake(
                "query and key are swapped (the transpose of the answer): rows are "
                "query tokens, so W_E W_Q comes first and W_K^T W_E^T last",
                _query_key_swapped,
            ),
            Mistake(
                "the projections are (D, d) and used as x @ w_query: no transpose "
                "on w_query, and w_key enters transposed",
                _linear_weights,
            ),
            Mistake(
                "it divides by sqrt(d): the circuit is the bilinear form alone; the "
                "1/sqrt(d) comes in when it scores a pair",
                _with_the_scale,
            ),
            Mistake(
                "that is the circuit on the stream, (D, D): multiply by the "
                "embeddings on both sides, W_E ... W_E^T, for (V, V)",
                _stream_circuit,
            ),
            Mistake(
                ".T reverses every axis of a stack of heads: use "
                "w_key.transpose(-2, -1) (or w_key.mT)",
                _dot_t,
            ),
        ],
    )
