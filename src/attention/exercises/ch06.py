"""Checkers for chapter 6's exercises: split and merge heads, repeat_kv, a causal layer.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch06
    ch06.check_split_heads(my_split_heads)

Every input is float64; a rearrangement is compared exactly, a computation within the
tolerance stated in the ``✓`` line. Shape legend: ``b`` batch, ``L`` tokens, ``h`` query
heads, ``h_kv`` key/value heads, ``d`` head size, ``d_model`` the layer's width. Weight
convention: the paper's, ``Q = X W_Q`` with ``W_Q`` of shape ``(d_model, h d)``. Mask
convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..foundations.scaled_dot_product import scaled_dot_product_attention
from ._checker import Case, Mistake, check, randn

__all__ = [
    "check_split_heads",
    "check_merge_heads",
    "check_repeat_kv",
    "check_causal_multi_head",
]

# ----------------------------------------------------------------------- split heads


def _split(x: Tensor, num_heads: int) -> Tensor:
    """The reference: ``(b, L, h d) -> (b, L, h, d) -> (b, h, L, d)``."""
    b, length, features = x.shape
    return x.reshape(b, length, num_heads, features // num_heads).transpose(1, 2)


def _split_no_transpose(x, num_heads):
    b, length, features = x.shape
    return x.reshape(b, num_heads, length, features // num_heads)


def _split_interleaved(x, num_heads):
    b, length, features = x.shape
    return x.reshape(b, length, features // num_heads, num_heads).permute(0, 3, 1, 2)


def _split_only_reshaped(x, num_heads):
    b, length, features = x.shape
    return x.reshape(b, length, num_heads, features // num_heads)


def _numbered(b: int, length: int, features: int) -> Tensor:
    """``0, 1, 2 ...`` in reading order: where a number lands shows its origin."""
    return torch.arange(b * length * features, dtype=torch.float64).reshape(
        b, length, features
    )


def _split_cases() -> list[Case]:
    return [
        Case("b = 1, L = 2 tokens, 3 heads of size 2", (_numbered(1, 2, 6), 3)),
        Case("b = 2, L = 5, 2 heads of size 3", (randn(2, 5, 6, seed=40), 2)),
        Case("b = 1, L = 4, 4 heads of size 1", (randn(1, 4, 4, seed=41), 4)),
    ]


def check_split_heads(fn) -> None:
    """Check ``fn(x, num_heads)``: ``(b, L, h d) -> (b, h, L, d)``, the heads split off.

    Head ``n`` owns the contiguous features ``n d ... n d + d - 1`` of every token: a
    reshape to ``(b, L, h, d)`` and a transpose that brings the heads next to the batch.
    ``fn`` returns ``(b, h, L, d)`` with ``d = x.shape[-1] // num_heads``. The first
    input is numbered ``0, 1, 2 ...`` so a misplaced feature shows where it came from.
    Known mistakes are named: a reshape straight to ``(b, h, L, d)`` (no transpose),
    every h-th feature given to a head (the wrong split of the axis), the transpose left
    out. Compared exactly (it only moves numbers).

    Example:
        >>> def my_split_heads(x, num_heads):
        ...     b, length, features = x.shape
        ...     d = features // num_heads
        ...     return x.reshape(b, length, num_heads, d).transpose(1, 2)
        >>> check_split_heads(my_split_heads)
        ✓ my_split_heads: (b, L, h*d) -> (b, h, L, d) (3 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _split,
        _split_cases(),
        what="(b, L, h*d) -> (b, h, L, d)",
        atol=0.0,
        mistakes=[
            Mistake(
                "a head gets features of several tokens: reshape to (b, L, h, d) "
                "first, then transpose(1, 2); a reshape straight to (b, h, L, d) "
                "mixes tokens",
                _split_no_transpose,
            ),
            Mistake(
                "head n gets every h-th feature: it owns the contiguous features "
                "n*d ... n*d + d - 1, so reshape to (b, L, h, d), not (b, L, d, h)",
                _split_interleaved,
            ),
            Mistake(
                "the heads are not moved next to the batch: after the reshape to "
                "(b, L, h, d), transpose(1, 2) gives (b, h, L, d)",
                _split_only_reshaped,
            ),
        ],
    )


# ----------------------------------------------------------------------- merge heads


def _merge(x: Tensor) -> Tensor:
    """The reference: ``(b, h, L, d) -> (b, L, h, d) -> (b, L, h d)``."""
    b, h, length, d = x.shape
    return x.transpose(1, 2).reshape(b, length, h * d)


def _merge_no_transpose(x):
    b, h, length, d = x.shape
    return x.reshape(b, length, h * d)


def _merge_wrong_order(x):
    b, h, length, d = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, length, h * d)


def _merge_view(x):
    b, h, length, d = x.shape
    return x.transpose(1, 2).view(b, length, h * d)


def _merge_cases() -> list[Case]:
    numbered = torch.arange(12, dtype=torch.float64).reshape(1, 3, 2, 2)
    return [
        Case("b = 1, 3 heads, L = 2 tokens, d = 2", (numbered,)),
        Case("b = 2, 2 heads, L = 5, d = 3", (randn(2, 2, 5, 3, seed=42),)),
        Case("b = 1, 4 heads, L = 3, d = 1", (randn(1, 4, 3, 1, seed=43),)),
    ]


def check_merge_heads(fn) -> None:
    """Check ``fn(x)``: ``(b, h, L, d) -> (b, L, h d)``, the heads concatenated again.

    The inverse of :func:`check_split_heads`'s function: token ``t``'s output row is
    head 0's ``d`` numbers for ``t``, then head 1's, and so on. An attention kernel
    returns its output contiguous, as the inputs here are, so the transpose is followed
    by a copy (``reshape``, or ``contiguous().view``). Known mistakes are named: a
    reshape without the transpose, the heads merged in the wrong order (``d`` before
    ``h``), ``view`` on the transposed tensor (which raises). Compared exactly.

    Example:
        >>> def my_merge_heads(x):
        ...     b, h, length, d = x.shape
        ...     return x.transpose(1, 2).reshape(b, length, h * d)
        >>> check_merge_heads(my_merge_heads)
        ✓ my_merge_heads: (b, h, L, d) -> (b, L, h*d) (3 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _merge,
        _merge_cases(),
        what="(b, h, L, d) -> (b, L, h*d)",
        atol=0.0,
        mistakes=[
            Mistake(
                "the heads are reshaped without the transpose: a token's row mixes "
                "other tokens; transpose(1, 2) to (b, L, h, d) first",
                _merge_no_transpose,
            ),
            Mistake(
                "the heads are merged in the wrong order: head n's d numbers must sit "
                "together at n*d ... n*d + d - 1 (transpose(1, 2), not "
                "permute(0, 2, 3, 1))",
                _merge_wrong_order,
            ),
            Mistake(
                "view cannot merge the transposed (non-contiguous) tensor: use "
                "reshape, or .contiguous().view(...)",
                _merge_view,
            ),
        ],
    )


# ------------------------------------------------------------------------- repeat_kv


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """The reference: each key/value head repeated for its group of query heads."""
    return x.repeat_interleave(n_rep, dim=1)


def _repeat_tiled(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)


def _repeat_wrong_axis(x, n_rep):
    return x.repeat_interleave(n_rep, dim=2)


def _repeat_cases() -> list[Case]:
    heads = torch.tensor([10.0, 20.0], dtype=torch.float64).reshape(1, 2, 1, 1)
    return [
        Case("2 key/value heads, 3 query heads each, L = d = 1", (heads, 3)),
        Case(
            "b = 2, h_kv = 3, L = 4, d = 2, n_rep = 2", (randn(2, 3, 4, 2, seed=44), 2)
        ),
        Case("MQA: h_kv = 1, n_rep = 4", (randn(1, 1, 3, 2, seed=45), 4)),
        Case("MHA: n_rep = 1 changes nothing", (randn(1, 2, 3, 2, seed=46), 1)),
    ]


def check_repeat_kv(fn) -> None:
    """Check ``fn(x, n_rep)``: ``(b, h_kv, L, d) -> (b, h_kv n_rep, L, d)``.

    Grouped-query attention: query head ``n`` reads key/value head ``n // n_rep``, so
    each key/value head is repeated ``n_rep`` times *in place*: heads ``g g g`` then
    ``g+1 g+1 g+1`` (as Hugging Face's ``repeat_kv`` and ``repeat_interleave`` do), not
    the whole stack tiled. The first input is two heads holding 10 and 20. Known
    mistakes are named: the stack tiled (``x.repeat``), the wrong axis repeated.
    Compared exactly.

    Example:
        >>> def my_repeat_kv(x, n_rep):
        ...     b, h_kv, length, d = x.shape
        ...     x = x[:, :, None].expand(b, h_kv, n_rep, length, d)
        ...     return x.reshape(b, h_kv * n_rep, length, d)
        >>> check_repeat_kv(my_repeat_kv)
        ✓ my_repeat_kv: (b, h_kv, L, d) -> (b, h_kv*n_rep, L, d) (4 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _repeat_kv,
        _repeat_cases(),
        what="(b, h_kv, L, d) -> (b, h_kv*n_rep, L, d)",
        atol=0.0,
        mistakes=[
            Mistake(
                "the key/value heads are tiled (0 1 0 1 ...): query head n reads "
                "key/value head n // n_rep, so repeat each in place (0 0 1 1 ...), "
                "e.g. repeat_interleave(n_rep, dim=1)",
                _repeat_tiled,
            ),
            Mistake(
                "the wrong axis is repeated: the heads are axis 1 of (b, h_kv, L, d)",
                _repeat_wrong_axis,
            ),
        ],
    )


# ---------------------------------------------------------------- causal multi-head


def _heads(t: Tensor, num_heads: int) -> Tensor:
    return _split(t, num_heads)


def _causal_mha(x, w_q, w_k, w_v, w_o, num_heads):
    """The reference: split, causal attention per head, merge, output projection."""
    q, k, v = (_heads(x @ w, num_heads) for w in (w_q, w_k, w_v))
    z = scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, h, L, d)
    return _merge(z) @ w_o


def _attend(q, k, v, *, scale, keep=None, dim=-1):
    scores = q @ k.transpose(-2, -1) * scale
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=dim) @ v


def _keep(length: int) -> Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril()


def _mha_variant(
    x,
    w_q,
    w_k,
    w_v,
    w_o,
    num_heads,
    *,
    split=_split,
    merge=_merge,
    scale=None,
    keep="causal",
    dim=-1,
):
    q, k, v = (split(x @ w, num_heads) for w in (w_q, w_k, w_v))
    d = q.shape[-1]
    length = x.shape[-2]
    mask = {"causal": _keep(length), "inverted": ~_keep(length), "none": None}[keep]
    z = _attend(q, k, v, scale=scale or 1 / math.sqrt(d), keep=mask, dim=dim)
    return merge(z) @ w_o


def _mha_model_scale(x, w_q, w_k, w_v, w_o, num_heads):
    return _mha_variant(
        x, w_q, w_k, w_v, w_o, num_heads, scale=1 / math.sqrt(x.shape[-1])
    )


def _mha_no_scale(x, w_q, w_k, w_v, w_o, num_heads):
    return _mha_variant(x, w_q, w_k, w_v, w_o, num_heads, scale=1.0)


def _mha_no_transpose(x, w_q, w_k, w_v, w_o, num_heads):
    return _mha_variant(x, w_q, w_k, w_v, w_o, num_heads, split=_split_no_transpose)


def _mha_inverted(x, w_q, w_k, w_v, w_o, num_heads):
    return _mha_variant(x, w_q, w_k, w_v, w_o, num_heads, keep="inverted")


def _mha_no_mask(x, w_q, w_k, w_v, w_o, num_heads):
    return _mha_variant(x, w_q, w_k, w_v, w_o, num_heads, keep="none")


def _mha_wrong_merge(x, w_q, w_k, w_v, w_o, num_heads):
    return _mha_variant(x, w_q, w_k, w_v, w_o, num_heads, merge=_merge_wrong_order)


def _mha_merge_no_transpose(x, w_q, w_k, w_v, w_o, num_heads):
    return _mha_variant(x, w_q, w_k, w_v, w_o, num_heads, merge=_merge_no_transpose)


def _mha_query_axis(x, w_q, w_k, w_v, w_o, num_heads):
    return _mha_variant(x, w_q, w_k, w_v, w_o, num_heads, dim=-2)


def _layer(d_model: int, num_heads: int, d: int, seed: int):
    """``(w_q, w_k, w_v, w_o)`` of a layer with heads of size ``d``, seeded."""
    s = d_model**-0.5
    return (
        randn(d_model, num_heads * d, seed=seed, scale=s),
        randn(d_model, num_heads * d, seed=seed + 1, scale=s),
        randn(d_model, num_heads * d, seed=seed + 2, scale=s),
        randn(num_heads * d, d_model, seed=seed + 3, scale=(num_heads * d) ** -0.5),
    )


def _mha_cases() -> list[Case]:
    return [
        Case(
            "b = 2, L = 5, d_model = 8, 2 heads of size 4",
            (randn(2, 5, 8, seed=50, scale=2.0), *_layer(8, 2, 4, seed=51), 2),
        ),
        Case(
            "b = 1, L = 4, d_model = 6, 3 heads of size 4 (h * d != d_model)",
            (randn(1, 4, 6, seed=55, scale=2.0), *_layer(6, 3, 4, seed=56), 3),
        ),
    ]


def check_causal_multi_head(fn) -> None:
    r"""Check ``fn(x, w_q, w_k, w_v, w_o, num_heads)``: a causal multi-head layer.

    .. math:: \operatorname{concat}(\text{head}_1, \dots, \text{head}_h)\, W_O, \quad
        \text{head}_n = \operatorname{softmax}\!\Big(\frac{Q_n K_n^\top}{\sqrt{d}}
        + M\Big) V_n

    Args of ``fn``:
        x: ``(b, L, d_model)`` the tokens.
        w_q, w_k, w_v: ``(d_model, h d)`` the projections of all heads, head ``n`` in
            columns ``n d ... n d + d - 1`` (the paper's ``X W``; no biases).
        w_o: ``(h d, d_model)`` the output projection.
        num_heads: ``h``; the head size is ``d = w_q.shape[1] // num_heads``.

    ``fn`` splits the projections into heads, runs causal attention in every head
    (token ``p`` sees ``0 ... p``; the mask is boolean, True = may attend), merges the
    heads and applies ``w_o``. It returns ``(b, L, d_model)``. The second input has a
    head size independent of ``d_model / h``. Known mistakes are named: the scale
    ``1/sqrt(d_model)`` instead of ``1/sqrt(d)``, no scale, a split without the
    transpose, the mask inverted or missing, the heads merged without the transpose or
    in the wrong order, the softmax over the queries. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_causal_multi_head(x, w_q, w_k, w_v, w_o, num_heads):
        ...     b, length, _ = x.shape
        ...     def split(t):
        ...         return t.reshape(b, length, num_heads, -1).transpose(1, 2)
        ...     q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)
        ...     scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ...     keep = torch.ones(length, length, dtype=torch.bool).tril()
        ...     weights = torch.softmax(scores.masked_fill(~keep, -torch.inf), -1)
        ...     z = (weights @ v).transpose(1, 2).reshape(b, length, -1)
        ...     return z @ w_o
        >>> check_causal_multi_head(my_causal_multi_head)  # doctest: +ELLIPSIS
        ✓ my_causal_multi_head: causal multi-head attention (2 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _causal_mha,
        _mha_cases(),
        what="causal multi-head attention",
        mistakes=[
            Mistake(
                "the scores are divided by sqrt(d_model): divide by sqrt(d), the "
                "size of one head",
                _mha_model_scale,
            ),
            Mistake(
                "the scores are not divided by sqrt(d): scale Q K^T by 1 / sqrt(d)",
                _mha_no_scale,
            ),
            Mistake(
                "the split mixes tokens: reshape to (b, L, h, d), then "
                "transpose(1, 2); not a reshape straight to (b, h, L, d)",
                _mha_no_transpose,
            ),
            Mistake(
                "the mask looks inverted: True must mean may attend, and token p "
                "may attend to tokens 0 ... p",
                _mha_inverted,
            ),
            Mistake(
                "there is no causal mask: every token sees the future",
                _mha_no_mask,
            ),
            Mistake(
                "the heads are merged in the wrong order: head n's d numbers must sit "
                "together at n*d ... n*d + d - 1 (transpose(1, 2), then reshape)",
                _mha_wrong_merge,
            ),
            Mistake(
                "the heads are merged without the transpose: transpose(1, 2) to "
                "(b, L, h, d), then reshape to (b, L, h*d)",
                _mha_merge_no_transpose,
            ),
            Mistake(
                "the softmax runs over the queries (dim=-2): each query's row of "
                "weights must sum to 1, softmax(..., dim=-1)",
                _mha_query_axis,
            ),
        ],
    )
