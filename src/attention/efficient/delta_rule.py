r"""The delta rule and the gated delta rule: a linear-attention state that corrects itself (chapters 11-12).

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` heads, ``n``
positions (queries, keys and values come as one sequence), ``d`` query/key size, ``e``
value size, ``c`` positions inside a chunk.

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

With :math:`\alpha_t = 1` it is the delta rule; dropping the :math:`\beta_t k_t k_t^\top`
term gives gated linear attention's update.

**Semantics.** Both functions compute exactly what flash-linear-attention's naive
recurrent references compute (``fla/ops/delta_rule/naive.py``,
``fla/ops/gated_delta_rule/naive.py``): the query is multiplied by ``scale`` (default
:math:`d^{-1/2}`), the keys are used as given (normalise them yourself, e.g. with
``torch.nn.functional.normalize``, as DeltaNet does before the call), the state is
``(..., d, e)`` and is read as :math:`S^\top q`, the decay is applied before the read.
The layout is the package's ``(b, h, n, d)``, not fla's ``(b, n, h, d)``.

**Two forms, one result.** ``chunk_size=None`` runs the recurrence token by token (the
reference). An integer runs the chunkwise form of :cite:`yang2024parallelizing`: inside a
chunk of ``c`` positions the ``c`` corrections :math:`u_r = \beta_r(v_r - \ldots)` depend on
each other only through a unit lower-triangular ``(c, c)`` system
:math:`(I + A)\,U = \operatorname{diag}(\beta)(V - \operatorname{diag}(\Gamma) K S_0)`,
:math:`A_{rs} = \beta_r \tfrac{\Gamma_r}{\Gamma_s} k_r \cdot k_s` for :math:`s < r`
(:math:`\Gamma_r = \prod_{s \le r} \alpha_s`), solved once per chunk for all chunks at
once: the WY/UT representation. What remains sequential is one matmul-sized state update
per chunk, so training runs on matrix units instead of a ``n``-step loop. Any ``n``
works: the last chunk is padded with ``beta = 0``, ``g = 0`` positions, which leave the
state unchanged.

**Bad input.** ``beta`` must lie in ``[0, 1]`` (a step size of least-mean-squares on
:math:`\tfrac12\lVert S^\top k - v\rVert^2`; with a unit-norm key, ``beta = 1`` overwrites the
stored value, and ``beta`` in ``[0, 1]`` keeps :math:`I - \beta k k^\top` a contraction
with non-negative eigenvalues). fla itself accepts any ``beta``; the "negative eigenvalue"
extension (``beta`` up to 2) is not taught here and is refused. ``g`` must be ``<= 0``
(a decay, not a growth). NaN passes through as in torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import (
    check_has_data,
    check_same_device,
    check_same_dtype,
    check_size,
    check_tensor,
)
from .._core import default_scale

__all__ = ["delta_rule_attention", "gated_delta_rule_attention"]


# --------------------------------------------------------------------------- validation


def _validate(
    query, key, value, beta, g, scale, initial_state, output_final_state, chunk_size
):
    check_tensor("query", query, floating=True, min_dim=2)
    check_tensor("key", key, floating=True, min_dim=2)
    check_tensor("value", value, floating=True, min_dim=2)
    check_tensor("beta", beta, floating=True, min_dim=1)
    check_same_dtype(
        query=query, key=key, value=value, beta=beta, g=g, initial_state=initial_state
    )
    check_same_device(
        query=query, key=key, value=value, beta=beta, g=g, initial_state=initial_state
    )
    if query.shape != key.shape:
        raise ValueError(
            f"query and key must have the same shape (..., n, d), got {tuple(query.shape)} "
            f"and {tuple(key.shape)}"
        )
    if value.shape[:-1] != key.shape[:-1]:
        raise ValueError(
            f"value must have the shape (..., n, e) of key but its last dim, got "
            f"{tuple(value.shape)} for key {tuple(key.shape)}"
        )
    if beta.shape != key.shape[:-1]:
        raise ValueError(
            f"beta must have shape (..., n) = {tuple(key.shape[:-1])}, got {tuple(beta.shape)}"
        )
    check_has_data("beta", beta)
    if ((beta < 0) | (beta > 1)).any():
        raise ValueError(
            "beta must lie in [0, 1] (the step size of the delta rule), got values from "
            f"{beta.detach().min().item():.4g} to {beta.detach().max().item():.4g}"
        )
    if g is not None:
        check_tensor("g", g, floating=True, min_dim=1)
        if g.shape != key.shape[:-1]:
            raise ValueError(
                f"g must have shape (..., n) = {tuple(key.shape[:-1])}, got {tuple(g.shape)}"
            )
        check_has_data("g", g)
        if (g > 0).any():
            raise ValueError(
                "g is the log of the decay alpha = exp(g) in (0, 1] and must be <= 0, got a "
                f"maximum of {g.detach().max().item():.4g}"
            )
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, int | float)
    ):
        raise TypeError(
            f"scale must be a float or None, got {type(scale).__name__} {scale!r}"
        )
    if initial_state is not None:
        check_tensor("initial_state", initial_state, floating=True, min_dim=2)
        want = (*key.shape[:-2], key.shape[-1], value.shape[-1])
        if tuple(initial_state.shape) != want:
            raise ValueError(
                f"initial_state must have shape (..., d, e) = {want}, got "
                f"{tuple(initial_state.shape)}"
            )
    if not isinstance(output_final_state, bool):
        raise TypeError(
            f"output_final_state must be a bool, got {output_final_state!r}"
        )
    if chunk_size is not None:
        check_size("chunk_size", chunk_size)


# --------------------------------------------------------------------------- the two forms


def _recurrent(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, state: Tensor
) -> tuple[Tensor, Tensor]:
    """Token by token; ``q`` already scaled. Returns ``(o (..., n, e), S (..., d, e))``."""
    outputs = []
    for t in range(q.shape[-2]):
        if g is not None:
            state = state * g[..., t, None, None].exp()  # decay first
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
    """The WY/UT chunkwise form; ``q`` already scaled. Same returns as :func:`_recurrent`."""
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

    seen = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril_()  # s <= r
    diff = gamma.unsqueeze(-1) - gamma.unsqueeze(
        -2
    )  # (..., N, c, c) log Gamma_r / Gamma_s
    decay = diff.masked_fill(
        ~seen, -math.inf
    ).exp()  # (..., N, c, c), 0 above the diagonal
    diagonal = torch.eye(chunk, dtype=torch.bool, device=q.device)  # (c, c)
    strict = decay.masked_fill(diagonal, 0.0)  # (..., N, c, c) s < r
    a = (
        bc.unsqueeze(-1) * strict * (kc @ kc.transpose(-2, -1))
    )  # (..., N, c, c) strictly lower
    # (I + A) U = diag(beta) V - diag(beta Gamma) K S_0: solve for both right-hand sides.
    rhs = torch.cat(
        [bc.unsqueeze(-1) * vc, (bc * gamma.exp()).unsqueeze(-1) * kc], dim=-1
    )
    solved = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    u_tilde, w = solved[..., :e], solved[..., e:]  # (..., N, c, e), (..., N, c, d)
    qk = (qc @ kc.transpose(-2, -1)) * decay  # (..., N, c, c)
    last = gamma[..., -1:]  # (..., N, 1) log Gamma_c

    outputs = []
    for m in range(chunks):
        u = u_tilde[..., m, :, :] - w[..., m, :, :] @ state  # (..., c, e)
        inter = gamma[..., m, :].exp().unsqueeze(-1) * (
            qc[..., m, :, :] @ state
        )  # (..., c, e)
        outputs.append(inter + qk[..., m, :, :] @ u)  # (..., c, e)
        carry = (last[..., m, :] - gamma[..., m, :]).exp().unsqueeze(-1)  # (..., c, 1)
        state = (
            last[..., m, :].exp().unsqueeze(-1) * state
            + (kc[..., m, :, :] * carry).transpose(-2, -1) @ u
        )  # (..., d, e)
    out = torch.stack(outputs, dim=-3).reshape(*batch, chunks * chunk, e)[..., :n, :]
    return out, state


def _run(
    name,
    query,
    key,
    value,
    beta,
    g,
    scale,
    initial_state,
    output_final_state,
    chunk_size,
):
    _validate(
        query, key, value, beta, g, scale, initial_state, output_final_state, chunk_size
    )
    q = query * default_scale(scale, query.shape[-1])
    if initial_state is None:
        state = value.new_zeros(*key.shape[:-2], key.shape[-1], value.shape[-1])
    else:
        state = initial_state
    if chunk_size is None:
        out, state = _recurrent(q, key, value, beta, g, state)
    else:
        out, state = _chunkwise(q, key, value, beta, g, state, chunk_size)
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

    Exactly fla's ``delta_rule_recurrence`` (module docstring): the query is multiplied by
    ``scale``, the keys are used as given.

    Args:
        query: ``(..., n, d)``, e.g. ``(b, h, n, d)``.
        key: ``(..., n, d)``, used as given (normalise it first for DeltaNet's behaviour).
        value: ``(..., n, e)``.
        beta: ``(..., n)``, the step size of each write, in ``[0, 1]``.
        scale: multiplies the query; default :math:`d^{-1/2}`.
        initial_state: ``(..., d, e)`` state before the first token; default zeros.
        output_final_state: also return the state after the last token.
        chunk_size: ``None`` for the token-by-token recurrence; an int ``>= 1`` for the
            chunkwise WY/UT form (equal up to rounding; ``n`` need not be a multiple).

    Returns:
        ``(..., n, e)``; with ``output_final_state``, the pair ``(output, state)`` with
        ``state`` of shape ``(..., d, e)``. Splitting a sequence in two and passing the
        first half's final state as the second half's ``initial_state`` gives the outputs
        of the whole.

    Example:
        >>> k = torch.eye(2)[None]  # two orthonormal keys, one head
        >>> v = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
        >>> out, S = delta_rule_attention(k, k, v, torch.ones(1, 2), scale=1.0,
        ...                               output_final_state=True)
        >>> S.tolist()  # beta = 1 with orthonormal keys: each value stored exactly
        [[[1.0, 2.0], [3.0, 4.0]]]
        >>> torch.allclose(delta_rule_attention(k, k, v, torch.ones(1, 2), chunk_size=1),
        ...                delta_rule_attention(k, k, v, torch.ones(1, 2)))
        True
    """
    return _run(
        "delta_rule_attention",
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
    r"""Causal attention with the gated delta rule (Gated DeltaNet): decay, then correct.

    .. math::

        S_t = e^{g_t} S_{t-1} + \beta_t\, k_t \big(v_t - e^{g_t} S_{t-1}^\top k_t\big)^\top
            = e^{g_t} (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top, \qquad
        o_t = S_t^\top (s\, q_t).

    Exactly fla's ``naive_recurrent_gated_delta_rule`` (module docstring), in the
    ``(b, h, n, d)`` layout. ``g = 0`` everywhere gives :func:`delta_rule_attention`.

    Args:
        query, key, value, beta, scale, initial_state, output_final_state, chunk_size: as
            in :func:`delta_rule_attention`.
        g: ``(..., n)``, the log of the decay :math:`\alpha_t = e^{g_t}`; must be ``<= 0``.

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
        "gated_delta_rule_attention",
        query,
        key,
        value,
        beta,
        g,
        scale,
        initial_state,
        output_final_state,
        chunk_size,
    )
