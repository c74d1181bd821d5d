r"""Titans' neural memory: a model trained online, at test time, to map keys to values
(chapter 12).

Shape legend: ``b`` batch (any number of leading dims ``...``), ``n`` positions, ``d``
key/query size, ``e`` value size, ``m`` hidden size of the MLP memory.

The memory :math:`\mathcal{M}` is a small model, linear (:math:`\mathcal{M}(x) = W x`)
or a 2-layer MLP (:math:`\mathcal{M}(x) = W_2\, \mathrm{silu}(W_1 x)`), whose weights
change while the sequence is read :cite:`behrouz2024titans`. Each token is one step of
gradient descent on the associative loss

.. math:: \ell(\mathcal{M}; k_t, v_t) = \tfrac12 \lVert \mathcal{M}(k_t) - v_t \rVert^2,

whose gradient is the *surprise*. With momentum :math:`\eta_t` (past surprise),
forgetting :math:`\alpha_t` and learning rate :math:`\theta_t`, for every weight
:math:`W` of the memory:

.. math::

    W' = (1 - \alpha_t)\, W_{t-1}, \qquad
    \Sigma_t = \eta_t\, \Sigma_{t-1} - \theta_t\, \nabla_W \ell(W'; k_t, v_t), \qquad
    W_t = W' + \Sigma_t .

Retrieval is a forward pass without update: :math:`o = \mathcal{M}_t(q)`.

**Where the gradient is taken.** Here it is taken at the forgotten weights :math:`W'`
("forget, then learn"). Titans' equations take it at :math:`W_{t-1}`; the two differ by
:math:`\alpha_t \theta_t` times the surprise of the forgotten part, a second-order term,
and coincide when :math:`\alpha_t = 0`. The choice here is the one under which the
identity below is exact; ``gradient_at="previous"`` gives Titans' ordering.

**The identity with the gated delta rule.** A linear memory with no momentum
(:math:`\eta = 0`) and the gradient at :math:`W'` takes the step

.. math::

    W_t = (1-\alpha_t) W_{t-1}
        - \theta_t\big((1-\alpha_t) W_{t-1} k_t - v_t\big) k_t^\top
        = (1-\alpha_t)\, W_{t-1} (I - \theta_t k_t k_t^\top) + \theta_t v_t k_t^\top,

which is the gated delta rule (:func:`attention.gated_delta_rule_attention`) with state
:math:`S_t = W_t^\top` (``(d, e)``), :math:`\beta_t = \theta_t`,
:math:`e^{g_t} = 1 - \alpha_t`, and ``scale=1`` (retrieval applies no scale). The loss
scaling matters: with Titans' :math:`\lVert \mathcal{M}(k) - v\rVert^2` (no
:math:`\tfrac12`) the gradient doubles and :math:`\beta_t = 2\theta_t`.
``tests/test_neural_memory.py`` checks the identity, outputs and final state, with
per-token :math:`\theta_t` and :math:`\alpha_t`.

The gradients are written out (for the MLP, the two-layer back-propagation by hand), so
the whole update is differentiable by autograd: an outer training loop can learn the
initial weights and the inputs to :math:`\theta, \alpha, \eta`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import (
    broadcast_shapes,
    check_choice,
    check_factory,
    check_has_data,
    check_like,
    check_real,
    check_same_device,
    check_size,
    check_tensor,
)

__all__ = ["NeuralMemory"]


def _silu_grad(x: Tensor) -> Tensor:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


class NeuralMemory(nn.Module):
    r"""A test-time-trained key→value memory (Titans): ``update`` learns, ``retrieve``
    reads.

    The parameters are the memory's *initial* weights: ``weight`` ``(e, d)`` for the
    linear memory (zeros), or ``weight1`` ``(m, d)`` (random, std :math:`d^{-1/2}`) and
    ``weight2`` ``(e, m)`` (zeros) for the MLP. The running weights and momentum live in
    :attr:`state`, one copy per batch element, created by the first :meth:`update` (or
    :meth:`reset`) from the initial weights.

    Args:
        key_dim: ``d``.
        value_dim: ``e``.
        hidden_dim: ``None`` for a linear memory, else the MLP's hidden size ``m``.
        learning_rate: :math:`\theta \ge 0`, the step size (fixed; per-token values can
            be passed to :meth:`update`).
        momentum: :math:`\eta \in [0, 1]`, the weight of past surprise.
        forgetting: :math:`\alpha \in [0, 1]`, the fraction of the memory forgotten per
            token.
        gradient_at: ``"forgotten"`` (default; the gradient at :math:`(1-\alpha)W`,
            exact gated-delta-rule identity) or ``"previous"`` (at :math:`W_{t-1}`,
            Titans' order).

    Example:
        >>> mem = NeuralMemory(2, 3, learning_rate=1.0)
        >>> keys, values = torch.eye(2)[None], torch.arange(6.0).reshape(1, 2, 3)
        >>> _ = mem.update(keys, values)
        >>> mem.retrieve(keys).tolist()  # orthonormal keys, theta = 1: stored exactly
        [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]
    """

    def __init__(
        self,
        key_dim: int,
        value_dim: int,
        *,
        hidden_dim: int | None = None,
        learning_rate: float = 0.1,
        momentum: float = 0.0,
        forgetting: float = 0.0,
        gradient_at: str = "forgotten",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.key_dim, self.value_dim = (
            check_size("key_dim", key_dim),
            check_size("value_dim", value_dim),
        )
        self.hidden_dim = (
            None if hidden_dim is None else check_size("hidden_dim", hidden_dim)
        )
        self.learning_rate = _check_rate("learning_rate", learning_rate, upper=None)
        self.momentum = _check_rate("momentum", momentum, upper=1.0)
        self.forgetting = _check_rate("forgetting", forgetting, upper=1.0)
        self.gradient_at = check_choice(
            "gradient_at", gradient_at, ("forgotten", "previous")
        )
        kw = check_factory(device, dtype)
        hidden = self.hidden_dim
        if hidden is None:
            self.weight = nn.Parameter(torch.zeros(value_dim, key_dim, **kw))
        else:
            self.weight1 = nn.Parameter(
                torch.randn(hidden, key_dim, **kw) / math.sqrt(key_dim)
            )
            self.weight2 = nn.Parameter(torch.zeros(value_dim, hidden, **kw))
        self.state: dict[str, list[Tensor]] | None = None

    def extra_repr(self) -> str:
        kind = (
            "linear"
            if self.hidden_dim is None
            else f"mlp, hidden_dim={self.hidden_dim}"
        )
        return (
            f"key_dim={self.key_dim}, value_dim={self.value_dim}, {kind}, "
            f"learning_rate={self.learning_rate}, momentum={self.momentum}, "
            f"forgetting={self.forgetting}, gradient_at={self.gradient_at!r}"
        )

    # ----------------------------------------------------------------- state

    def _initial(self) -> list[Tensor]:
        return (
            [self.weight] if self.hidden_dim is None else [self.weight1, self.weight2]
        )

    def reset(self, batch_shape: tuple[int, ...] = ()) -> None:
        """Start again from the initial weights, one copy per batch element, zero
        momentum."""
        weights = [w.expand(*batch_shape, *w.shape) for w in self._initial()]
        self.state = {
            "weights": weights,
            "momentum": [torch.zeros_like(w) for w in weights],
        }

    @property
    def weights(self) -> list[Tensor]:
        """The current weights, ``[(..., e, d)]`` or ``[(..., m, d), (..., e, m)]``."""
        return self._initial() if self.state is None else self.state["weights"]

    # ------------------------------------------------------------- memory as a function

    def _apply(
        self, fn, recurse=True
    ):  # keep the running state on the module's device/dtype
        module = super()._apply(fn, recurse)
        if self.state is not None:
            self.state = {key: [fn(t) for t in ts] for key, ts in self.state.items()}
        return module

    def _forward(self, weights: list[Tensor], x: Tensor) -> Tensor:
        """``M(x)`` for ``x`` ``(..., p, d)`` with per-batch weights ``(..., *, *)``."""
        if self.hidden_dim is None:
            return x @ weights[0].transpose(-2, -1)  # (..., p, e)
        return F.silu(x @ weights[0].transpose(-2, -1)) @ weights[1].transpose(-2, -1)

    def _gradients(self, weights: list[Tensor], k: Tensor, v: Tensor) -> list[Tensor]:
        """Gradient of 1/2 |M(k) - v|^2 for one key ``(..., d)`` and value
        ``(..., e)``."""
        if self.hidden_dim is None:
            residual = (weights[0] @ k.unsqueeze(-1)).squeeze(-1) - v  # (..., e)
            return [residual.unsqueeze(-1) * k.unsqueeze(-2)]  # (..., e, d)
        pre = (weights[0] @ k.unsqueeze(-1)).squeeze(-1)  # (..., m)
        hidden = F.silu(pre)
        residual = (weights[1] @ hidden.unsqueeze(-1)).squeeze(-1) - v  # (..., e)
        grad2 = residual.unsqueeze(-1) * hidden.unsqueeze(-2)  # (..., e, m)
        back = (weights[1].transpose(-2, -1) @ residual.unsqueeze(-1)).squeeze(
            -1
        )  # (..., m)
        grad1 = (back * _silu_grad(pre)).unsqueeze(-1) * k.unsqueeze(-2)  # (..., m, d)
        return [grad1, grad2]

    # ----------------------------------------------------------------- public

    def update(
        self,
        keys: Tensor,
        values: Tensor,
        *,
        learning_rate: Tensor | float | None = None,
        momentum: Tensor | float | None = None,
        forgetting: Tensor | float | None = None,
    ) -> Tensor:
        r"""Store ``n`` key→value pairs, one gradient step per token, in order.

        Args:
            keys: ``(..., n, d)``.
            values: ``(..., n, e)``.
            learning_rate, momentum, forgetting: per-token
                :math:`\theta_t, \eta_t, \alpha_t` as tensors ``(..., n)`` (or floats),
                overriding the module's fixed values.

        Returns:
            ``(..., n)`` the surprise of each token before its step,
            :math:`\ell = \tfrac12 \lVert \mathcal{M}_{t-1}(k_t) - v_t\rVert^2`.
        """
        self._check_inputs(keys, values)
        n = keys.shape[-2]
        batch = keys.shape[:-2]
        rates = [
            self._rate(name, given, fixed, keys, upper)
            for name, given, fixed, upper in (
                ("learning_rate", learning_rate, self.learning_rate, None),
                ("momentum", momentum, self.momentum, 1.0),
                ("forgetting", forgetting, self.forgetting, 1.0),
            )
        ]
        if self.state is None or self.state["weights"][0].shape[:-2] != batch:
            self.reset(tuple(batch))
        assert self.state is not None  # reset() filled it
        weights, moment = self.state["weights"], self.state["momentum"]
        surprise = []
        for t in range(n):
            theta, eta, alpha = (r[..., t, None, None] for r in rates)  # (..., 1, 1)
            k_t, v_t = keys[..., t, :], values[..., t, :]
            prev = self._forward(weights, k_t.unsqueeze(-2)).squeeze(-2) - v_t
            surprise.append(0.5 * (prev * prev).sum(-1))
            forgotten = [(1 - alpha) * w for w in weights]
            at = forgotten if self.gradient_at == "forgotten" else weights
            grads = self._gradients(at, k_t, v_t)
            moment = [eta * s - theta * gr for s, gr in zip(moment, grads, strict=True)]
            weights = [w + s for w, s in zip(forgotten, moment, strict=True)]
        self.state = {"weights": weights, "momentum": moment}
        return (
            torch.stack(surprise, dim=-1) if surprise else keys.new_zeros(batch + (0,))
        )

    def retrieve(self, queries: Tensor) -> Tensor:
        """Read the memory: ``M(q)`` for ``queries`` ``(..., i, d)``, no update. Returns
        ``(..., i, e)``."""
        check_tensor("queries", queries, floating=True, min_dim=2)
        self._check_last("queries", queries, self.key_dim, "d = key_dim")
        check_like("queries", queries, "the memory's weights", self.weights[0])
        broadcast_shapes(
            "the batch dims of queries and of the memory (set by the last update)",
            queries.shape[:-2],
            self.weights[0].shape[:-2],
        )
        return self._forward(self.weights, queries)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, **rates) -> Tensor:
        r"""Token by token: store ``(k_t, v_t)``, then read ``q_t``. Returns
        ``(..., n, e)``.

        This is the sequence form compared with
        :func:`attention.gated_delta_rule_attention` (``scale=1``). ``rates`` as in
        :meth:`update` (per-token tensors ``(..., n)``).
        """
        check_tensor("query", query, floating=True, min_dim=2)
        self._check_inputs(key, value, "key", "value")
        if query.shape[:-1] != key.shape[:-1]:
            raise ValueError(
                f"query must have the shape (..., n, d) of key, got "
                f"{tuple(query.shape)} and {tuple(key.shape)}"
            )
        check_like("query", query, "the memory's weights", self.weights[0])
        bounds = {"learning_rate": None, "momentum": 1.0, "forgetting": 1.0}
        rates = {  # checked once, as (..., n) tensors, then read a token at a time
            name: self._rate(name, r, None, key, bounds[name])
            if isinstance(r, Tensor) and name in bounds
            else r
            for name, r in rates.items()
        }
        outputs = []
        for t in range(key.shape[-2]):
            one = {
                name: (r[..., t : t + 1] if isinstance(r, Tensor) else r)
                for name, r in rates.items()
            }
            self.update(key[..., t : t + 1, :], value[..., t : t + 1, :], **one)
            outputs.append(self.retrieve(query[..., t : t + 1, :]))
        return torch.cat(outputs, dim=-2) if outputs else value.new_zeros(value.shape)

    # ----------------------------------------------------------------- checks

    def _check_last(self, name: str, x: Tensor, size: int, what: str) -> None:
        if x.shape[-1] != size:
            raise ValueError(
                f"{name} must have last dimension {what} = {size}, got {x.shape[-1]}"
            )

    def _check_inputs(self, keys, values, k_name="keys", v_name="values") -> None:
        check_tensor(k_name, keys, floating=True, min_dim=2)
        check_tensor(v_name, values, floating=True, min_dim=2)
        self._check_last(k_name, keys, self.key_dim, "d = key_dim")
        self._check_last(v_name, values, self.value_dim, "e = value_dim")
        if keys.shape[:-1] != values.shape[:-1]:
            raise ValueError(
                f"{k_name} and {v_name} must share (..., n), got {tuple(keys.shape)} "
                f"and {tuple(values.shape)}"
            )
        check_like(k_name, keys, "the memory's weights", self.weights[0])
        check_like(v_name, values, "the memory's weights", self.weights[0])

    @staticmethod
    def _rate(name, given, fixed, keys, upper) -> Tensor:
        """A per-token rate ``(..., n)`` from a tensor, a float or the fixed default."""
        if given is None:
            given = fixed
        if not isinstance(given, Tensor):
            given = _check_rate(name, given, upper=upper)
            return keys.new_full(keys.shape[:-1], given)
        check_tensor(name, given, floating=True)
        check_same_device(keys=keys, **{name: given})
        target = tuple(keys.shape[:-1])
        if given.dim() > len(target) or any(
            g not in (1, t)
            for g, t in zip(reversed(given.shape), reversed(target), strict=False)
        ):
            raise ValueError(
                f"{name} must be a number or one value per token, a tensor that "
                f"broadcasts to (..., n) = {target}, got shape {tuple(given.shape)}"
            )
        check_has_data(name, given)
        if ((given < 0) | (given > (upper if upper is not None else torch.inf))).any():
            raise ValueError(
                f"{name} {_bound(upper)}, got values from "
                f"{given.detach().min().item():.4g} to "
                f"{given.detach().max().item():.4g}"
            )
        return given.to(keys.dtype).expand(keys.shape[:-1])


def _check_rate(name: str, value, *, upper: float | None) -> float:
    value = check_real(name, value)
    if not (value >= 0 and (upper is None or value <= upper)):
        raise ValueError(f"{name} {_bound(upper)}, got {value}")
    return value


def _bound(upper: float | None) -> str:
    return "must be >= 0" if upper is None else f"must lie in [0, {upper:g}]"
