r"""Checkers for chapter 11's exercises: one delta-rule step, the decayed (gated)
recurrence, and the chunkwise delta rule in its WY/UT form.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch11
    ch11.check_delta_rule_step(my_delta_step)

The memory is a state :math:`S` of shape ``(d, e)``: it stores values ``(e,)`` under
keys ``(d,)`` and is read with :math:`S^\top k` (``k @ S``). Inputs are float64, one
sequence (no batch or head dims); the queries are used as given (no ``1/sqrt(d)``).
Shape legend: ``n`` positions, ``d`` key size, ``e`` value size, ``c`` a chunk's length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..efficient.delta_rule import delta_rule_attention
from ._checker import Case, Mistake, check, generator

__all__ = [
    "check_delta_rule_step",
    "check_decayed_recurrence",
    "check_chunkwise_delta_rule",
]


def _unit(*shape: int, seed: int) -> Tensor:
    """Random unit vectors along the last axis, float64."""
    x = torch.randn(*shape, generator=generator(seed), dtype=torch.float64)
    return F.normalize(x, dim=-1)


def _normal(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=generator(seed), dtype=torch.float64)


# --------------------------------------------------------------------------- one step


def _step(S, k, v, beta):
    """The package's delta rule for one token, from the state ``S``."""
    beta_t = torch.full((1,), float(beta), dtype=S.dtype)
    _, state = delta_rule_attention(
        k[None], k[None], v[None], beta_t, initial_state=S, output_final_state=True
    )
    return state


def _step_sum(S, k, v, beta):
    return S + beta * torch.outer(k, v)


def _step_beta_on_everything(S, k, v, beta):
    return beta * (S + torch.outer(k, v - k @ S))


def _step_beta_on_value(S, k, v, beta):
    return S + torch.outer(k, beta * v - k @ S)


def _step_read_with_S_k(S, k, v, beta):
    return S + beta * torch.outer(k, v - S @ k)


def _step_outer_flipped(S, k, v, beta):
    return S + beta * torch.outer(v - k @ S, k)


def _step_sign_flipped(S, k, v, beta):
    return S + beta * torch.outer(k, k @ S - v)


def _step_cases() -> list[Case]:
    d, e = 4, 3
    k0 = _unit(d, seed=1)
    stored = torch.outer(k0, _normal(e, seed=2))  # k0 already holds a value
    return [
        Case(
            "empty state, unit key, beta = 1",
            (
                torch.zeros(d, e, dtype=torch.float64),
                _unit(d, seed=3),
                _normal(e, seed=4),
                1.0,
            ),
        ),
        Case(
            "a full state, unit key, beta = 0.5",
            (_normal(d, e, seed=5), _unit(d, seed=6), _normal(e, seed=7), 0.5),
        ),
        Case("a key written before, beta = 1", (stored, k0, _normal(e, seed=8), 1.0)),
        Case(
            "a key of length 2, beta = 0.3",
            (_normal(d, e, seed=9), 2 * _unit(d, seed=10), _normal(e, seed=11), 0.3),
        ),
        Case(
            "beta = 0: nothing is written",
            (_normal(d, e, seed=12), _unit(d, seed=13), _normal(e, seed=14), 0.0),
        ),
    ]


def check_delta_rule_step(fn) -> None:
    r"""Check ``fn(S, k, v, beta)``: one write of the delta rule.

    ``S`` ``(d, e)`` is the memory, ``k`` ``(d,)`` a key, ``v`` ``(e,)`` its value,
    ``beta`` a float in ``[0, 1]``. ``fn`` returns the new state
    :math:`S + \beta\, k\, (v - S^\top k)^\top`: read what the memory holds under
    :math:`k`, then write the correction, scaled by :math:`\beta`. ``S`` must not be
    changed in place.

    Known mistakes are named: the sum :math:`S + \beta k v^\top` written instead of the
    correction, :math:`\beta` put outside (on the whole state) or on the value only, the
    read :math:`S k` instead of :math:`S^\top k`, the outer product flipped, the
    correction's sign flipped.

    Example:
        >>> def my_delta_step(S, k, v, beta):
        ...     return S + beta * torch.outer(k, v - k @ S)
        >>> check_delta_rule_step(my_delta_step)  # doctest: +ELLIPSIS
        ✓ my_delta_step: S + beta k (v - S^T k)^T (5 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _step,
        _step_cases(),
        what="S + beta k (v - S^T k)^T",
        mistakes=[
            Mistake(
                "that is linear attention's sum: the delta rule writes the correction "
                "beta k (v - S^T k)^T, not beta k v^T",
                _step_sum,
            ),
            Mistake(
                "beta multiplies the whole new state: it scales the correction only, "
                "S + beta k (v - S^T k)^T",
                _step_beta_on_everything,
            ),
            Mistake(
                "beta scales the value only: it scales the whole correction, the read "
                "included, beta (v - S^T k)",
                _step_beta_on_value,
            ),
            Mistake(
                "the memory is read with S k: read it with S^T k (k @ S), S is (d, e)",
                _step_read_with_S_k,
            ),
            Mistake(
                "the write is flipped: it is the (d, e) outer product k u^T, "
                "torch.outer(k, u)",
                _step_outer_flipped,
            ),
            Mistake(
                "the correction's sign is flipped: it is v - S^T k (the value minus "
                "what the memory returns)",
                _step_sign_flipped,
            ),
        ],
    )


# --------------------------------------------------------------------------- decayed


def _decayed(q, k, v, log_alpha):
    """The parallel form: ``((Q K^T) * D) V`` with ``D[t, j] = exp(G_t - G_j)``."""
    G = log_alpha.cumsum(0)
    n = G.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    D = (G[:, None] - G[None, :]).masked_fill(~causal, -math.inf).exp()
    return ((q @ k.T) * D) @ v


def _decayed_loop(q, k, v, log_alpha, *, order="decay, write, read", factor="exp"):
    S = q.new_zeros(k.shape[1], v.shape[1])
    rows = []
    for t in range(q.shape[0]):
        a = {"exp": log_alpha[t].exp(), "log": log_alpha[t], "one": 1.0}[factor]
        if order == "decay, write, read":
            S = a * S + torch.outer(k[t], v[t])
            rows.append(q[t] @ S)
        elif order == "write, decay, read":
            S = a * (S + torch.outer(k[t], v[t]))
            rows.append(q[t] @ S)
        else:  # "read, decay, write"
            rows.append(q[t] @ S)
            S = a * S + torch.outer(k[t], v[t])
    return torch.stack(rows)


def _decay_after_write(q, k, v, log_alpha):
    return _decayed_loop(q, k, v, log_alpha, order="write, decay, read")


def _read_first(q, k, v, log_alpha):
    return _decayed_loop(q, k, v, log_alpha, order="read, decay, write")


def _log_as_factor(q, k, v, log_alpha):
    return _decayed_loop(q, k, v, log_alpha, factor="log")


def _no_decay(q, k, v, log_alpha):
    return _decayed_loop(q, k, v, log_alpha, factor="one")


def _decay_case(name, n, d, e, seed, log_alpha) -> Case:
    q, k, v = (
        _normal(n, d, seed=seed),
        _normal(n, d, seed=seed + 1),
        _normal(n, e, seed=seed + 2),
    )
    return Case(name, (q, k, v, log_alpha))


def check_decayed_recurrence(fn) -> None:
    r"""Check ``fn(q, k, v, log_alpha)``: linear attention with a gate per token.

    ``q``, ``k`` ``(n, d)``, ``v`` ``(n, e)``, ``log_alpha`` ``(n,)``, the log of the
    gates :math:`\alpha_t \in (0, 1]`. From :math:`S = 0` ``(d, e)``, for each ``t``:
    decay, :math:`S \leftarrow \alpha_t S`; write, :math:`S \leftarrow S + k_t
    v_t^\top`; read, :math:`o_t = S^\top q_t`. ``fn`` returns ``(n, e)``; the checker
    compares with the parallel form :math:`((QK^\top) \odot D) V`,
    :math:`D_{tj} = \prod_{j < r \le t} \alpha_r`.

    Known mistakes are named: the decay applied after the write (it must not touch the
    new pair), the read before the write, the log used as the factor, no decay.

    Example:
        >>> def my_decayed_attention(q, k, v, log_alpha):
        ...     S = q.new_zeros(k.shape[1], v.shape[1])
        ...     rows = []
        ...     for t in range(q.shape[0]):
        ...         S = log_alpha[t].exp() * S + torch.outer(k[t], v[t])
        ...         rows.append(q[t] @ S)
        ...     return torch.stack(rows)
        >>> check_decayed_recurrence(my_decayed_attention)  # doctest: +ELLIPSIS
        ✓ my_decayed_attention: decay, write, then read (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    gates = F.logsigmoid(_normal(8, seed=20) + 2.0)
    check(
        fn,
        _decayed,
        [
            _decay_case("8 tokens, gates near 0.9", 8, 3, 2, 21, gates),
            _decay_case(
                "6 tokens, no decay (log_alpha = 0)",
                6,
                3,
                2,
                24,
                torch.zeros(6, dtype=torch.float64),
            ),
            _decay_case(
                "7 tokens, strong decay (alpha = 0.05)",
                7,
                4,
                3,
                27,
                torch.full((7,), math.log(0.05), dtype=torch.float64),
            ),
            _decay_case(
                "10 tokens, d = 4, e = 5",
                10,
                4,
                5,
                30,
                F.logsigmoid(_normal(10, seed=33)),
            ),
        ],
        what="decay, write, then read",
        mistakes=[
            Mistake(
                "the decay is applied after the write, so it shrinks the new pair too: "
                "decay S first, then add k_t v_t^T",
                _decay_after_write,
            ),
            Mistake(
                "the query reads before its own pair is written: decay, write, then "
                "read o_t = S_t^T q_t",
                _read_first,
            ),
            Mistake(
                "the gate is given as its log: multiply by alpha_t = exp(log_alpha[t])",
                _log_as_factor,
            ),
            Mistake(
                "the decay is missing: S_t = alpha_t S_{t-1} + k_t v_t^T",
                _no_decay,
            ),
        ],
    )


# --------------------------------------------------------------------------- chunkwise


def _recurrence(q, k, v, beta, chunk_size):
    return delta_rule_attention(q[None], k[None], v[None], beta[None], scale=1.0)[0]


def _wy_chunks(
    q,
    k,
    v,
    beta,
    chunk_size,
    *,
    diagonal=-1,
    sign=1.0,
    beta_side="row",
    use_state=True,
    keep=0,
    read_after=False,
):
    """The chunkwise delta rule with one of its typical faults switched on."""
    d, e = k.shape[1], v.shape[1]
    S = q.new_zeros(d, e)
    rows = []
    for a in range(0, q.shape[0], chunk_size):
        Q, K, V, b = (x[a : a + chunk_size] for x in (q, k, v, beta))
        c = K.shape[0]
        kk = K @ K.T
        kk = b[:, None] * kk if beta_side == "row" else kk * b[None, :]
        A = torch.tril(kk, diagonal)
        T = torch.eye(c, dtype=q.dtype) + sign * A
        W = torch.linalg.solve_triangular(T, b[:, None] * K, upper=False)
        U_tilde = torch.linalg.solve_triangular(T, b[:, None] * V, upper=False)
        U = U_tilde - W @ S if use_state else U_tilde
        S_new = S + K.T @ U
        read = S_new if read_after else S
        rows.append(Q @ read + torch.tril(Q @ K.T, keep) @ U)
        S = S_new
    return torch.cat(rows)


def _with_diagonal(q, k, v, beta, chunk_size):
    return _wy_chunks(q, k, v, beta, chunk_size, diagonal=0)


def _minus_a(q, k, v, beta, chunk_size):
    return _wy_chunks(q, k, v, beta, chunk_size, sign=-1.0)


def _beta_of_column(q, k, v, beta, chunk_size):
    return _wy_chunks(q, k, v, beta, chunk_size, beta_side="column")


def _state_ignored(q, k, v, beta, chunk_size):
    return _wy_chunks(q, k, v, beta, chunk_size, use_state=False)


def _own_correction_missing(q, k, v, beta, chunk_size):
    return _wy_chunks(q, k, v, beta, chunk_size, keep=-1)


def _read_after_update(q, k, v, beta, chunk_size):
    return _wy_chunks(q, k, v, beta, chunk_size, read_after=True)


def _plain_sum(q, k, v, beta, chunk_size):
    S = q.new_zeros(k.shape[1], v.shape[1])
    rows = []
    for t in range(q.shape[0]):
        S = S + beta[t] * torch.outer(k[t], v[t])
        rows.append(q[t] @ S)
    return torch.stack(rows)


def _chunk_case(name, n, d, e, chunk, seed) -> Case:
    q, k = _normal(n, d, seed=seed), _unit(n, d, seed=seed + 1)
    v = _normal(n, e, seed=seed + 2)
    beta = torch.rand(n, generator=generator(seed + 3), dtype=torch.float64)
    return Case(name, (q, k, v, beta, chunk))


def check_chunkwise_delta_rule(fn) -> None:
    r"""Check ``fn(q, k, v, beta, chunk_size)``: the delta rule, chunk by chunk.

    ``q``, ``k`` ``(n, d)`` (unit keys), ``v`` ``(n, e)``, ``beta`` ``(n,)``; the
    queries are used as given. Cut the positions into chunks of ``chunk_size`` (the last
    may be shorter). For a chunk with rows :math:`Q, K, V`, steps :math:`\beta` and the
    state :math:`S` it enters with (zero for the first):

    .. math::

        A = \operatorname{tril}(\operatorname{diag}(\beta) K K^\top, -1), \quad
        (I + A) W = \operatorname{diag}(\beta) K, \quad
        (I + A) \tilde U = \operatorname{diag}(\beta) V, \quad
        U = \tilde U - W S,

        O = Q S + \operatorname{tril}(Q K^\top) U, \qquad S \leftarrow S + K^\top U.

    ``fn`` returns ``(n, e)``; the checker compares with the token-by-token recurrence
    (``delta_rule_attention(..., scale=1.0)``).

    Known mistakes are named: the diagonal kept in :math:`A`, :math:`I - A` for
    :math:`I + A`, :math:`\beta` of the column instead of the row, the entering state
    ignored in :math:`U`, a query's own correction masked out, the state updated before
    the chunk's queries read it, the plain sum of :math:`\beta k v^\top`.

    Example:
        >>> def my_chunkwise_delta(q, k, v, beta, chunk_size):
        ...     S = q.new_zeros(k.shape[1], v.shape[1])
        ...     rows = []
        ...     for a in range(0, q.shape[0], chunk_size):
        ...         Q, K, V, b = (x[a : a + chunk_size] for x in (q, k, v, beta))
        ...         T = torch.eye(K.shape[0], dtype=q.dtype)
        ...         T = T + torch.tril(b[:, None] * (K @ K.T), -1)
        ...         W = torch.linalg.solve_triangular(T, b[:, None] * K, upper=False)
        ...         U = torch.linalg.solve_triangular(T, b[:, None] * V, upper=False)
        ...         U = U - W @ S
        ...         rows.append(Q @ S + torch.tril(Q @ K.T) @ U)
        ...         S = S + K.T @ U
        ...     return torch.cat(rows)
        >>> check_chunkwise_delta_rule(my_chunkwise_delta)  # doctest: +ELLIPSIS
        ✓ my_chunkwise_delta: WY chunks equal the recurrence (5 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _recurrence,
        [
            _chunk_case("8 tokens, chunks of 4", 8, 4, 3, 4, seed=40),
            _chunk_case("10 tokens, chunks of 4 (a last chunk of 2)", 10, 4, 3, 4, 44),
            _chunk_case("12 tokens, chunks of 3", 12, 3, 2, 3, seed=48),
            _chunk_case("7 tokens, chunks of 1", 7, 4, 3, 1, seed=52),
            _chunk_case("5 tokens, one chunk of 8", 5, 4, 3, 8, seed=56),
        ],
        what="WY chunks equal the recurrence",
        mistakes=[
            Mistake(
                "A keeps its diagonal: A = tril(diag(beta) K K^T, -1) is strictly "
                "lower, so I + A has ones on its diagonal",
                _with_diagonal,
            ),
            Mistake(
                "the system is (I + A) U = ..., not (I - A): the earlier corrections "
                "are subtracted by moving them to the left side",
                _minus_a,
            ),
            Mistake(
                "beta belongs to the row: A[r, s] = beta_r (k_r . k_s), diag(beta) on "
                "the left of K K^T",
                _beta_of_column,
            ),
            Mistake(
                "the corrections ignore the state the chunk enters with: U = U~ - W S",
                _state_ignored,
            ),
            Mistake(
                "a query misses its own correction: the mask of Q K^T keeps the "
                "diagonal (tril, not tril(-1))",
                _own_correction_missing,
            ),
            Mistake(
                "the chunk's queries read the updated state: they read S as the chunk "
                "entered it, then S <- S + K^T U",
                _read_after_update,
            ),
            Mistake(
                "that is the sum of beta k v^T: the delta rule writes the corrections "
                "U, which depend on the state",
                _plain_sum,
            ),
        ],
    )
