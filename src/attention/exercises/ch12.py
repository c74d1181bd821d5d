"""Checkers for chapter 12's exercises: one step of the gated delta rule, one step of
Kimi Delta Attention (a decay per key channel), and one step of Titans' memory.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch12
    ch12.check_gated_delta_step(my_gated_delta_step)

Shape legend: ``d`` key size (the rows of the state), ``e`` value size (its columns).
One token of one head; every input is float64, the step size and rates are 0-dim
tensors, and the tolerance is stated in the ``✓`` line.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..efficient.delta_rule import gated_delta_rule_attention, kimi_delta_attention
from ._checker import Case, Mistake, check, randn

__all__ = ["check_gated_delta_step", "check_kda_step", "check_titans_update"]


def _scalar(x: float) -> Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _unit(*shape: int, seed: int) -> Tensor:
    x = randn(*shape, seed=seed)
    return x / x.norm()


def _scale(scale, d: int) -> float:
    return 1 / math.sqrt(d) if scale is None else scale


# -------------------------------------------------------------------------- gated delta


def _gated_delta_step(state, q, k, v, beta, g, scale=None):
    """The package's gated delta rule on one token, from ``state``."""
    out, new = gated_delta_rule_attention(
        q[None, None],
        k[None, None],
        v[None, None],
        beta.reshape(1, 1),
        g.reshape(1, 1),
        scale=scale,
        initial_state=state[None],
        output_final_state=True,
    )
    return out[0, 0], new[0]


def _gd(state, q, k, v, beta, g, scale, *, order="decay, read", decay=None, out=None):
    """A gated delta step written out, with the knobs of the known mistakes."""
    alpha = g.exp() if decay is None else decay(g)
    if order == "decay, read":  # right: read what the decayed state returns for k
        decayed = alpha * state
        new = decayed + beta * torch.outer(k, v - decayed.T @ k)
    elif order == "read, decay":  # the read taken from the state before the decay
        new = alpha * state + beta * torch.outer(k, v - state.T @ k)
    else:  # "write, decay": the whole new state decayed, the new pair included
        new = alpha * (state + beta * torch.outer(k, v - state.T @ k))
    read_from = new if out is None else out(state, alpha)
    return read_from.T @ (_scale(scale, q.shape[-1]) * q), new


def _gd_read_before_decay(state, q, k, v, beta, g, scale=None):
    return _gd(state, q, k, v, beta, g, scale, order="read, decay")


def _gd_decay_after_write(state, q, k, v, beta, g, scale=None):
    return _gd(state, q, k, v, beta, g, scale, order="write, decay")


def _gd_output_from_old_state(state, q, k, v, beta, g, scale=None):
    return _gd(state, q, k, v, beta, g, scale, out=lambda s, alpha: alpha * s)


def _gd_output_from_undecayed_state(state, q, k, v, beta, g, scale=None):
    return _gd(state, q, k, v, beta, g, scale, out=lambda s, alpha: s)


def _gd_g_as_factor(state, q, k, v, beta, g, scale=None):
    return _gd(state, q, k, v, beta, g, scale, decay=lambda g: g)


def _gd_no_decay(state, q, k, v, beta, g, scale=None):
    return _gd(state, q, k, v, beta, g, scale, decay=lambda g: torch.ones_like(g))


def _gd_no_scale(state, q, k, v, beta, g, scale=None):
    return _gd(state, q, k, v, beta, g, 1.0 if scale is None else scale)


def _gd_transposed_read(state, q, k, v, beta, g, scale=None):
    decayed = g.exp() * state
    new = decayed + beta * torch.outer(k, v - decayed @ k)
    return new @ (_scale(scale, q.shape[-1]) * q), new


def _gd_case(name, d, e, seed, *, beta=0.7, g=-0.4, scale=None, hint=""):
    state = randn(d, e, seed=seed)
    q, k, v = randn(d, seed=seed + 1), _unit(d, seed=seed + 2), randn(e, seed=seed + 3)
    kwargs = {} if scale is None else {"scale": scale}
    return Case(name, (state, q, k, v, _scalar(beta), _scalar(g)), kwargs, hint=hint)


def check_gated_delta_step(fn) -> None:
    r"""Check ``fn(state, q, k, v, beta, g, scale=None) -> (out, new_state)``.

    One token of the gated delta rule, from the state ``(d, e)`` it finds:
    :math:`S_t = \alpha (I - \beta k k^\top) S_{t-1} + \beta k v^\top` with
    :math:`\alpha = e^{g}`, ``g <= 0``. In three moves: decay the state,
    :math:`S' = \alpha S_{t-1}`; read what it returns for the key,
    :math:`r = S'^\top k`; write the correction,
    :math:`S_t = S' + \beta k (v - r)^\top`.
    Then read the output from the new state: :math:`o = S_t^\top (s\, q)`, with
    ``s = scale`` (``None``: :math:`1/\sqrt{d}`). ``q``, ``k`` are ``(d,)``, ``v``
    ``(e,)``, ``beta`` and ``g`` 0-dim tensors; ``out`` is ``(e,)``.

    The inputs: ``d = e = 4``; ``d = 4, e = 3``; ``g = 0`` (the delta rule); a strong
    decay; ``beta = 0`` (decay only); ``scale = 1``. Known mistakes are named: the read
    taken before the decay, the decay applied after the write, the output read from
    the old state, ``g`` used as the factor instead of :math:`e^g`, no decay, no
    ``1/sqrt(d)``, the state read as :math:`S k` instead of :math:`S^\top k`.

    Example:
        >>> def my_gated_delta_step(state, q, k, v, beta, g, scale=None):
        ...     scale = q.shape[-1] ** -0.5 if scale is None else scale
        ...     decayed = g.exp() * state
        ...     new = decayed + beta * torch.outer(k, v - decayed.T @ k)
        ...     return new.T @ (scale * q), new
        >>> check_gated_delta_step(my_gated_delta_step)  # doctest: +ELLIPSIS
        ✓ my_gated_delta_step: decay, read, correct, write, then read q (6 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _gated_delta_step,
        [
            _gd_case("d = e = 4", 4, 4, seed=0),
            _gd_case("d = 4, e = 3", 4, 3, seed=10),
            _gd_case("g = 0: no decay, the delta rule", 3, 5, seed=20, g=0.0),
            _gd_case(
                "a strong decay, g = -6",
                4,
                2,
                seed=30,
                g=-6.0,
                hint="exp(g) is at most 1 for g <= 0",
            ),
            _gd_case("beta = 0: the state only decays", 3, 3, seed=40, beta=0.0),
            _gd_case("scale = 1", 4, 3, seed=50, scale=1.0),
        ],
        what="decay, read, correct, write, then read q",
        outputs=("out", "new_state"),
        mistakes=[
            Mistake(
                "decay first, then read: the correction uses (alpha S)^T k, what the "
                "decayed state returns for k",
                _gd_read_before_decay,
            ),
            Mistake(
                "the decay multiplies the old state before the write; the new pair "
                "beta k v^T is written at full strength",
                _gd_decay_after_write,
            ),
            Mistake(
                "read the output from the new state S_t, after the write",
                _gd_output_from_old_state,
            ),
            Mistake(
                "read the output from the new state S_t, after the write",
                _gd_output_from_undecayed_state,
            ),
            Mistake(
                "g is the log of the decay: multiply the state by exp(g), not by g",
                _gd_g_as_factor,
            ),
            Mistake(
                "the decay is missing: multiply the state by exp(g) before the read",
                _gd_no_decay,
            ),
            Mistake(
                "the query is not scaled: multiply it by 1/sqrt(d) when scale is None",
                _gd_no_scale,
            ),
            Mistake(
                "the state is (d, e), rows for key channels: read it as S^T k and "
                "S^T q, not S k",
                _gd_transposed_read,
            ),
        ],
    )


# --------------------------------------------------------------------------- KDA


def _kda_step(state, q, k, v, g, beta, scale=None):
    """The package's Kimi Delta Attention on one token, from ``state``."""
    out, new = kimi_delta_attention(
        q[None, None],
        k[None, None],
        v[None, None],
        g[None, None],
        beta.reshape(1, 1),
        scale=scale,
        initial_state=state[None],
        output_final_state=True,
    )
    return out[0, 0], new[0]


def _kda(state, q, k, v, g, beta, scale, *, decay=None, order="decay, read", out=None):
    """A KDA step written out, with the knobs of the known mistakes."""
    decayed = state * g.exp()[:, None] if decay is None else decay(state, g)
    if order == "decay, read":
        new = decayed + beta * torch.outer(k, v - decayed.T @ k)
    elif order == "read, decay":
        new = decayed + beta * torch.outer(k, v - state.T @ k)
    else:  # "write, decay"
        new = (state + beta * torch.outer(k, v - state.T @ k)) * g.exp()[:, None]
    read_from = new if out is None else out(state, decayed)
    return read_from.T @ (_scale(scale, q.shape[-1]) * q), new


def _kda_read_before_decay(state, q, k, v, g, beta, scale=None):
    return _kda(state, q, k, v, g, beta, scale, order="read, decay")


def _kda_decay_after_write(state, q, k, v, g, beta, scale=None):
    return _kda(state, q, k, v, g, beta, scale, order="write, decay")


def _kda_mean_decay(state, q, k, v, g, beta, scale=None):
    return _kda(state, q, k, v, g, beta, scale, decay=lambda s, g: s * g.mean().exp())


def _kda_summed_decay(state, q, k, v, g, beta, scale=None):
    return _kda(state, q, k, v, g, beta, scale, decay=lambda s, g: s * g.sum().exp())


def _kda_decay_on_values(state, q, k, v, g, beta, scale=None):
    return _kda(state, q, k, v, g, beta, scale, decay=lambda s, g: s * g.exp()[None])


def _kda_output_from_old_state(state, q, k, v, g, beta, scale=None):
    return _kda(state, q, k, v, g, beta, scale, out=lambda s, decayed: decayed)


def _kda_no_scale(state, q, k, v, g, beta, scale=None):
    return _kda(state, q, k, v, g, beta, 1.0 if scale is None else scale)


def _kda_case(name, d, e, seed, g, *, beta=0.6, scale=None):
    state = randn(d, e, seed=seed)
    q, k, v = randn(d, seed=seed + 1), _unit(d, seed=seed + 2), randn(e, seed=seed + 3)
    kwargs = {} if scale is None else {"scale": scale}
    g = torch.as_tensor(g, dtype=torch.float64)
    return Case(name, (state, q, k, v, g, _scalar(beta)), kwargs)


def check_kda_step(fn) -> None:
    r"""Check ``fn(state, q, k, v, g, beta, scale=None) -> (out, new_state)``.

    One token of Kimi Delta Attention: the gated delta rule with one log-decay per key
    channel, ``g`` of shape ``(d,)`` (``<= 0``). Row ``i`` of the ``(d, e)`` state is
    what is stored under key channel ``i``; it is multiplied by :math:`e^{g_i}`:
    :math:`S' = \operatorname{Diag}(e^{g}) S_{t-1}`. Then, as in the gated delta rule,
    :math:`r = S'^\top k`, :math:`S_t = S' + \beta k (v - r)^\top` and
    :math:`o = S_t^\top (s\, q)` with ``s = scale`` (``None``: :math:`1/\sqrt{d}`).
    The arguments come in the package's order, ``g`` before ``beta``
    (:func:`attention.kimi_delta_attention`).

    The inputs: ``d = e = 4`` with four different decays; ``d = 4, e = 3``; ``g`` equal
    on every channel (gated DeltaNet); one channel that keeps everything beside
    channels that forget fast; ``beta = 0``; ``scale = 1``. Known mistakes are named:
    one decay for all channels (the mean or the sum of ``g``), the decay applied to the
    value columns, the read taken before the decay, the decay applied after the write,
    the output read from the old state, no ``1/sqrt(d)``.

    Example:
        >>> def my_kda_step(state, q, k, v, g, beta, scale=None):
        ...     scale = q.shape[-1] ** -0.5 if scale is None else scale
        ...     decayed = g.exp()[:, None] * state
        ...     new = decayed + beta * torch.outer(k, v - decayed.T @ k)
        ...     return new.T @ (scale * q), new
        >>> check_kda_step(my_kda_step)  # doctest: +ELLIPSIS
        ✓ my_kda_step: one decay per key channel, then the delta step (6 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _kda_step,
        [
            _kda_case("d = e = 4, four decays", 4, 4, 0, [-0.05, -1.0, -0.3, -2.0]),
            _kda_case("d = 4, e = 3", 4, 3, 10, [-0.5, -0.02, -1.5, -0.2]),
            _kda_case("g equal on every channel", 3, 5, 20, [-0.4, -0.4, -0.4]),
            _kda_case("channel 0 keeps all, 1-3 forget", 4, 2, 30, [0.0, -4, -4, -4]),
            _kda_case(
                "beta = 0: the state only decays", 3, 3, 40, [-1, -0.1, 0], beta=0
            ),
            _kda_case("scale = 1", 4, 3, 50, [-0.3, -0.6, -0.9, -1.2], scale=1.0),
        ],
        what="one decay per key channel, then the delta step",
        outputs=("out", "new_state"),
        mistakes=[
            Mistake(
                "g holds one log-decay per key channel: multiply row i of the state by "
                "exp(g[i]); one number for every channel is gated DeltaNet",
                _kda_mean_decay,
            ),
            Mistake(
                "g holds one log-decay per key channel: multiply row i of the state by "
                "exp(g[i]); one number for every channel is gated DeltaNet",
                _kda_summed_decay,
            ),
            Mistake(
                "the decay belongs to the key channels, the rows of the (d, e) state: "
                "multiply by exp(g)[:, None], not along the value columns",
                _kda_decay_on_values,
            ),
            Mistake(
                "decay first, then read: the correction uses (Diag(exp(g)) S)^T k, "
                "what the decayed state returns for k",
                _kda_read_before_decay,
            ),
            Mistake(
                "the decay multiplies the old state before the write; the new pair "
                "beta k v^T is written at full strength",
                _kda_decay_after_write,
            ),
            Mistake(
                "read the output from the new state S_t, after the write",
                _kda_output_from_old_state,
            ),
            Mistake(
                "the query is not scaled: multiply it by 1/sqrt(d) when scale is None",
                _kda_no_scale,
            ),
        ],
    )


# --------------------------------------------------------------------------- Titans


def _titans(weight, momentum, k, v, theta, eta, alpha, *, half=False, at=None):
    """One step of Titans' linear memory, written out, with the knobs of mistakes."""
    point = weight if at is None else at(weight, alpha)
    error = point @ k - v  # (e,)
    grad = (1 if half else 2) * torch.outer(error, k)  # of ||W k - v||^2, (e, d)
    new_momentum = eta * momentum - theta * grad
    return (1 - alpha) * weight + new_momentum, new_momentum


def _titans_step(weight, momentum, k, v, theta, eta, alpha):
    """Titans' equations: the loss ||M(k) - v||^2, its gradient at W_{t-1}."""
    return _titans(weight, momentum, k, v, theta, eta, alpha)


def _titans_half_loss(weight, momentum, k, v, theta, eta, alpha):
    return _titans(weight, momentum, k, v, theta, eta, alpha, half=True)


def _titans_at_forgotten(weight, momentum, k, v, theta, eta, alpha):
    return _titans(
        weight, momentum, k, v, theta, eta, alpha, at=lambda w, a: (1 - a) * w
    )


def _titans_gradient_ascent(weight, momentum, k, v, theta, eta, alpha):
    grad = 2 * torch.outer(weight @ k - v, k)
    new_momentum = eta * momentum + theta * grad
    return (1 - alpha) * weight + new_momentum, new_momentum


def _titans_forget_after(weight, momentum, k, v, theta, eta, alpha):
    _, new_momentum = _titans_step(weight, momentum, k, v, theta, eta, alpha)
    return (1 - alpha) * (weight + new_momentum), new_momentum


def _titans_alpha_kept(weight, momentum, k, v, theta, eta, alpha):
    _, new_momentum = _titans_step(weight, momentum, k, v, theta, eta, alpha)
    return alpha * weight + new_momentum, new_momentum


def _titans_no_momentum(weight, momentum, k, v, theta, eta, alpha):
    grad = 2 * torch.outer(weight @ k - v, k)
    return (1 - alpha) * weight - theta * grad, -theta * grad


def _titans_transposed_gradient(weight, momentum, k, v, theta, eta, alpha):
    grad = 2 * torch.outer(k, weight @ k - v)
    new_momentum = eta * momentum - theta * grad
    return (1 - alpha) * weight + new_momentum, new_momentum


def _titans_case(name, d, e, seed, *, theta=0.3, eta=0.8, alpha=0.1, zero=False):
    weight = torch.zeros(e, d, dtype=torch.float64) if zero else randn(e, d, seed=seed)
    momentum = (
        torch.zeros(e, d, dtype=torch.float64)
        if zero
        else randn(e, d, seed=seed + 1, scale=0.5)
    )
    k, v = _unit(d, seed=seed + 2), randn(e, seed=seed + 3)
    rates = (_scalar(theta), _scalar(eta), _scalar(alpha))
    return Case(name, (weight, momentum, k, v, *rates))


def check_titans_update(fn) -> None:
    r"""Check ``fn(weight, momentum, k, v, theta, eta, alpha) -> (weight, momentum)``.

    One step of Titans' linear memory :math:`\mathcal M(x) = W x`, ``weight``
    ``(e, d)``, with the paper's equations: the loss
    :math:`\ell = \lVert W k - v \rVert^2` (no
    :math:`\tfrac12`), its gradient at the previous weights,
    :math:`\nabla_W \ell = 2 (W_{t-1} k - v) k^\top`; the momentum
    :math:`\Sigma_t = \eta\, \Sigma_{t-1} - \theta\, \nabla_W \ell`; the forgetting
    :math:`W_t = (1 - \alpha) W_{t-1} + \Sigma_t`. ``k`` ``(d,)``, ``v`` ``(e,)``;
    ``theta``, ``eta``, ``alpha`` are 0-dim tensors. Return the new weights and the new
    momentum.

    The inputs: ``d = 4, e = 3``; an empty memory (zero weights and momentum);
    ``alpha = 0``; ``eta = 0``; strong forgetting. Known mistakes are named: the
    :math:`\tfrac12` of the package's loss, the gradient taken at the forgotten
    weights (the package's default order), a step up the gradient, the forgetting
    applied after the momentum is added, ``alpha`` read as the share kept, the
    momentum not carried over, the gradient transposed.

    Example:
        >>> def my_titans_update(weight, momentum, k, v, theta, eta, alpha):
        ...     surprise = 2 * torch.outer(weight @ k - v, k)
        ...     momentum = eta * momentum - theta * surprise
        ...     return (1 - alpha) * weight + momentum, momentum
        >>> check_titans_update(my_titans_update)  # doctest: +ELLIPSIS
        ✓ my_titans_update: surprise at W_(t-1), momentum, forgetting (5 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _titans_step,
        [
            _titans_case("d = 4, e = 3", 4, 3, seed=0),
            _titans_case(
                "an empty memory: zero weights and momentum", 4, 3, 10, zero=True
            ),
            _titans_case("alpha = 0: nothing forgotten", 3, 5, 20, alpha=0.0),
            _titans_case("eta = 0: no momentum", 4, 2, 30, eta=0.0),
            _titans_case("strong forgetting, alpha = 0.6", 5, 3, 40, alpha=0.6),
        ],
        what="surprise at W_(t-1), momentum, forgetting",
        outputs=("weight", "momentum"),
        mistakes=[
            Mistake(
                "Titans' loss ||W k - v||^2 has no 1/2: its gradient is "
                "2 (W k - v) k^T",
                _titans_half_loss,
            ),
            Mistake(
                "take the gradient at the previous weights W_(t-1), before forgetting "
                "(Titans' order; NeuralMemory's default takes it at (1 - alpha) W)",
                _titans_at_forgotten,
            ),
            Mistake(
                "the surprise is subtracted: momentum = eta * momentum - theta * "
                "gradient, a step down the gradient",
                _titans_gradient_ascent,
            ),
            Mistake(
                "forget the old weights only: W_t = (1 - alpha) W_(t-1) + momentum, "
                "the new momentum added in full",
                _titans_forget_after,
            ),
            Mistake(
                "alpha is the share forgotten: keep (1 - alpha) W_(t-1), not alpha W",
                _titans_alpha_kept,
            ),
            Mistake(
                "the momentum carries past surprise: add eta times the old momentum",
                _titans_no_momentum,
            ),
            Mistake(
                "the gradient of ||W k - v||^2 for W of shape (e, d) is "
                "2 (W k - v) k^T, shape (e, d)",
                _titans_transposed_gradient,
            ),
        ],
    )
