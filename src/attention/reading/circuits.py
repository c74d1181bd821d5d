r"""Reading attention heads as circuits, and the scores that find induction heads
(chapter 19).

A transformer without MLPs is a *residual stream* that every head reads from and writes
to additively. Head ``n`` of a layer factors into two matrices of size ``D x D`` (``D``
the model size) whose rank is at most the head size ``d``:

* the **QK circuit** :math:`W_{QK} = W_Q W_K^\top`: the score of query token ``x_i`` for
  key token ``x_j`` is :math:`s \cdot x_i W_{QK} x_j^\top` (``s`` the scale), *where to
  look*;
* the **OV circuit** :math:`W_{OV} = W_V W_O`: a key token ``x_j`` that is attended to
  adds :math:`x_j W_{OV}` to the stream, *what to move*.

The package writes vectors as rows (``x @ W``, as ``nn.Linear`` does); in the column
notation of Elhage et al. (2021) the same matrices are :math:`W_Q^\top W_K` and
:math:`(W_O W_V)^\top`. Biases are left out: the circuits are the bilinear and linear
parts of the head.

The scores reduce attention maps ``(..., i, j)`` to one number per map: how much weight
goes to the previous token, to the token after an earlier copy of the current one
(prefix matching, the induction pattern), to earlier copies of the current token. The
copying score reads an OV circuit's eigenvalues; the composition score measures how much
a later head reads what an earlier head wrote. :class:`AttentionOnlyTransformer` is the
small model the chapter trains to grow induction heads.

Shape legend: ``b`` batch, ``h`` heads, ``i`` query positions, ``j`` key positions,
``n`` sequence length, ``D`` model size (``embed_dim``), ``d`` head size, ``V``
vocabulary size, ``L`` layers. ``composition_score``, ``duplicate_token_score`` and
``AttentionOnlyTrace`` are importable from ``attention.reading.circuits``.

Mask convention: boolean, **True = may attend**; the model here is causal (query ``i``
sees keys ``j <= i``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .._checks import (
    broadcast_shapes,
    check_bool,
    check_choice,
    check_factory,
    check_int,
    check_like,
    check_same_device,
    check_same_dtype,
    check_tensor,
)
from .._core import attention_scores, masked_softmax
from ..layers.multihead import MultiHeadAttention, split_heads

# The facade re-exports the library names (the first 7); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "qk_circuit",
    "ov_circuit",
    "copying_score",
    "previous_token_score",
    "induction_score",
    "prefix_matching_score",
    "AttentionOnlyTransformer",
    "composition_score",
    "duplicate_token_score",
]


# --------------------------------------------------------------------------- circuits


def _head_weights(module) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-head ``W_Q, W_K, W_V`` ``(h, D, d)`` and ``W_O`` ``(h, d, D)`` of a
    module."""
    h, d = module.num_heads, module.head_dim
    if isinstance(module, nn.MultiheadAttention):
        if module.in_proj_weight is None:  # separate kdim / vdim projections
            w_q, w_k, w_v = (
                module.q_proj_weight,
                module.k_proj_weight,
                module.v_proj_weight,
            )
        else:
            w_q, w_k, w_v = module.in_proj_weight.chunk(3, dim=0)  # each (D, D_in)
        w_q, w_k, w_v = (w.reshape(h, d, -1).transpose(-2, -1) for w in (w_q, w_k, w_v))
        return w_q, w_k, w_v, module.out_proj.weight.reshape(-1, h, d).permute(1, 2, 0)
    w_q = module.w_query.weight.reshape(h, d, -1).transpose(-2, -1)  # (h, D, d)
    w_k = module.w_key.weight.reshape(module.num_kv_heads, d, -1).transpose(-2, -1)
    w_v = module.w_value.weight.reshape(module.num_kv_heads, d, -1).transpose(-2, -1)
    groups = module.num_groups
    w_k = w_k.repeat_interleave(
        groups, dim=0
    )  # (h, D_k, d): query head n reads kv head n // groups
    w_v = w_v.repeat_interleave(groups, dim=0)  # (h, D_v, d)
    w_o = module.w_out.weight.reshape(-1, h, d).permute(1, 2, 0)  # (h, d, D)
    return w_q, w_k, w_v, w_o


def _pair(
    name: str, first, second, first_name: str, second_name: str
) -> tuple[Tensor, Tensor] | None:
    """Either a MultiHeadAttention (``second`` None), then None, or two per-head
    matrices, checked and returned."""
    if isinstance(first, MultiHeadAttention | nn.MultiheadAttention):
        if second is not None:
            raise ValueError(
                f"{name} takes a MultiHeadAttention "
                f"alone, or two matrices {first_name} and {second_name}; "
                f"got a module and a {type(second).__name__}"
            )
        return None
    for arg_name, t in ((first_name, first), (second_name, second)):
        if t is None:
            raise TypeError(
                f"{name} needs a MultiHeadAttention or both "
                f"{first_name} and {second_name}, got {second_name}=None"
            )
        check_tensor(arg_name, t, floating=True, min_dim=2)
    _check_product(first_name, first, second_name, second)
    return first, second


def _check_product(first_name: str, first: Tensor, second_name: str, second: Tensor):
    """Two stacks of matrices ``(..., r, c)`` that a batched matmul can multiply: one
    dtype, one device, batch dims that broadcast (the inner sizes are the caller's)."""
    check_same_dtype(**{first_name: first, second_name: second})
    check_same_device(**{first_name: first, second_name: second})
    broadcast_shapes(
        f"the batch dims of {first_name} and {second_name}",
        first.shape[:-2],
        second.shape[:-2],
    )


def qk_circuit(w_query, w_key: Tensor | None = None) -> Tensor:
    r"""The QK circuit :math:`W_{QK} = W_Q W_K^\top` of every head: *where to look*.

    The (unscaled) score of query token ``x_i`` for key token ``x_j`` in head ``n`` is
    :math:`x_i W_{QK}^{(n)} x_j^\top`; the attention score is that times the scale
    :math:`1/\sqrt d`. Its rank is at most ``d``. Biases are left out.

    Args:
        w_query: a :class:`~attention.MultiHeadAttention` or
            ``torch.nn.MultiheadAttention`` (then ``w_key`` is None and its per-head
            matrices are used, grouped key heads repeated for their query heads), or the
            per-head query matrices ``(..., D, d)``: ``q = x @ w_query``.
        w_key: the per-head key matrices ``(..., D_k, d)``: ``k = x @ w_key``.

    Returns:
        ``(..., D, D_k)``; ``(h, D, D_k)`` for a module.

    Example:
        >>> mha = MultiHeadAttention(8, 2, bias=False, dtype=torch.float64)
        >>> qk = qk_circuit(mha)  # two heads of size d = 4
        >>> qk.shape, int(torch.linalg.matrix_rank(qk[0]))
        (torch.Size([2, 8, 8]), 4)
    """
    pair = _pair("qk_circuit", w_query, w_key, "w_query", "w_key")
    if pair is None:
        w_q, w_k, _, _ = _head_weights(w_query)
    else:
        w_q, w_k = pair
        if w_q.shape[-1] != w_k.shape[-1]:
            raise ValueError(
                "w_query (..., D, d) and w_key (..., D_k, d) must share the head size "
                f"d, got shapes {tuple(w_q.shape)} and {tuple(w_k.shape)}"
            )
    return w_q @ w_k.transpose(-2, -1)  # (..., D, D_k)


def ov_circuit(w_value, w_out: Tensor | None = None) -> Tensor:
    r"""The OV circuit :math:`W_{OV} = W_V W_O` of every head: *what to move*.

    A key token ``x_j`` attended to with weight :math:`A_{ij}` adds
    :math:`A_{ij}\, x_j W_{OV}^{(n)}` to position ``i`` of the residual stream, so a
    head's output is :math:`\sum_j A_{ij}\, x_j W_{OV}`. Its rank is at most ``d``.
    Biases are left out.

    Args:
        w_value: a :class:`~attention.MultiHeadAttention` or
            ``torch.nn.MultiheadAttention`` (then ``w_out`` is None), or the per-head
            value matrices ``(..., D_v, d)``: ``v = x @ w_value``.
        w_out: the per-head slices of the output projection ``(..., d, D)``: head ``n``
            writes ``z_n @ w_out[n]``.

    Returns:
        ``(..., D_v, D)``; ``(h, D_v, D)`` for a module.

    Example:
        >>> mha = MultiHeadAttention(8, 2, bias=False)
        >>> x = torch.randn(5, 8)  # five tokens, each attended to with weight one
        >>> per_head = [x @ ov for ov in ov_circuit(mha)]  # what each head would write
        >>> v = split_heads(mha.w_value(x[None]), 2)[0]  # (h, j, d)
        >>> out = mha.w_out(v.transpose(0, 1).reshape(5, 8))
        >>> torch.allclose(sum(per_head), out, atol=1e-5)
        True
    """
    pair = _pair("ov_circuit", w_value, w_out, "w_value", "w_out")
    if pair is None:
        _, _, w_v, w_o = _head_weights(w_value)
    else:
        w_v, w_o = pair
        if w_v.shape[-1] != w_o.shape[-2]:
            raise ValueError(
                "w_value (..., D_v, d) and w_out (..., d, D) must share the head size "
                f"d, got shapes {tuple(w_v.shape)} and {tuple(w_o.shape)}"
            )
    return w_v @ w_o  # (..., D_v, D)


def _check_square(name: str, x) -> None:
    check_tensor(name, x, floating=True, min_dim=2)
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"{name} must be square in its last two dims (..., D, D), "
            f"got shape {tuple(x.shape)}"
        )


def composition_score(
    ov_first: Tensor, circuit_second: Tensor, *, kind: str = "k"
) -> Tensor:
    r"""How much a later head reads what an earlier head wrote (Elhage et al. 2021).

    .. math::
        \frac{\lVert W_{OV}^{(1)} M \rVert_F}
        {\lVert W_{OV}^{(1)} \rVert_F\, \lVert M \rVert_F},
        \quad M = W_{QK}^{(2)} \text{ (Q)},\ W_{QK}^{(2)\top} \text{ (K)},
        \ W_{OV}^{(2)} \text{ (V)}

    The first head's output :math:`y = x W_{OV}^{(1)}` enters the second head's queries
    (Q-composition), keys (K-composition: an induction head's keys read a previous-token
    head's output) or values (V-composition). The score lies in ``[0, 1]``; random
    matrices of rank ``d`` in ``D`` dimensions score about :math:`\sqrt{d/D}\,`-ish
    small values, so compare against such a baseline.

    Args:
        ov_first: ``(..., D, D)`` OV circuit(s) of the earlier head(s).
        circuit_second: ``(..., D, D)`` QK circuit(s) (``kind`` ``"q"`` or ``"k"``) or
            OV circuit(s) (``"v"``) of the later head(s); leading dims broadcast.
        kind: ``"q"``, ``"k"`` or ``"v"``.

    Returns:
        ``(...)``, the broadcast leading dims; NaN where a matrix is zero (the score
        is 0 / 0 there). Scaling either matrix leaves the score unchanged; each is
        divided by its largest entry first, so huge or tiny matrices score as well.

    Example:
        >>> ov = torch.eye(4)
        >>> # 2 / (2 * 2)
        >>> round(composition_score(ov, torch.eye(4), kind="k").item(), 4)
        0.5
    """
    _check_square("ov_first", ov_first)
    _check_square("circuit_second", circuit_second)
    check_choice("kind", kind, ("q", "k", "v"))
    if ov_first.shape[-1] != circuit_second.shape[-1]:
        raise ValueError(
            "ov_first and circuit_second must act on the same model size D, "
            f"got shapes {tuple(ov_first.shape)} and {tuple(circuit_second.shape)}"
        )
    _check_product("ov_first", ov_first, "circuit_second", circuit_second)
    second = circuit_second.transpose(-2, -1) if kind == "k" else circuit_second
    # The score does not change when either matrix is scaled: divide each by its
    # largest entry first, so the norms neither overflow (1e20) nor underflow (1e-30).
    first = ov_first / ov_first.detach().abs().amax((-2, -1), keepdim=True)
    second = second / second.detach().abs().amax((-2, -1), keepdim=True)
    norm = torch.linalg.matrix_norm
    return norm(first @ second) / (norm(first) * norm(second))


def copying_score(circuit: Tensor, *factors: Tensor) -> Tensor:
    r"""The share of a square circuit's eigenvalues that copies:
    :math:`\sum_k \lambda_k / \sum_k |\lambda_k|`.

    Applied to a head's full OV circuit from tokens to logits, :math:`W_E W_{OV} W_U`
    (``V x V``), a score near 1 means attending to token ``t`` raises the logit of ``t``
    itself (the head copies); near -1, it lowers it. Complex eigenvalues come in
    conjugate pairs, so :math:`\sum_k \lambda_k` is the (real) trace. The eigenvalues
    are computed in float64.

    Args:
        circuit: ``(..., V, V)``; or, with ``factors``, the first factor of a product
            (``copying_score(w_embed, ov, w_unembed)`` scores
            ``w_embed @ ov @ w_unembed``).
        factors: further matrices multiplied on the right, in order.

    Returns:
        ``(...)`` in ``[-1, 1]``, in the circuit's dtype; NaN for the zero matrix.

    Example:
        >>> copying_score(torch.eye(3)).item(), copying_score(-torch.eye(3)).item()
        (1.0, -1.0)
    """
    if factors:
        for name, t in (
            ("circuit", circuit),
            *((f"factor {k}", f) for k, f in enumerate(factors)),
        ):
            check_tensor(name, t, floating=True, min_dim=2)
        for k, f in enumerate(factors):
            so_far = "circuit" if k == 0 else "the product so far"
            _check_product(so_far, circuit, f"factor {k}", f)
            if f.shape[-2] != circuit.shape[-1]:
                raise ValueError(
                    f"factor {k} of shape {tuple(f.shape)} "
                    f"cannot multiply a product of shape {tuple(circuit.shape)}: "
                    "its rows must match the product's columns"
                )
            circuit = circuit @ f
    _check_square("circuit", circuit)
    eig = torch.linalg.eigvals(circuit.double())  # (..., V) complex
    return (eig.real.sum(-1) / eig.abs().sum(-1)).to(circuit.dtype)


# --------------------------------------------------------------------------- scores


def _check_maps(weights) -> int:
    """Square maps ``(..., n, n)`` of self-attention; returns ``n``."""
    check_tensor("weights", weights, floating=True, min_dim=2)
    i, j = weights.shape[-2:]
    if i != j:
        raise ValueError(
            "weights must be self-attention maps (..., n, n) with as "
            f"many queries as keys, got shape {tuple(weights.shape)}"
        )
    return i


def _per_sequence(name: str, t: Tensor, weights: Tensor) -> Tensor:
    """``(n,)`` or ``(b, n)`` -> broadcastable to ``weights[..., :, 0]``'s shape."""
    n = weights.shape[-1]
    if t.dim() == 1:
        if t.shape[0] != n:
            raise ValueError(
                f"{name} must have length n={n}, got shape {tuple(t.shape)}"
            )
        return t
    if t.dim() == 2:
        if weights.dim() < 3 or t.shape != (weights.shape[0], n):
            raise ValueError(
                f"{name} of shape (b, n) needs weights (b, ..., n, n) with the same b "
                f"and n, got {name} {tuple(t.shape)} and weights {tuple(weights.shape)}"
            )
        return t.reshape(t.shape[0], *([1] * (weights.dim() - 3)), n)  # (b, 1, ..., n)
    raise ValueError(f"{name} must be (n,) or (b, n), got shape {tuple(t.shape)}")


def _check_integer(name: str, t) -> None:
    check_tensor(name, t)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")


def _score(weights: Tensor, chosen: Tensor) -> Tensor:
    """Mean over the queries that have chosen keys of the weight on them (NaN if none
    has)."""
    share = (weights * chosen).sum(-1)  # (..., i)
    has = chosen.any(-1).to(weights.dtype).expand_as(share)  # (..., i)
    return (share * has).sum(-1) / has.sum(-1)  # (...)


def previous_token_score(weights: Tensor) -> Tensor:
    r"""The mean weight a query puts on the token just before it:
    :math:`\frac{1}{n-1}\sum_{i \ge 1} A_{i,i-1}`.

    A previous-token head scores near 1 (on any text: the pattern needs no repeated
    tokens); a uniform causal head scores about
    :math:`\frac{1}{n-1}\sum_{i\ge1} \frac1{i+1}`.

    Args:
        weights: ``(..., n, n)`` self-attention maps, ``n >= 2``.

    Returns:
        ``(...)`` in ``[0, 1]``.

    Example:
        >>> weights = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
        >>> previous_token_score(weights).item()
        0.75
    """
    n = _check_maps(weights)
    if n < 2:
        raise ValueError(
            "previous_token_score needs n >= 2 positions, "
            f"got shape {tuple(weights.shape)}"
        )
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # (...)


def induction_score(weights: Tensor, period_or_positions: int | Tensor) -> Tensor:
    r"""The mean weight on the *induction key*: the position after the previous copy.

    With an int period ``p`` the sequence repeats itself after ``p`` tokens
    (``t_{i} = t_{i-p}`` for ``i >= p``), and query ``i >= p`` has induction key
    ``i - p + 1``: :math:`\frac{1}{n-p}\sum_{i \ge p} A_{i,i-p+1}`. With a tensor of
    positions, query ``i``'s induction key is ``positions[..., i]`` (``-1``: none),
    which handles a repeat at a different offset in every sequence. The mean runs over
    the queries that have an induction key (NaN where none has).

    Args:
        weights: ``(..., n, n)`` self-attention maps, e.g. ``(b, h, n, n)``.
        period_or_positions: an int ``p`` with ``1 <= p < n``, or integer induction keys
            ``(n,)`` (shared) or ``(b, n)`` (one row per leading index of ``weights``),
            each ``-1`` or in ``[0, n)``.

    Returns:
        ``(...)`` in ``[0, 1]``.

    Example:
        >>> w = torch.zeros(4, 4); w[0, 0] = w[1, 0] = w[2, 1] = w[3, 2] = 1.0
        >>> induction_score(w, 2).item()  # tokens "a b a b": queries 2, 3 look at 1, 2
        1.0
    """
    n = _check_maps(weights)
    if isinstance(period_or_positions, Tensor):
        positions = period_or_positions
        _check_integer("positions", positions)
        check_same_device(weights=weights, positions=positions)
        positions = _per_sequence("positions", positions, weights)
        if positions.numel() and (positions.min() < -1 or positions.max() >= n):
            raise ValueError(
                f"positions must be -1 (no induction key) or in [0, {n}), got "
                f"values in [{int(positions.min())}, {int(positions.max())}]"
            )
        keys = torch.arange(n, device=weights.device)
        chosen = positions.unsqueeze(-1) == keys  # (..., i, j)
        return _score(weights, chosen)
    p = check_int("period", period_or_positions, minimum=1)
    if p >= n:
        raise ValueError(f"period must be < n={n} so that some token repeats, got {p}")
    return weights.diagonal(offset=1 - p, dim1=-2, dim2=-1)[..., 1:].mean(-1)  # (...)


def _token_keys(tokens: Tensor, weights: Tensor, shift: int, is_causal: bool) -> Tensor:
    _check_integer("tokens", tokens)
    check_same_device(weights=weights, tokens=tokens)
    check_bool("is_causal", is_causal)
    t = _per_sequence("tokens", tokens, weights)  # (..., n)
    n = weights.shape[-1]
    same = t.unsqueeze(-1) == t.unsqueeze(-2)  # (..., i, k): t_k == t_i
    q = torch.arange(n, device=weights.device)
    allowed = (
        q[None, :] < q[:, None] if is_causal else q[None, :] != q[:, None]
    )  # k < i or k != i
    same = same & allowed
    if shift:  # key j = k + 1 follows the copy at k
        same = torch.nn.functional.pad(same, (1, 0))[..., :n]
    return same


def prefix_matching_score(
    weights: Tensor, tokens: Tensor, *, is_causal: bool = True
) -> Tensor:
    r"""The mean weight on tokens that *follow* an earlier copy of the current token.

    Query ``i`` (token ``t_i``) has the chosen keys
    :math:`S_i = \{\, k + 1 : t_k = t_i,\ k < i \,\}` (with ``is_causal=False``: any
    :math:`k \ne i`); the score averages :math:`\sum_{j \in S_i} A_{ij}` over the
    queries with a non-empty :math:`S_i` (NaN where none has). Olsson et al. (2022)
    measure it on repeated random tokens; it is the attention half of an induction head,
    read from the tokens rather than from a known period (compare
    :func:`induction_score`).

    Args:
        weights: ``(..., n, n)`` self-attention maps, e.g. ``(b, h, n, n)``.
        tokens: integer token ids ``(n,)`` (shared) or ``(b, n)`` (one row per leading
            index of ``weights``).
        is_causal: the chosen keys come from earlier copies only (a causal model); False
            for an encoder, whose queries see copies on both sides.

    Returns:
        ``(...)`` in ``[0, 1]``.

    Example:
        >>> w = torch.zeros(4, 4); w[0, 0] = w[1, 0] = w[2, 1] = w[3, 2] = 1.0
        >>> prefix_matching_score(w, torch.tensor([7, 8, 7, 8])).item()
        1.0
    """
    _check_maps(weights)
    return _score(weights, _token_keys(tokens, weights, 1, is_causal))


def duplicate_token_score(
    weights: Tensor, tokens: Tensor, *, is_causal: bool = True
) -> Tensor:
    r"""The mean weight on earlier copies of the current token.

    Query ``i`` has the chosen keys :math:`S_i = \{\, j : t_j = t_i,\ j < i \,\}` (with
    ``is_causal=False``: any :math:`j \ne i`); the score averages the weight on them
    over the queries that have one (NaN where none has).

    Args:
        weights: ``(..., n, n)`` self-attention maps.
        tokens: integer token ids ``(n,)`` or ``(b, n)``.
        is_causal: only earlier copies count; False for an encoder.

    Returns:
        ``(...)`` in ``[0, 1]``.

    Example:
        >>> w = torch.zeros(4, 4); w[0, 0] = w[1, 1] = w[2, 0] = w[3, 1] = 1.0
        >>> duplicate_token_score(w, torch.tensor([7, 8, 7, 8])).item()
        1.0
    """
    _check_maps(weights)
    return _score(weights, _token_keys(tokens, weights, 0, is_causal))


# --------------------------------------------------------------------------- the model


def _check_replaced(replaced, weights: Tensor, layer: int) -> None:
    """What a ``weights_hook`` returned must stand in for the ``(b, h, n, n)`` maps."""
    name = f"the maps weights_hook returned for layer {layer}"
    check_tensor(name, replaced, floating=True)
    check_like(name, replaced, "the layer's maps", weights)
    if replaced.shape != weights.shape:
        raise ValueError(
            f"{name} must have the shape (b, h, n, n) = {tuple(weights.shape)} of the "
            f"maps it replaces, got {tuple(replaced.shape)} (or return None to keep "
            "them)"
        )


@dataclass(frozen=True)
class AttentionOnlyTrace:
    """Everything one forward pass of :class:`AttentionOnlyTransformer` computed.

    Attributes:
        logits: ``(b, n, V)``.
        weights: ``(L, b, h, n, n)``, the attention maps of every layer and head.
        contributions: ``(L, b, h, n, D)``, what each head added to the residual stream
            (zero for an ablated head); summed over ``h`` it is the layer's output.
        residuals: ``(L + 1, b, n, D)``: the embeddings, then the stream after each
            layer.
    """

    logits: Tensor
    weights: Tensor
    contributions: Tensor
    residuals: Tensor


class AttentionOnlyTransformer(nn.Module):
    r"""A causal transformer with attention layers only: embed, ``L`` attention layers,
    unembed.

    .. math::
        x^{(0)} = W_E[t] + W_P, \quad
        x^{(l+1)} = x^{(l)} + \sum_n A^{(l,n)} x^{(l)} W_{OV}^{(l,n)}, \quad
        \text{logits} = x^{(L)} W_U

    with :math:`A^{(l,n)} = \operatorname{softmax}(x^{(l)} W_{QK}^{(l,n)}
    x^{(l)\top}/\sqrt d + M)` and ``M`` the causal mask (query ``i`` sees keys
    ``j <= i``). No MLPs, no LayerNorm, no biases, so every path from tokens to logits
    is a product of the matrices above (the setting of Elhage et al. 2021).

    Args:
        vocab_size: ``V``.
        embed_dim: ``D``.
        num_heads: ``h`` per layer; must divide ``embed_dim``.
        num_layers: ``L >= 0`` (0: the bigram model :math:`W_E W_U`); default 2.
        max_len: longest sequence (learned positional embeddings ``W_P``); default 128.
        device, dtype: of the parameters.

    Submodules: ``embed`` (``nn.Embedding(V, D)``, :math:`W_E`), ``pos_embed``
    (``nn.Embedding(max_len, D)``), ``layers`` (``L`` bias-free
    :class:`~attention.MultiHeadAttention`), ``unembed``
    (``nn.Linear(D, V, bias=False)``; :math:`W_U` is ``unembed.weight.T``).

    Example:
        >>> model = AttentionOnlyTransformer(10, 16, 2, 2, max_len=8)
        >>> tokens = torch.randint(10, (3, 8))
        >>> model(tokens).shape
        torch.Size([3, 8, 10])
        >>> trace = model.trace(tokens, ablate=[(0, 1)])
        >>> trace.weights.shape, trace.contributions.shape
        (torch.Size([2, 3, 2, 8, 8]), torch.Size([2, 3, 2, 8, 16]))
        >>> trace.contributions[0, :, 1].abs().max().item()
        0.0
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        num_heads: int,
        num_layers: int = 2,
        *,
        max_len: int = 128,
        device=None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self.embed_dim = check_int("embed_dim", embed_dim, minimum=1)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.num_layers = check_int("num_layers", num_layers, minimum=0)
        self.max_len = check_int("max_len", max_len, minimum=1)
        if embed_dim % num_heads:
            raise ValueError(
                "embed_dim must be divisible by num_heads, "
                f"got {embed_dim} and {num_heads}"
            )
        factory = check_factory(device, dtype)
        self.embed = nn.Embedding(vocab_size, embed_dim, **factory)
        self.pos_embed = nn.Embedding(max_len, embed_dim, **factory)
        self.layers = nn.ModuleList(
            MultiHeadAttention(embed_dim, num_heads, bias=False, **factory)
            for _ in range(num_layers)
        )
        self.unembed = nn.Linear(embed_dim, vocab_size, bias=False, **factory)

    @property
    def head_dim(self) -> int:
        """``d = D / h``."""
        return self.embed_dim // self.num_heads

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, embed_dim={self.embed_dim}, "
            f"num_heads={self.num_heads}, num_layers={self.num_layers}, "
            f"max_len={self.max_len}"
        )

    def _check(self, tokens, ablate, weights_hook):
        _check_integer("tokens", tokens)
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (b, n), got shape {tuple(tokens.shape)}")
        n = tokens.shape[1]
        if not 1 <= n <= self.max_len:
            raise ValueError(
                f"tokens must have 1 <= n <= max_len={self.max_len} positions, got {n}"
            )
        check_same_device(tokens=tokens, parameters=self.embed.weight)
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(
                f"tokens must lie in [0, {self.vocab_size}), got values in "
                f"[{int(tokens.min())}, {int(tokens.max())}]"
            )
        heads = set()
        for pair in ablate or ():
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(f"ablate must hold (layer, head) pairs, got {pair!r}")
            layer, head = (
                check_int("ablated layer", pair[0]),
                check_int("ablated head", pair[1]),
            )
            if not (0 <= layer < self.num_layers and 0 <= head < self.num_heads):
                raise ValueError(
                    f"ablate: (layer, head) must lie in [0, {self.num_layers}) x "
                    f"[0, {self.num_heads}), got {pair}"
                )
            heads.add((layer, head))
        if weights_hook is not None and not callable(weights_hook):
            raise TypeError(
                "weights_hook must be callable or None, "
                f"got {type(weights_hook).__name__}"
            )
        return heads

    def _run(self, tokens, ablate, weights_hook, keep: bool):
        heads = self._check(tokens, ablate, weights_hook)
        b, n = tokens.shape
        h, d = self.num_heads, self.head_dim
        x = self.embed(tokens) + self.pos_embed.weight[:n]  # (b, n, D)
        residuals, maps, contributions = [x], [], []
        for index, layer in enumerate(self.layers):
            assert isinstance(layer, MultiHeadAttention)  # what __init__ built
            q = split_heads(layer.w_query(x), h)  # (b, h, n, d)
            k = split_heads(layer.w_key(x), h)  # (b, h, n, d)
            v = split_heads(layer.w_value(x), h)  # (b, h, n, d)
            scores, causal = attention_scores(q, k, is_causal=True)  # (b, h, n, n)
            weights = masked_softmax(scores, causal)  # (b, h, n, n)
            if weights_hook is not None:
                replaced = weights_hook(index, weights)
                if replaced is not None:
                    _check_replaced(replaced, weights, index)
                    weights = replaced
            w_o = layer.w_out.weight.reshape(self.embed_dim, h, d)  # (D, h, d)
            per_head = torch.einsum("bhid,Dhd->bhiD", weights @ v, w_o)  # (b, h, n, D)
            off = [head for (lay, head) in heads if lay == index]
            if off:
                keep_mask = torch.ones(
                    h, 1, 1, dtype=per_head.dtype, device=per_head.device
                )
                keep_mask[off] = 0.0
                per_head = per_head * keep_mask
            x = x + per_head.sum(1)  # (b, n, D)
            maps.append(weights)
            if keep:
                residuals.append(x)
                contributions.append(per_head)
        logits = self.unembed(x)  # (b, n, V)
        return logits, residuals, maps, contributions

    def forward(
        self,
        tokens: Tensor,
        *,
        need_weights: bool = False,
        ablate: Iterable[tuple[int, int]] | None = None,
        weights_hook: Callable[[int, Tensor], Tensor | None] | None = None,
    ):
        """Next-token logits of every position.

        Args:
            tokens: ``(b, n)`` integer ids in ``[0, V)``, ``n <= max_len``.
            need_weights: also return the attention maps.
            ablate: ``(layer, head)`` pairs whose contribution to the stream is zeroed.
            weights_hook: ``f(layer, weights) -> weights or None``, called with each
                layer's ``(b, h, n, n)`` maps before they mix the values; a returned
                tensor of the same shape, dtype and device replaces them (e.g. to
                patch or scramble a pattern).

        Returns:
            ``logits`` ``(b, n, V)``, or ``(logits, weights)`` with weights
            ``(L, b, h, n, n)`` when ``need_weights``.
        """
        check_bool("need_weights", need_weights)
        logits, _, maps, _ = self._run(tokens, ablate, weights_hook, keep=False)
        if not need_weights:
            return logits
        b, n = tokens.shape
        empty = logits.new_zeros(0, b, self.num_heads, n, n)
        return logits, (torch.stack(maps) if maps else empty)

    def trace(
        self,
        tokens: Tensor,
        *,
        ablate: Iterable[tuple[int, int]] | None = None,
        weights_hook: Callable[[int, Tensor], Tensor | None] | None = None,
    ) -> AttentionOnlyTrace:
        """Run ``tokens`` and keep every map, every head's contribution and the stream.

        Arguments as in :meth:`forward`. Returns an :class:`AttentionOnlyTrace`.
        """
        logits, residuals, maps, contributions = self._run(
            tokens, ablate, weights_hook, keep=True
        )
        b, n = tokens.shape
        h, dim = self.num_heads, self.embed_dim
        if not maps:
            maps_t = logits.new_zeros(0, b, h, n, n)
            contrib_t = logits.new_zeros(0, b, h, n, dim)
        else:
            maps_t, contrib_t = torch.stack(maps), torch.stack(contributions)
        return AttentionOnlyTrace(
            logits=logits,
            weights=maps_t,
            contributions=contrib_t,
            residuals=torch.stack(residuals),
        )
