"""Checkers for chapter 8's exercises: cross-attention, source padding, and matching
object queries to objects.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch08
    ch08.check_cross_attention(my_cross_attention)

Every input is float64; the tolerance is stated in the ``✓`` line. Shape legend: ``b``
batch, ``i`` queries (the attending sequence), ``j`` keys (the attended sequence),
``d_q``/``d_kv`` input features, ``d`` query/key size, ``e`` value size, ``m`` object
queries, ``g`` objects. Weight convention: the paper's, ``Q = X W_Q`` with ``W_Q`` of
shape ``(d_in, d)``. Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..foundations.scaled_dot_product import scaled_dot_product_attention
from ..layers.learned_queries import match_queries
from ._checker import Case, Mistake, Property, check, randn, random_qkv

__all__ = [
    "check_cross_attention",
    "check_source_padding",
    "check_match_queries",
]


def _attend(q: Tensor, k: Tensor, v: Tensor, dim: int = -1) -> Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=dim) @ v


# ------------------------------------------------------------------ cross-attention


def _cross_attention(x_q, x_kv, w_q, w_k, w_v):
    """The reference: the package's attention, queries from x_q, keys/values x_kv."""
    return scaled_dot_product_attention(x_q @ w_q, x_kv @ w_k, x_kv @ w_v)


def _ca_keys_from_queries(x_q, x_kv, w_q, w_k, w_v):
    return _attend(x_q @ w_q, x_q @ w_k, x_kv @ w_v)


def _ca_values_from_queries(x_q, x_kv, w_q, w_k, w_v):
    return _attend(x_q @ w_q, x_kv @ w_k, x_q @ w_v)


def _ca_swapped(x_q, x_kv, w_q, w_k, w_v):
    return _attend(x_kv @ w_q, x_q @ w_k, x_q @ w_v)


def _ca_no_scale(x_q, x_kv, w_q, w_k, w_v):
    q, k = x_q @ w_q, x_kv @ w_k
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ (x_kv @ w_v)


def _ca_query_axis(x_q, x_kv, w_q, w_k, w_v):
    return _attend(x_q @ w_q, x_kv @ w_k, x_kv @ w_v, dim=-2)


def _cross_cases() -> list[Case]:
    def weights(d_q, d_kv, d, e, seed):
        return (
            randn(d_q, d, seed=seed, scale=d_q**-0.5),
            randn(d_kv, d, seed=seed + 1, scale=d_kv**-0.5),
            randn(d_kv, e, seed=seed + 2, scale=d_kv**-0.5),
        )

    return [
        Case(
            "i = 3 queries, j = 5 keys, d_q = d_kv = 4 input features, d = 4, e = 3",
            (randn(3, 4, seed=0, scale=2.0), randn(5, 4, seed=1, scale=2.0))
            + weights(4, 4, 4, 3, seed=2),
        ),
        Case(
            "as many queries as keys (i = j = 4), d = 4, e = 3",
            (randn(4, 4, seed=5, scale=2.0), randn(4, 4, seed=6, scale=2.0))
            + weights(4, 4, 4, 3, seed=7),
        ),
        Case(
            "different input sizes: x_q (3, 6), x_kv (5, 4), d = 4, e = 2",
            (randn(3, 6, seed=10, scale=2.0), randn(5, 4, seed=11, scale=2.0))
            + weights(6, 4, 4, 2, seed=12),
        ),
        Case(
            "a batch of 2: x_q (2, 3, 4), x_kv (2, 5, 4)",
            (randn(2, 3, 4, seed=15, scale=2.0), randn(2, 5, 4, seed=16, scale=2.0))
            + weights(4, 4, 4, 3, seed=17),
        ),
    ]


def check_cross_attention(fn) -> None:
    r"""Check ``fn(x_q, x_kv, w_q, w_k, w_v)``: one head of cross-attention.

    .. math:: Z = \operatorname{softmax}\!\Big(\frac{Q K^\top}{\sqrt{d}}\Big) V, \quad
        Q = X_q W_Q,\ K = X_{kv} W_K,\ V = X_{kv} W_V

    Args of ``fn``:
        x_q: ``(..., i, d_q)`` the attending sequence (e.g. the decoder's states).
        x_kv: ``(..., j, d_kv)`` the attended sequence (e.g. the encoder's output).
        w_q: ``(d_q, d)``; w_k: ``(d_kv, d)``; w_v: ``(d_kv, e)``.

    ``fn`` returns ``(..., i, e)``: one row per query. The inputs include as many
    queries as keys (where keys taken from the wrong side still run) and input sizes
    that differ. Known mistakes are named: keys or values from the queries' side, the
    two sides swapped, no ``1/sqrt(d)``, the softmax over the queries. Tolerance:
    1e-10 (float64).

    Example:
        >>> def my_cross_attention(x_q, x_kv, w_q, w_k, w_v):
        ...     q, k, v = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
        ...     scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ...     return torch.softmax(scores, dim=-1) @ v
        >>> check_cross_attention(my_cross_attention)  # doctest: +ELLIPSIS
        ✓ my_cross_attention: ... (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _cross_attention,
        _cross_cases(),
        what="Q from x_q, K and V from x_kv",
        mistakes=[
            Mistake(
                "the keys come from x_q: in cross-attention K = x_kv @ w_k, the "
                "attended sequence",
                _ca_keys_from_queries,
            ),
            Mistake(
                "the values come from x_q: in cross-attention V = x_kv @ w_v, the "
                "attended sequence",
                _ca_values_from_queries,
            ),
            Mistake(
                "the two sides are swapped: the queries come from x_q, the keys and "
                "values from x_kv",
                _ca_swapped,
            ),
            Mistake(
                "the scores are not divided by sqrt(d): scale Q K^T by 1 / sqrt(d)",
                _ca_no_scale,
            ),
            Mistake(
                "the softmax runs over the queries (dim=-2): each query's weights "
                "must sum to 1, softmax(..., dim=-1)",
                _ca_query_axis,
            ),
        ],
    )


# -------------------------------------------------------------------- source padding


def _keep(lengths: Tensor, j: int) -> Tensor:
    """``(b, 1, j)``: True at the real keys of each batch row."""
    return (torch.arange(j) < lengths[:, None])[:, None, :]


def _source_padding(q, k, v, lengths):
    """The reference: attention with the padded keys masked out."""
    return scaled_dot_product_attention(q, k, v, attn_mask=_keep(lengths, k.shape[-2]))


def _sp_no_mask(q, k, v, lengths):
    return _attend(q, k, v)


def _sp_inverted(q, k, v, lengths):
    return scaled_dot_product_attention(q, k, v, attn_mask=~_keep(lengths, k.shape[-2]))


def _sp_after_softmax(q, k, v, lengths):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores, dim=-1) * _keep(lengths, k.shape[-2])
    return weights @ v


def _sp_query_side(q, k, v, lengths):
    keep = (torch.arange(q.shape[-2]) < lengths[:, None])[:, :, None]  # (b, i, 1)
    return _attend(q, k, v) * keep


def _padding_cases() -> list[Case]:
    q, k, v = random_qkv(3, 6, d=4, e=3, batch=(3,), seed=20)
    q2, k2, v2 = random_qkv(4, 5, d=4, e=2, batch=(2,), seed=21)
    # garbage in the padding must not matter
    k2[:, 4:] = 50 * randn(2, 1, 4, seed=22)
    return [
        Case(
            "3 sources of lengths 5, 4 and 1, padded to j = 6",
            (q, k, v, torch.tensor([5, 4, 1])),
        ),
        Case(
            "2 sources of lengths 3 and 4, padded to j = 5, large keys in the padding",
            (q2, k2, v2, torch.tensor([3, 4])),
        ),
    ]


def _rows_ignore_padding(out, q, k, v, lengths):
    """Changing the padded keys and values leaves the output unchanged."""
    j = k.shape[-2]
    pad = ~_keep(lengths, j)[:, 0, :, None]  # (b, j, 1)
    other = _source_padding(q, k + 3.0 * pad, v + 3.0 * pad, lengths)
    return (out - other).abs() <= 1e-9


def check_source_padding(fn) -> None:
    """Check ``fn(q, k, v, lengths)``: attention that ignores a padded source.

    Args of ``fn``:
        q: ``(b, i, d)`` queries; k: ``(b, j, d)`` keys; v: ``(b, j, e)`` values, of
            sources padded to ``j`` positions.
        lengths: ``(b,)`` integers, the real length of each source: key ``t`` of row
            ``n`` is real when ``t < lengths[n]``.

    ``fn`` returns ``(b, i, e)``: each query's output over the real keys of its source
    only, as if the padding were not there (build a boolean mask, **True = may
    attend**, and hide the padded keys before the softmax). Known mistakes are named:
    no mask, an inverted mask, zeroing weights after the softmax, masking the queries
    instead of the keys. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_padded_attention(q, k, v, lengths):
        ...     keep = torch.arange(k.shape[-2]) < lengths[:, None]  # (b, j)
        ...     scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ...     scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
        ...     return torch.softmax(scores, dim=-1) @ v
        >>> check_source_padding(my_padded_attention)  # doctest: +ELLIPSIS
        ✓ my_padded_attention: ... (2 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _source_padding,
        _padding_cases(),
        what="attention over the real keys",
        properties=[
            Property(
                "the output must not change when the padded keys and values change",
                _rows_ignore_padding,
            )
        ],
        mistakes=[
            Mistake(
                "the padding is not masked: the padded keys get weight too",
                _sp_no_mask,
            ),
            Mistake(
                "the mask looks inverted: True must mean may attend (a real key)",
                _sp_inverted,
            ),
            Mistake(
                "the weights are zeroed after the softmax, so they no longer sum to "
                "1: mask the scores with -inf before it",
                _sp_after_softmax,
            ),
            Mistake(
                "the queries are masked, not the keys: padding hides keys (columns)",
                _sp_query_side,
            ),
        ],
    )


# ------------------------------------------------------------------ matching queries


def _match(cost):
    """The reference: the package's exhaustive matching of one example."""
    return match_queries(cost[None])[0]


def _match_greedy(cost):
    # each object, in turn, takes the cheapest query still free
    taken: list[int] = []
    for o in range(cost.shape[1]):
        order = cost[:, o].argsort().tolist()
        taken.append(next(q for q in order if q not in taken))
    return torch.tensor(taken)


def _match_each_best(cost):
    return cost.argmin(0)


def _match_wrong_axis(cost):
    return cost.argmin(1)[: cost.shape[1]]


def _match_cases() -> list[Case]:
    greedy_trap = torch.tensor(
        [[0.1, 0.2, 0.9], [0.2, 0.9, 0.9], [0.9, 0.9, 0.3], [0.8, 0.7, 0.9]],
        dtype=torch.float64,
    )
    return [
        Case("4 queries, 3 objects, where greedy choices lose", (greedy_trap,)),
        Case(
            "5 queries, 2 objects, random costs",
            (torch.rand(5, 2, generator=torch.Generator().manual_seed(30)).double(),),
        ),
        Case(
            "6 queries, 4 objects, random costs",
            (torch.rand(6, 4, generator=torch.Generator().manual_seed(31)).double(),),
        ),
        Case(
            "3 queries, 3 objects, one query best for all",
            (
                torch.tensor(
                    [[0.1, 0.1, 0.1], [0.5, 0.6, 0.9], [0.6, 0.5, 0.8]],
                    dtype=torch.float64,
                ),
            ),
        ),
    ]


def _one_to_one(out, cost):
    """No query serves two objects."""
    return len(set(out.tolist())) == out.numel()


def check_match_queries(fn) -> None:
    """Check ``fn(cost)``: DETR's one-to-one matching of objects to queries.

    Args of ``fn``:
        cost: ``(m, g)`` float, ``cost[q, o]`` the cost of giving object ``o`` to query
            ``q``, with ``m >= g``.

    ``fn`` returns ``(g,)`` integers (``torch.long``): the query given to each object,
    no query twice, with the least total cost ``sum_o cost[out[o], o]`` (try every
    ordered choice of ``g`` queries with ``itertools.permutations``). The inputs have
    no ties. Known mistakes are named: each object takes its best query (queries
    reused), a greedy choice object by object, the argmin over the wrong axis.

    Example:
        >>> import itertools
        >>> def my_match(cost):
        ...     m, g = cost.shape
        ...     best = min(
        ...         itertools.permutations(range(m), g),
        ...         key=lambda p: sum(float(cost[q, o]) for o, q in enumerate(p)),
        ...     )
        ...     return torch.tensor(best)
        >>> check_match_queries(my_match)  # doctest: +ELLIPSIS
        ✓ my_match: ... (4 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _match,
        _match_cases(),
        what="the one-to-one matching of least total cost",
        properties=[Property("no query may serve two objects", _one_to_one)],
        mistakes=[
            Mistake(
                "each object takes its own best query, so a query can serve two "
                "objects: the matching must be one to one",
                _match_each_best,
            ),
            Mistake(
                "a greedy choice, object by object, is one to one but not the least "
                "total cost: try every assignment",
                _match_greedy,
            ),
            Mistake(
                "the argmin runs over the objects (dim=1): for each object (column) "
                "pick a query (row)",
                _match_wrong_axis,
            ),
        ],
    )
