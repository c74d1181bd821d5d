r"""The delta rule family: a linear state that corrects itself (chapters 11 and 12).

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` heads, ``n``
positions (queries, keys and values come as one sequence), ``d`` query/key size, ``e``
value size, ``c`` positions inside a chunk; for Kimi Delta Attention, ``h_v`` value
heads (a multiple of ``h``).

Causal linear attention keeps a state :math:`S \in \mathbb{R}^{d \times e}` and *adds*
:math:`k_t v_t^\top` to it. The delta rule :cite:`schlag2021linear` writes the
*correction* instead: the state first reads what it stores under :math:`k_t`,
:math:`S_{t-1}^\top k_t`, and moves it a step :math:`\beta_t` towards :math:`v_t`
(Widrow and Hoff's least-mean-squares rule):

.. math::

    S_t = S_{t-1} + \beta_t\, k_t \big(v_t - S_{t-1}^\top k_t\big)^\top
        = (I - \beta_t k_t k_t^\top)\, S_{t-1} + \beta_t k_t v_t^\top,
    \qquad o_t = S_t^\top (s\, q_t).

The gated delta rule :cite:`yang2025gated` first decays the state by
:math:`\alpha_t = e^{g_t} \in (0, 1]`:

.. math::

    S_t = \alpha_t (I - \beta_t k_t k_t^\top)\, S_{t-1} + \beta_t k_t v_t^\top.

With :math:`\alpha_t = 1` it is the delta rule; dropping the
:math:`\beta_t k_t k_t^\top` term gives gated linear attention's update.

**Semantics.** Every function here computes exactly what flash-linear-attention's naive
recurrent references compute (``fla/ops/delta_rule/naive.py``,
``fla/ops/gated_delta_rule/naive.py``, ``fla/ops/kda/naive.py``): the query is
multiplied by ``scale`` (default :math:`d^{-1/2}`), the keys are used as given
(normalise them yourself, e.g. with ``torch.nn.functional.normalize``, as DeltaNet does
before the call), the state is ``(..., d, e)`` and is read as :math:`S^\top q`, the
decay is applied before the read.
The layout is the package's ``(b, h, n, d)``, not fla's ``(b, n, h, d)``.

**Two forms, one result.** ``chunk_size=None`` runs the recurrence token by token (the
reference). An integer runs the chunkwise form of :cite:`yang2024parallelizing`: inside
a chunk of ``c`` positions the ``c`` corrections :math:`u_r = \beta_r(v_r - \ldots)`
depend on each other only through a unit lower-triangular ``(c, c)`` system
:math:`(I + A)\,U = \operatorname{diag}(\beta)(V - \operatorname{diag}(\Gamma) K S_0)`,
:math:`A_{rs} = \beta_r \tfrac{\Gamma_r}{\Gamma_s} k_r \cdot k_s` for :math:`s < r`
(:math:`\Gamma_r = \prod_{s \le r} \alpha_s`), solved once per chunk for all chunks at
once: the WY/UT representation. What remains sequential is one matmul-sized state update
per chunk, so training runs on matrix units instead of a ``n``-step loop. Any ``n``
works: the last chunk is padded with ``beta = 0``, ``g = 0`` positions, which leave the
state unchanged; a ``chunk_size`` longer than the sequence is cut to it. A row of the
chunkwise form sees only what the recurrence has seen: a NaN key or value at position
``p`` makes rows ``>= p`` NaN and leaves the earlier rows of its chunk alone (the masked
entries are selected away with ``torch.where`` and masked matmuls, never multiplied by
zero, since ``0 * nan`` is NaN). float16 and bfloat16 inputs are computed in float32, as
fla's references compute them, and the output and the state are returned in the input
dtype (the state too, so that it chains): CPU torch has no half-precision triangular
solve, and a state summed in half precision drifts.

:func:`kimi_delta_attention` (KDA; Kimi Team, "Kimi Linear", 2025, arXiv:2510.26692)
gives the decay one rate per key channel, :math:`\operatorname{Diag}(e^{g_t})` with
:math:`g_t \in \mathbb{R}^d`, instead of one per head; its section below holds its math.

**Bad input.** ``beta`` must lie in ``[0, 1]`` (a step size of least-mean-squares on
:math:`\tfrac12\lVert S^\top k - v\rVert^2`; with a unit-norm key, ``beta = 1``
overwrites the stored value, and ``beta`` in ``[0, 1]`` keeps :math:`I - \beta k k^\top`
a contraction with non-negative eigenvalues). fla itself accepts any ``beta``; the
"negative eigenvalue" extension (``beta`` up to 2) is not taught here and is refused.
``g`` must be ``<= 0`` (a decay, not a growth). NaN passes through as in torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import (
    check_bool,
    check_has_data,
    check_initial_state,
    check_same_device,
    check_same_dtype,
    check_scale,
    check_size,
    check_tensor,
)
from .._core import default_scale, matmul_skipping, tril_mask

__all__ = ["delta_rule_attention", "gated_delta_rule_attention", "kimi_delta_attention"]

# computed in float32 and returned in their own dtype (see the module docstring)
_HALF = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------- validation


def _check_tensors(query, key, value, beta, g, initial_state, *, g_dim: int) -> None:
    """Types first (a list or None is a TypeError here, not an AttributeError later),
    then one dtype and one device for all of them."""
    check_tensor("query", query, floating=True, min_dim=2)
    check_tensor("key", key, floating=True, min_dim=2)
    check_tensor("value", value, floating=True, min_dim=2)
    check_tensor("beta", beta, floating=True, min_dim=1)
    if g is not None:
        check_tensor("g", g, floating=True, min_dim=g_dim)
    if initial_state is not None:
        check_tensor("initial_state", initial_state, floating=True, min_dim=2)
    check_same_dtype(
        query=query, key=key, value=value, beta=beta, g=g, initial_state=initial_state
    )
    check_same_device(
        query=query, key=key, value=value, beta=beta, g=g, initial_state=initial_state
    )


def _check_values(beta: Tensor, g: Tensor | None) -> None:
    """``beta`` in ``[0, 1]`` and ``g <= 0`` (NaN passes, as in torch)."""
    check_has_data("beta", beta)
    if ((beta < 0) | (beta > 1)).any():
        raise ValueError(
            "beta must lie in [0, 1] (the step size of the delta rule), got values "
            f"from {beta.detach().min().item():.4g} to {beta.detach().max().item():.4g}"
        )
    if g is not None:
        check_has_data("g", g)
        if (g > 0).any():
            raise ValueError(
                "g is the log of the decay alpha = exp(g) in (0, 1] and must be <= 0, "
                f"got a maximum of {g.detach().max().item():.4g}"
            )


def _check_options(scale, output_final_state, chunk_size) -> None:
    check_scale(scale)
    check_bool("output_final_state", output_final_state)
    if chunk_size is not None:
        check_size("chunk_size", chunk_size)


def _validate(
    query, key, value, beta, g, scale, initial_state, output_final_state, chunk_size
):
    _check_tensors(query, key, value, beta, g, initial_state, g_dim=1)
    if query.shape != key.shape:
        raise ValueError(
            "query and key must have the same shape (..., n, d), got "
            f"{tuple(query.shape)} and {tuple(key.shape)}"
        )
    if value.shape[:-1] != key.shape[:-1]:
        raise ValueError(
            f"value must have the shape (..., n, e) of key but its last dim, got "
            f"{tuple(value.shape)} for key {tuple(key.shape)}"
        )
    if beta.shape != key.shape[:-1]:
        raise ValueError(
            f"beta must have shape (..., n) = {tuple(key.shape[:-1])}, got "
            f"{tuple(beta.shape)}"
        )
    if g is not None and g.shape != key.shape[:-1]:
        raise ValueError(
            f"g must have shape (..., n) = {tuple(key.shape[:-1])}, got "
            f"{tuple(g.shape)}"
        )
    _check_values(beta, g)
    _check_options(scale, output_final_state, chunk_size)
    state_shape = (*key.shape[:-2], key.shape[-1], value.shape[-1])  # (..., d, e)
    check_initial_state(initial_state, state_shape, query)


# ----------------------------------------------------------------------- the two forms


def _recurrent(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, state: Tensor
) -> tuple[Tensor, Tensor]:
    """Token by token; ``q`` already scaled. Returns ``(o (..., n, e), S (..., d, e))``.

    ``g`` is one log-decay per head, ``(..., n)``, or one per key channel (a row of the
    state), ``(..., n, d)`` for KDA.
    """
    outputs = []
    for t in range(q.shape[-2]):
        if g is not None:  # decay first
            if g.dim() == q.dim():  # (..., d, 1): one rate per row of the state
                log_decay = g[..., t, :, None]
            else:  # (..., 1, 1): one rate per head
                log_decay = g[..., t, None, None]
            state = state * log_decay.exp()
        k_t = k[..., t, :]  # (..., d)
        read = (k_t.unsqueeze(-1) * state).sum(-2)  # (..., e) = S^T k_t
        u = beta[..., t, None] * (v[..., t, :] - read)  # (..., e) the correction
        state = state + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # (..., d, e)
        outputs.append(
            (q[..., t, :].unsqueeze(-1) * state).sum(-2)
        )  # (..., e) = S^T q_t
    if not outputs:
        return v.new_zeros(v.shape), state
    return torch.stack(outputs, dim=-2), state


def _chunkwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    state: Tensor,
    chunk: int,
) -> tuple[Tensor, Tensor]:
    """The WY/UT chunkwise form; ``q`` is already scaled.

    Returns as :func:`_recurrent` does.
    """
    n, d, e = q.shape[-2], q.shape[-1], v.shape[-1]
    if g is None:
        g = beta.new_zeros(beta.shape)
    # alpha = exp(g) = 0 (g = -inf) would give -inf - -inf = NaN in the differences of
    # cumulative sums below; exp(-1000) is already 0 in every floating dtype, so the
    # clamp changes no product and keeps the differences finite.
    g = g.clamp(min=-1000.0)
    chunks = max(1, math.ceil(n / chunk))
    pad = chunks * chunk - n
    if pad:  # beta = 0 and g = 0 positions leave the state unchanged
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    batch = q.shape[:-2]
    qc = q.reshape(*batch, chunks, chunk, d)  # (..., N, c, d)
    kc = k.reshape(*batch, chunks, chunk, d)  # (..., N, c, d)
    vc = v.reshape(*batch, chunks, chunk, e)  # (..., N, c, e)
    bc = beta.reshape(*batch, chunks, chunk)  # (..., N, c)
    gamma = g.reshape(*batch, chunks, chunk).cumsum(
        -1
    )  # (..., N, c) log Gamma_r in the chunk

    seen = tril_mask(chunk, chunk, device=q.device)  # (c, c) s <= r
    strict = tril_mask(chunk, chunk, offset=-1, device=q.device)  # (c, c) s < r
    diff = gamma.unsqueeze(-1) - gamma.unsqueeze(
        -2
    )  # (..., N, c, c) log Gamma_r / Gamma_s
    decay = diff.masked_fill(
        ~seen, -math.inf
    ).exp()  # (..., N, c, c), 0 above the diagonal
    # torch.where, not a product with a 0/1 mask: 0 * nan is NaN, and a NaN key at s
    # must not reach a row r < s (rows see only what the recurrence has seen).
    kk = kc @ kc.transpose(-2, -1)  # (..., N, c, c)
    a = torch.where(strict, bc.unsqueeze(-1) * decay * kk, 0.0)  # strictly lower
    # (I + A) U = diag(beta) V - diag(beta Gamma) K S_0: solve for both right-hand
    # sides.
    rhs = torch.cat(
        [bc.unsqueeze(-1) * vc, (bc * gamma.exp()).unsqueeze(-1) * kc], dim=-1
    )
    solved = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    u_tilde, w = solved[..., :e], solved[..., e:]  # (..., N, c, e), (..., N, c, d)
    qk = torch.where(seen, (qc @ kc.transpose(-2, -1)) * decay, 0.0)  # (..., N, c, c)
    last = gamma[..., -1:]  # (..., N, 1) log Gamma_c

    outputs = []
    for m in range(chunks):
        u = u_tilde[..., m, :, :] - w[..., m, :, :] @ state  # (..., c, e)
        inter = gamma[..., m, :].exp().unsqueeze(-1) * (
            qc[..., m, :, :] @ state
        )  # (..., c, e)
        # a later row of u may be NaN: the masked matmul keeps it out of earlier rows
        outputs.append(inter + matmul_skipping(qk[..., m, :, :], u, ~seen))
        carry = (last[..., m, :] - gamma[..., m, :]).exp().unsqueeze(-1)  # (..., c, 1)
        state = (
            last[..., m, :].exp().unsqueeze(-1) * state
            + (kc[..., m, :, :] * carry).transpose(-2, -1) @ u
        )  # (..., d, e)
    out = torch.stack(outputs, dim=-3).reshape(*batch, chunks * chunk, e)[..., :n, :]
    return out, state


def _forms(q, k, v, beta, g, state, chunk_size, chunkwise) -> tuple[Tensor, Tensor]:
    """The recurrence (``chunk_size=None``) or ``chunkwise``; half precision in float32.

    A ``chunk_size`` longer than the sequence is cut to it, so it never allocates
    ``(c, c)`` tiles beyond the ``n`` positions there are.
    """
    dtype = q.dtype
    if dtype in _HALF:
        q, k, v, beta, state = (x.float() for x in (q, k, v, beta, state))
        g = None if g is None else g.float()
    if chunk_size is None:
        out, state = _recurrent(q, k, v, beta, g, state)
    else:
        chunk = min(chunk_size, max(1, q.shape[-2]))
        out, state = chunkwise(q, k, v, beta, g, state, chunk)
    return out.to(dtype), state.to(dtype)


def _run(
    query, key, value, beta, g, scale, initial_state, output_final_state, chunk_size
):
    _validate(
        query, key, value, beta, g, scale, initial_state, output_final_state, chunk_size
    )
    q = query * default_scale(scale, query.shape[-1])
    if initial_state is None:
        state = value.new_zeros(*key.shape[:-2], key.shape[-1], value.shape[-1])
    else:
        state = initial_state
    out, state = _forms(q, key, value, beta, g, state, chunk_size, _chunkwise)
    return (out, state) if output_final_state else out


# --------------------------------------------------------------------------- public


def delta_rule_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Causal attention with the delta rule (DeltaNet): the state stores corrections.

    .. math::

        S_t = S_{t-1} + \beta_t\, k_t \big(v_t - S_{t-1}^\top k_t\big)^\top, \qquad
        o_t = S_t^\top (s\, q_t), \qquad S_0 = \text{initial\_state or } 0.

    Exactly fla's ``delta_rule_recurrence`` (module docstring): the query is multiplied
    by ``scale``, the keys are used as given.

    Args:
        query: ``(..., n, d)``, e.g. ``(b, h, n, d)``.
        key: ``(..., n, d)``, used as given (normalise it first for DeltaNet's
            behaviour).
        value: ``(..., n, e)``.
        beta: ``(..., n)``, the step size of each write, in ``[0, 1]``.
        scale: multiplies the query; default :math:`d^{-1/2}`.
        initial_state: ``(..., d, e)`` state before the first token; default zeros.
        output_final_state: also return the state after the last token.
        chunk_size: ``None`` for the token-by-token recurrence; an int ``>= 1`` for the
            chunkwise WY/UT form (equal up to rounding; ``n`` need not be a multiple; a
            chunk longer than ``n`` is cut to ``n``).

    Returns:
        ``(..., n, e)``; with ``output_final_state``, the pair ``(output, state)`` with
        ``state`` of shape ``(..., d, e)``. Splitting a sequence in two and passing the
        first half's final state as the second half's ``initial_state`` gives the
        outputs of the whole.

    Example:
        >>> k = torch.eye(2)[None]  # two orthonormal keys, one head
        >>> v = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
        >>> out, S = delta_rule_attention(k, k, v, torch.ones(1, 2), scale=1.0,
        ...                               output_final_state=True)
        >>> S.tolist()  # beta = 1 with orthonormal keys: each value stored exactly
        [[[1.0, 2.0], [3.0, 4.0]]]
        >>> b = torch.ones(1, 2)
        >>> torch.allclose(delta_rule_attention(k, k, v, b, chunk_size=1),
        ...                delta_rule_attention(k, k, v, b))
        True
    """
    return _run(
        query,
        key,
        value,
        beta,
        None,
        scale,
        initial_state,
        output_final_state,
        chunk_size,
    )


def gated_delta_rule_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    beta: Tensor,
    g: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Causal attention by the gated delta rule (Gated DeltaNet): decay, then correct.

    .. math::

        S_t = e^{g_t} S_{t-1}
              + \beta_t\, k_t \big(v_t - e^{g_t} S_{t-1}^\top k_t\big)^\top
            = e^{g_t} (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top, \qquad
        o_t = S_t^\top (s\, q_t).

    Exactly fla's ``naive_recurrent_gated_delta_rule`` (module docstring), in the
    ``(b, h, n, d)`` layout. ``g = 0`` everywhere gives :func:`delta_rule_attention`.

    Args:
        query, key, value, beta, scale, initial_state, output_final_state, chunk_size:
            as in :func:`delta_rule_attention`.
        g: ``(..., n)``, the log of the decay :math:`\alpha_t = e^{g_t}`; must be
            ``<= 0``.

    Returns:
        As :func:`delta_rule_attention`.

    Example:
        >>> q, k, v = torch.randn(1, 5, 3), torch.randn(1, 5, 3), torch.randn(1, 5, 2)
        >>> beta, g = torch.full((1, 5), 0.5), torch.full((1, 5), -0.1)
        >>> a = gated_delta_rule_attention(q, k, v, beta, g)
        >>> b = gated_delta_rule_attention(q, k, v, beta, g, chunk_size=2)
        >>> torch.allclose(a, b, atol=1e-5)
        True
    """
    if g is None:
        raise TypeError(
            "g must be a tensor (..., n) of log-decays; for no decay use "
            "delta_rule_attention"
        )
    return _run(
        query, key, value, beta, g, scale, initial_state, output_final_state, chunk_size
    )


# ---------------------------------------------------------------- Kimi Delta Attention


def _validate_kda(
    query, key, value, g, beta, scale, initial_state, output_final_state, chunk_size
) -> int:
    """The boundary checks of :func:`kimi_delta_attention`; returns the group size
    ``G = h_v / h`` (1 when every query/key head has its own value head)."""
    _check_tensors(query, key, value, beta, g, initial_state, g_dim=2)
    if g is None:
        raise TypeError(
            "g must be a tensor (..., h_v, n, d) of per-channel "
            "log-decays; for one decay per head use "
            "gated_delta_rule_attention"
        )
    if query.shape != key.shape:
        raise ValueError(
            f"query and key must have the same shape (..., h, n, d), got "
            f"{tuple(query.shape)} and {tuple(key.shape)}"
        )
    if value.shape[:-1] == key.shape[:-1]:
        group = 1
    elif (
        value.dim() == key.dim() >= 3
        and value.shape[:-3] == key.shape[:-3]
        and value.shape[-2] == key.shape[-2]
        and key.shape[-3] > 0
        and value.shape[-3] % key.shape[-3] == 0
    ):
        group = value.shape[-3] // key.shape[-3]
    else:
        raise ValueError(
            "value must have shape (..., h_v, n, e) for key (..., h, n, d): the same "
            "batch dims and n, and h_v a multiple of h (grouped value heads), got "
            f"{tuple(value.shape)} for key {tuple(key.shape)}"
        )
    heads = tuple(value.shape[:-1])  # (..., h_v, n)
    if tuple(beta.shape) != heads:
        raise ValueError(
            f"beta must have shape (..., h_v, n) = {heads}, got {tuple(beta.shape)}"
        )
    if tuple(g.shape) != (*heads, key.shape[-1]):
        raise ValueError(
            f"g must have shape (..., h_v, n, d) = {(*heads, key.shape[-1])}, one "
            f"log-decay per key channel, got {tuple(g.shape)}"
        )
    _check_values(beta, g)
    _check_options(scale, output_final_state, chunk_size)
    # (..., h_v, d, e): one state per value head
    state_shape = (*value.shape[:-2], key.shape[-1], value.shape[-1])
    check_initial_state(initial_state, state_shape, query)
    return group


def _kda_chunkwise(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, state: Tensor, chunk: int
) -> tuple[Tensor, Tensor]:
    """KDA's chunkwise form (the math in :func:`kimi_delta_attention`'s docstring).

    ``q`` already scaled and ``q``, ``k`` already expanded to the value heads; ``g`` is
    ``(..., n, d)``. Same returns as :func:`_recurrent`.
    """
    n, d, e = q.shape[-2], q.shape[-1], v.shape[-1]
    chunks = max(1, math.ceil(n / chunk))
    pad = chunks * chunk - n
    if pad:  # beta = 0 and g = 0 positions leave the state unchanged
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    batch = q.shape[:-2]
    qc = q.reshape(*batch, chunks, chunk, d)  # (..., N, c, d)
    kc = k.reshape(*batch, chunks, chunk, d)  # (..., N, c, d)
    vc = v.reshape(*batch, chunks, chunk, e)  # (..., N, c, e)
    gc = g.reshape(*batch, chunks, chunk, d)  # (..., N, c, d)
    bc = beta.reshape(*batch, chunks, chunk, 1)  # (..., N, c, 1)
    pos = torch.arange(chunk, device=q.device)
    seen = pos[:, None] >= pos[None, :]  # (c, c) s <= r
    strict = pos[:, None] > pos[None, :]  # (c, c) s < r

    # The pair weights, one key position s at a time: the decay from s to r in channel
    # i is exp(sum of g_t,i over s < t <= r), a sum of log-decays (not a difference of
    # cumulative sums), so every exponent is <= 0 and nothing can overflow.
    kk, qk = [], []
    for s in range(chunk):
        after_s = torch.where((pos > s)[:, None], gc, 0.0).cumsum(-2)  # (..., N, c, d)
        decay = after_s.masked_fill((pos < s)[:, None], -math.inf).exp()  # 0 for r < s
        k_s = kc[..., s : s + 1, :]  # (..., N, 1, d)
        kk.append((kc * decay * k_s).sum(-1))  # (..., N, c): k_r . Diag(decay) k_s
        qk.append((qc * decay * k_s).sum(-1))  # (..., N, c): q_r . Diag(decay) k_s
    # torch.where, not a 0/1 product: 0 * nan is NaN, and a NaN key at s must not reach
    # a row r < s (rows see only what the recurrence has seen).
    a = torch.where(strict, bc * torch.stack(kk, dim=-1), 0.0)  # (..., N, c, c) A
    p = torch.where(seen, torch.stack(qk, dim=-1), 0.0)  # (..., N, c, c) P

    log_in = gc.cumsum(-2)  # (..., N, c, d) gamma_r: from the chunk's start through r
    # gamma_{c/r}: the log-decays after r up to the chunk's end (exclusive suffix sums)
    log_out = F.pad(gc.flip(-2).cumsum(-2).flip(-2)[..., 1:, :], (0, 0, 0, 1))
    # (I + A) [U~, W] = diag(beta) [V, K * exp(gamma)]: both right-hand sides at once
    rhs = torch.cat([bc * vc, bc * kc * log_in.exp()], dim=-1)  # (..., N, c, e + d)
    solved = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    u_tilde, w = solved[..., :e], solved[..., e:]  # (..., N, c, e), (..., N, c, d)
    q_in = qc * log_in.exp()  # (..., N, c, d) reads the state that entered the chunk
    k_out = kc * log_out.exp()  # (..., N, c, d) writes decayed to the chunk's end
    total = log_in[..., -1, :, None].exp()  # (..., N, d, 1) the chunk's whole decay

    outputs = []
    for m in range(chunks):
        u = u_tilde[..., m, :, :] - w[..., m, :, :] @ state  # (..., c, e) corrections
        inter = q_in[..., m, :, :] @ state  # (..., c, e)
        # a later row of u may be NaN: the masked matmul keeps it out of earlier rows
        outputs.append(inter + matmul_skipping(p[..., m, :, :], u, ~seen))
        state = total[..., m, :, :] * state + k_out[..., m, :, :].transpose(-2, -1) @ u
    out = torch.stack(outputs, dim=-3).reshape(*batch, chunks * chunk, e)[..., :n, :]
    return out, state


def kimi_delta_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Kimi Delta Attention (KDA): the gated delta rule with one decay per key channel.

    .. math::

        S_t = (I - \beta_t k_t k_t^\top)\, \operatorname{Diag}(e^{g_t})\, S_{t-1}
              + \beta_t k_t v_t^\top, \qquad o_t = S_t^\top (s\, q_t),

    with :math:`g_t \in \mathbb{R}^d`, ``g <= 0``. Row ``i`` of the ``(d, e)`` state
    holds what is stored under key channel ``i``; it fades at its own rate
    :math:`e^{g_{t,i}}`. Gated DeltaNet has one rate per head; KDA lets some channels
    keep a memory for long while others forget fast. With ``g`` equal across the
    channels it is :func:`gated_delta_rule_attention`.

    Exactly fla's ``naive_recurrent_kda`` (``fla/ops/kda/naive.py``, fla-core 0.6.0):
    the decay multiplies the state *before* the read (``S = S * g_i[..., None].exp()``,
    then ``(k_i[..., None] * S).sum(-2)``); the query is multiplied by ``scale`` before
    the output read; the keys are used as given (Kimi Linear's layer L2-normalises
    ``q`` and ``k`` and builds ``g`` and ``beta`` before the call). The layout is the
    package's ``(b, h, n, d)``, not fla's ``(b, n, h, d)``.

    **Grouped value heads.** ``query`` and ``key`` may have fewer heads than ``value``:
    with ``h`` query/key heads and ``h_v = G h`` value heads, query/key head ``i``
    serves value heads ``iG, ..., iG + G - 1`` (fla's ``repeat_interleave``; the layer's
    ``num_v_heads > num_heads``). ``g``, ``beta``, the output and the state belong to
    the value heads.

    **Chunkwise form** (``chunk_size=c``). Take a chunk of positions ``r = 1 .. c``
    entered with state :math:`S`. Write :math:`\gamma_r = \sum_{t \le r} g_t` (per
    channel, from the chunk's start) and :math:`\gamma_{r/s} = \sum_{s < t \le r} g_t`
    (the decay from ``s`` to ``r``). Unrolled inside the chunk, the state after ``r`` is

    .. math::

        S_r = \operatorname{Diag}(e^{\gamma_r})\, S
              + \sum_{s \le r} \operatorname{Diag}(e^{\gamma_{r/s}})\, k_s u_s^\top,

    where :math:`u_r = \beta_r (v_r - (\operatorname{Diag}(e^{g_r}) S_{r-1})^\top k_r)`
    is the correction written at ``r``. Substituting :math:`S_{r-1}` gives one unit
    lower-triangular system for the ``c`` corrections (rows are positions):

    .. math::

        (I + A)\, U = \operatorname{diag}(\beta)\,\big(V - (K \odot E)\, S\big), \quad
        A_{rs} = \beta_r \textstyle\sum_i k_{r,i}\, k_{s,i}\, e^{\gamma_{r/s,i}}
        \ (s < r), \quad E_{r,i} = e^{\gamma_{r,i}}.

    So :math:`U = \tilde U - W S` with
    :math:`(I + A)\tilde U = \operatorname{diag}(\beta) V` and
    :math:`(I + A) W = \operatorname{diag}(\beta)(K \odot E)`: two triangular solves
    that do not depend on :math:`S`, done for all chunks at once (the UT/WY form). Then,
    chunk after chunk,

    .. math::

        O = (Q \odot E)\, S + P\, U, \quad
        P_{rs} = \textstyle\sum_i q_{r,i}\, k_{s,i}\, e^{\gamma_{r/s,i}} \ (s \le r),
        \qquad S \leftarrow \operatorname{Diag}(e^{\gamma_c})\, S + (K \odot F)^\top U,
        \quad F_{r,i} = e^{\gamma_{c/r,i}}.

    With one decay per head, :math:`A` and :math:`P` are ``(c, c)`` matmuls times a
    ``(c, c)`` decay tile. With one per channel the decay sits inside the dot product,
    so a chunk costs ``c * c * d`` products either way; here they are formed one key
    position ``s`` at a time, ``(..., c, d)`` each.

    **Numerical safety.** Factorising :math:`e^{\gamma_r - \gamma_s} =
    e^{\gamma_r} e^{-\gamma_s}` would make :math:`P` one matmul,
    :math:`(Q \odot E)(K / E)^\top`, but :math:`e^{-\gamma_s}` grows with the decay
    accumulated in the chunk and overflows float32 past about 88 (``g = -2`` for 45
    steps). fla's kernels use that factorisation only between sub-chunks of 16
    positions, with the reference point at the start of the later sub-chunk, so both
    factors are ``<= 1`` (``chunk_intra.py``); inside a sub-chunk they form each pair
    from a difference of cumulative sums (``chunk_intra_token_parallel.py``). Here
    every exponent is a *sum* of the log-decays between ``s`` and ``r``
    (:math:`\gamma_{r/s}`, :math:`\gamma_r`, :math:`\gamma_{c/r}`), never a difference,
    so every factor is :math:`e^{x}` with :math:`x \le 0`: nothing overflows for any
    ``g <= 0`` (``-inf`` included), and no digits are lost to cancellation.

    Args:
        query: ``(..., h, n, d)``.
        key: ``(..., h, n, d)``, used as given (normalise it first, as KDA does).
        value: ``(..., h_v, n, e)`` with ``h_v`` a multiple of ``h``.
        g: ``(..., h_v, n, d)``, the log of the per-channel decay; must be ``<= 0``.
        beta: ``(..., h_v, n)``, the step size of each write, in ``[0, 1]``.
        scale: multiplies the query; default :math:`d^{-1/2}`.
        initial_state: ``(..., h_v, d, e)`` state before the first token; default zeros.
        output_final_state: also return the state after the last token.
        chunk_size: ``None`` for the token-by-token recurrence (the reference); an int
            ``>= 1`` for the chunkwise form above (any ``n``: the last chunk is padded
            with ``beta = 0``, ``g = 0`` positions; a chunk longer than ``n`` is cut).

    Returns:
        ``(..., h_v, n, e)``; with ``output_final_state``, the pair ``(output, state)``
        with ``state`` of shape ``(..., h_v, d, e)``. Splitting a sequence in two and
        passing the first half's final state as the second half's ``initial_state``
        gives the outputs of the whole.

    Example:
        >>> q, k = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
        >>> k = F.normalize(k, dim=-1)
        >>> v = torch.randn(1, 4, 6, 3)  # two value heads per query/key head
        >>> g, beta = -torch.rand(1, 4, 6, 4), torch.rand(1, 4, 6)  # g: per key channel
        >>> out = kimi_delta_attention(q, k, v, g, beta)
        >>> out.shape
        torch.Size([1, 4, 6, 3])
        >>> torch.allclose(kimi_delta_attention(q, k, v, g, beta, chunk_size=4), out,
        ...                atol=1e-5)
        True
    """
    group = _validate_kda(
        query, key, value, g, beta, scale, initial_state, output_final_state, chunk_size
    )
    q = query * default_scale(scale, query.shape[-1])
    k = key
    if group > 1:  # query/key head i serves value heads i G ... i G + G - 1
        q, k = q.repeat_interleave(group, dim=-3), k.repeat_interleave(group, dim=-3)
    if initial_state is None:
        state = value.new_zeros(*value.shape[:-2], key.shape[-1], value.shape[-1])
    else:
        state = initial_state
    out, state = _forms(q, k, value, beta, g, state, chunk_size, _kda_chunkwise)
    return (out, state) if output_final_state else out
