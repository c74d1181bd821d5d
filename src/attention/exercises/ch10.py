r"""Checkers for chapter 10's exercises: linear attention from the kernel trick, its
causal recurrence token by token, and its chunked causal form.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch10
    ch10.check_linear_attention(my_linear_attention)

Every exercise uses the feature map :math:`\varphi(x) = \operatorname{elu}(x) + 1` and
the normalised form of the chapter,

.. math::

    o_i = \frac{\varphi(q_i)^\top \sum_j \varphi(k_j) v_j^\top}
               {\varphi(q_i)^\top \sum_j \varphi(k_j) + \varepsilon},

with the sums over every key, or over the keys ``j <= i`` when causal. Adding
:math:`\varepsilon = 10^{-6}` to the denominator is optional: answers with it and
without it are both accepted. Inputs are float64, one sequence (no batch or head dims):
``q`` ``(n, d)``, ``k`` ``(n, d)``, ``v`` ``(n, e)`` (for the non-causal form the keys
may be more than the queries). Shape legend: ``i`` queries, ``j`` keys, ``d``
query/key size, ``e`` value size, ``c`` a chunk's length.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..efficient.linear import linear_attention
from ..foundations.softmax import softmax
from ._checker import Case, Mistake, check, generator

__all__ = [
    "check_linear_attention",
    "check_causal_linear_recurrence",
    "check_chunked_linear_attention",
]


def _phi(x: Tensor) -> Tensor:
    return F.elu(x) + 1


def _with_and_without_eps(hint: str, fn) -> list[Mistake]:
    """The mistake ``fn(..., eps=...)`` twice: with the optional eps and without it."""
    return [
        Mistake(hint, functools.partial(fn, eps=1e-6)),
        Mistake(hint, functools.partial(fn, eps=0.0)),
    ]


def _qkv(i: int, j: int, d: int, e: int, seed: int, scale: float = 1.0):
    g = generator(seed)
    q = scale * torch.randn(i, d, generator=g, dtype=torch.float64)
    k = scale * torch.randn(j, d, generator=g, dtype=torch.float64)
    v = torch.randn(j, e, generator=g, dtype=torch.float64)
    return q, k, v


# --------------------------------------------------------------------------- kernel


def _linear(q, k, v):
    return linear_attention(q, k, v)


def _linear_no_eps(q, k, v):
    return linear_attention(q, k, v, eps=0.0)


def _normalised(phi_q, phi_k, v, eps):
    return (phi_q @ (phi_k.T @ v)) / (phi_q @ phi_k.sum(0) + eps).unsqueeze(-1)


def _linear_unnormalised(q, k, v, eps):
    return _phi(q) @ (_phi(k).T @ v)


def _linear_without_features(q, k, v, eps):
    return _normalised(q, k, v, eps)


def _linear_elu_only(q, k, v, eps):
    return _normalised(F.elu(q), F.elu(k), v, eps)


def _softmax_attention(q, k, v):
    return softmax(q @ k.T / math.sqrt(q.shape[-1])) @ v


def _unscaled_softmax(q, k, v):
    return softmax(q @ k.T) @ v


def _kernel_cases() -> list[Case]:
    return [
        Case(name, _qkv(*sizes, scale=scale), also_accept=_linear_no_eps)
        for name, sizes, scale in (
            ("3 queries, 5 keys, d = 4, e = 2", (3, 5, 4, 2, 0), 1.0),
            ("6 queries, 6 keys, d = 3, e = 5", (6, 6, 3, 5, 1), 1.0),
            ("large entries (scale 4)", (4, 7, 4, 3, 2), 4.0),
        )
    ]


def check_linear_attention(fn) -> None:
    r"""Check ``fn(q, k, v)``: non-causal linear attention with
    :math:`\varphi(x) = \operatorname{elu}(x) + 1`.

    ``q`` ``(i, d)``, ``k`` ``(j, d)``, ``v`` ``(j, e)``; ``fn`` returns ``(i, e)``:
    :math:`o_i = \varphi(q_i)^\top S / (\varphi(q_i)^\top z)` with
    :math:`S = \varphi(K)^\top V` ``(d, e)`` and :math:`z = \sum_j \varphi(k_j)`
    ``(d,)``, an optional :math:`\varepsilon = 10^{-6}` added to the denominator.

    Known mistakes are named: the normaliser left out, the feature map left out or
    without its ``+ 1``, softmax attention instead of the kernel.

    Example:
        >>> def my_linear_attention(q, k, v):
        ...     phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
        ...     S, z = phi_k.T @ v, phi_k.sum(0)
        ...     return (phi_q @ S) / (phi_q @ z + 1e-6).unsqueeze(-1)
        >>> check_linear_attention(my_linear_attention)  # doctest: +ELLIPSIS
        ✓ my_linear_attention: phi(q)^T S / phi(q)^T z, elu + 1 (3 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _linear,
        _kernel_cases(),
        what="phi(q)^T S / phi(q)^T z, elu + 1",
        mistakes=[
            *_with_and_without_eps(
                "the normaliser is missing: divide phi(q_i)^T S by phi(q_i)^T z, "
                "z the sum of phi(k_j)",
                _linear_unnormalised,
            ),
            *_with_and_without_eps(
                "the feature map is missing: apply phi(x) = elu(x) + 1 to q and k",
                _linear_without_features,
            ),
            *_with_and_without_eps(
                "phi is elu(x) + 1: the + 1 is missing (elu alone is negative below 0)",
                _linear_elu_only,
            ),
            Mistake(
                "that is softmax attention: replace exp(q . k) by phi(q) . phi(k) "
                "and use associativity",
                _softmax_attention,
            ),
            Mistake(
                "that is softmax attention (unscaled): replace exp(q . k) by "
                "phi(q) . phi(k)",
                _unscaled_softmax,
            ),
        ],
    )


# --------------------------------------------------------------------------- recurrence


def _causal(q, k, v):
    return linear_attention(q, k, v, is_causal=True)


def _causal_no_eps(q, k, v):
    return linear_attention(q, k, v, is_causal=True, eps=0.0)


def _read_before_write(q, k, v, eps):
    phi_q, phi_k = _phi(q), _phi(k)
    S = q.new_zeros(k.shape[-1], v.shape[-1])
    z = q.new_zeros(k.shape[-1])
    rows = []
    for t in range(q.shape[0]):
        rows.append((phi_q[t] @ S) / (phi_q[t] @ z + eps))
        S = S + torch.outer(phi_k[t], v[t])
        z = z + phi_k[t]
    return torch.stack(rows)


def _causal_unnormalised(q, k, v, eps):
    return linear_attention(q, k, v, is_causal=True, normalize=False)


def _not_causal(q, k, v, eps):
    return linear_attention(q, k, v, eps=eps)


def _final_normaliser(q, k, v, eps):
    phi_q, phi_k = _phi(q), _phi(k)
    numerator = linear_attention(q, k, v, is_causal=True, normalize=False)
    return numerator / (phi_q @ phi_k.sum(0) + eps).unsqueeze(-1)


def _causal_cases() -> list[Case]:
    return [
        Case(name, _qkv(n, n, *sizes, scale=scale), also_accept=_causal_no_eps)
        for name, n, sizes, scale in (
            ("6 tokens, d = 3, e = 2", 6, (3, 2, 3), 1.0),
            ("10 tokens, d = 4, e = 5", 10, (4, 5, 4), 1.0),
            ("large entries (scale 3)", 8, (4, 3, 5), 3.0),
        )
    ]


def check_causal_linear_recurrence(fn) -> None:
    r"""Check ``fn(q, k, v)``: causal linear attention computed token by token.

    For ``t = 0, 1, ...``: first write, :math:`S_t = S_{t-1} + \varphi(k_t) v_t^\top`
    and :math:`z_t = z_{t-1} + \varphi(k_t)`, then read,
    :math:`o_t = \varphi(q_t)^\top S_t / (\varphi(q_t)^\top z_t)`, from
    :math:`S_{-1} = 0`, :math:`z_{-1} = 0`. ``q``, ``k`` ``(n, d)``, ``v`` ``(n, e)``;
    ``fn`` returns the rows ``(n, e)``.

    Known mistakes are named: the read before the write (the query misses its own
    key), the normaliser left out or summed over every key, every key seen.

    Example:
        >>> def my_causal_linear_attention(q, k, v):
        ...     phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
        ...     S = q.new_zeros(k.shape[1], v.shape[1])
        ...     z = q.new_zeros(k.shape[1])
        ...     rows = []
        ...     for t in range(q.shape[0]):
        ...         S = S + torch.outer(phi_k[t], v[t])
        ...         z = z + phi_k[t]
        ...         rows.append((phi_q[t] @ S) / (phi_q[t] @ z + 1e-6))
        ...     return torch.stack(rows)
        >>> check_causal_linear_recurrence(my_causal_linear_attention)
        ... # doctest: +ELLIPSIS
        ✓ my_causal_linear_attention: write S_t and z_t, then read (3 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _causal,
        _causal_cases(),
        what="write S_t and z_t, then read",
        mistakes=[
            *_with_and_without_eps(
                "the query reads the state before its own key is written: update S "
                "and z first, then read",
                _read_before_write,
            ),
            *_with_and_without_eps(
                "the normaliser is missing: divide phi(q_t)^T S_t by phi(q_t)^T z_t",
                _causal_unnormalised,
            ),
            *_with_and_without_eps(
                "every query sees every key: causal means the keys j <= t only "
                "(running sums)",
                _not_causal,
            ),
            *_with_and_without_eps(
                "the normaliser sums every key: z_t must be a running sum, like S_t",
                _final_normaliser,
            ),
        ],
    )


# --------------------------------------------------------------------------- chunked


def _chunked(q, k, v, chunk_size):
    return linear_attention(q, k, v, is_causal=True, chunk_size=chunk_size)


def _chunked_no_eps(q, k, v, chunk_size):
    return linear_attention(q, k, v, is_causal=True, chunk_size=chunk_size, eps=0.0)


def _chunk_loop(
    q, k, v, chunk_size, eps, *, keep: int | None = 0, update_first: str | None = None
):
    """The chunked loop with one of its typical faults switched on.

    ``keep``: the tile's mask, ``tril(keep)`` (0 correct, -1 the diagonal masked too,
    None no mask). ``update_first``: None (correct), "and tile" (the chunk added to
    the state first, and its tile added too) or "state only" (the chunk added first,
    read through the state alone).
    """
    phi_q, phi_k = _phi(q), _phi(k)
    S = q.new_zeros(k.shape[1], v.shape[1])
    z = q.new_zeros(k.shape[1])
    rows = []
    for start in range(0, q.shape[0], chunk_size):
        pq, pk = phi_q[start : start + chunk_size], phi_k[start : start + chunk_size]
        vc = v[start : start + chunk_size]
        if update_first is not None:
            S, z = S + pk.T @ vc, z + pk.sum(0)
        tile = pq @ pk.T
        tile = tile if keep is None else tile.tril(keep)
        if update_first == "state only":
            tile = torch.zeros_like(tile)
        num = tile @ vc + pq @ S
        den = tile.sum(-1) + pq @ z
        rows.append(num / (den + eps).unsqueeze(-1))
        if update_first is None:
            S, z = S + pk.T @ vc, z + pk.sum(0)
    return torch.cat(rows)


def _future_in_chunk(q, k, v, chunk_size, eps):
    return _chunk_loop(q, k, v, chunk_size, eps, keep=None)


def _own_key_missing(q, k, v, chunk_size, eps):
    return _chunk_loop(q, k, v, chunk_size, eps, keep=-1)


def _state_before_read(q, k, v, chunk_size, eps):
    return _chunk_loop(q, k, v, chunk_size, eps, update_first="and tile")


def _state_before_read_alone(q, k, v, chunk_size, eps):
    return _chunk_loop(q, k, v, chunk_size, eps, update_first="state only")


def _last_chunk_dropped(q, k, v, chunk_size, eps):
    whole = (q.shape[0] // chunk_size) * chunk_size
    return linear_attention(
        q[:whole], k[:whole], v[:whole], is_causal=True, chunk_size=chunk_size, eps=eps
    )


def _chunked_unnormalised(q, k, v, chunk_size, eps):
    return linear_attention(q, k, v, is_causal=True, normalize=False)


def _chunked_not_causal(q, k, v, chunk_size, eps):
    return linear_attention(q, k, v, eps=eps)


def _chunk_case(name, n, d, e, chunk, seed, scale=1.0) -> Case:
    return Case(
        name, (*_qkv(n, n, d, e, seed, scale), chunk), also_accept=_chunked_no_eps
    )


def check_chunked_linear_attention(fn) -> None:
    r"""Check ``fn(q, k, v, chunk_size)``: causal linear attention, chunk by chunk.

    Cut the ``n`` positions into chunks of ``chunk_size`` (the last may be shorter).
    For chunk ``m`` with rows :math:`Q_m, K_m, V_m`, the numerator is
    :math:`[(\varphi(Q_m)\varphi(K_m)^\top) \odot M] V_m + \varphi(Q_m) S`, with
    :math:`M` the lower-triangular mask of the chunk (diagonal included) and :math:`S`
    the state of the earlier chunks; the denominator is the same with :math:`V_m`
    replaced by ones and :math:`S` by :math:`z`. Only then is the chunk added to the
    state: :math:`S \leftarrow S + \varphi(K_m)^\top V_m`,
    :math:`z \leftarrow z + \sum_{j \in m} \varphi(k_j)`. ``fn`` returns ``(n, e)``.

    Known mistakes are named: later keys of the chunk seen (no mask on the tile), the
    query's own key masked out, the chunk added to the state before its queries read
    it, the last shorter chunk dropped, the normaliser left out, no causal mask.

    Example:
        >>> def my_chunked_linear_attention(q, k, v, chunk_size):
        ...     phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
        ...     S = q.new_zeros(k.shape[1], v.shape[1])
        ...     z = q.new_zeros(k.shape[1])
        ...     rows = []
        ...     for a in range(0, q.shape[0], chunk_size):
        ...         pq, pk = phi_q[a : a + chunk_size], phi_k[a : a + chunk_size]
        ...         vc = v[a : a + chunk_size]
        ...         tile = (pq @ pk.T).tril()
        ...         num = tile @ vc + pq @ S
        ...         den = tile.sum(-1) + pq @ z
        ...         rows.append(num / (den + 1e-6).unsqueeze(-1))
        ...         S, z = S + pk.T @ vc, z + pk.sum(0)
        ...     return torch.cat(rows)
        >>> check_chunked_linear_attention(my_chunked_linear_attention)
        ... # doctest: +ELLIPSIS
        ✓ my_chunked_linear_attention: tiles, then the state (5 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _chunked,
        [
            _chunk_case("8 tokens, chunks of 4", 8, 3, 2, 4, seed=6),
            _chunk_case("10 tokens, chunks of 4 (a last chunk of 2)", 10, 4, 3, 4, 7),
            _chunk_case("9 tokens, chunks of 3, large entries", 9, 3, 2, 3, 8, 3.0),
            _chunk_case("7 tokens, chunks of 1", 7, 3, 2, 1, seed=9),
            _chunk_case("5 tokens, one chunk of 8", 5, 3, 2, 8, seed=10),
        ],
        what="tiles, then the state",
        mistakes=[
            *_with_and_without_eps(
                "the queries see later keys of their own chunk: mask the (c, c) tile "
                "with j <= i (tril)",
                _future_in_chunk,
            ),
            *_with_and_without_eps(
                "a query must see its own key: keep the tile's diagonal (j <= i, "
                "not j < i)",
                _own_key_missing,
            ),
            *_with_and_without_eps(
                "the chunk is added to the state before its queries read it: read S "
                "and z first, then add phi(K_m)^T V_m",
                _state_before_read,
            ),
            *_with_and_without_eps(
                "the chunk is added to the state before its queries read it, so they "
                "see its later keys: read S and z first, then add phi(K_m)^T V_m",
                _state_before_read_alone,
            ),
            *_with_and_without_eps(
                "the last, shorter chunk is missing: n need not be a multiple of "
                "chunk_size",
                _last_chunk_dropped,
            ),
            *_with_and_without_eps(
                "the normaliser is missing: divide by the same sum with ones for the "
                "values (phi(q)^T z for the state)",
                _chunked_unnormalised,
            ),
            *_with_and_without_eps(
                "every query sees every key: causal means keys j <= i only",
                _chunked_not_causal,
            ),
        ],
    )
