r"""Attention weights beyond softmax (chapter 20).

Shape legend: ``b`` batch (any number of leading dims), ``h`` query heads, ``h_kv``
key/value heads, ``i`` query positions, ``j`` key positions, ``d`` query/key size, ``e``
value size, ``n`` any normalised axis.

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as
in ``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the
scores.

Softmax gives every key a positive weight and makes the keys of a row compete for one
unit of weight. The maps here change one or the other:

* :func:`sparsemax` :cite:`martins2016softmax` and :func:`entmax15`
  :cite:`peters2019sparse` are projections onto the probability simplex that give exact
  zeros: rows still sum to one, but unlikely keys get nothing;
* :func:`sigmoid_attention` :cite:`ramapuram2024theory` scores each key on its own, with
  no competition between keys and no normalisation;
* :func:`differential_attention` :cite:`ye2024differential` subtracts a second softmax
  map, cancelling weight that both maps give to the same irrelevant keys;
* :class:`RefinedSelfAttention` attends over the rows of the attention matrix itself,
  the idea of attention-weight refinement for sequential recommendation
  :cite:`liu2024pay`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_choice,
    check_dim,
    check_int,
    check_like,
    check_real,
    check_same_device,
    check_same_dtype,
    check_size,
    check_tensor,
    validate_attention,
    validate_weights,
)
from .._core import (
    add_mask,
    attention_scores,
    expand_kv_heads,
    masked_softmax,
    max_shift,
    row_max,
)

__all__ = [
    "sparsemax",
    "entmax15",
    "sigmoid_attention",
    "differential_attention",
    "differential_lambda_init",
    "DifferentialAttention",
    "RefinedSelfAttention",
]


# ------------------------------------------------------------------ sparsemax, entmax
def _shifted_rows(x: Tensor, dim: int) -> Tensor:
    """``x`` moved so ``dim`` is last, minus each row's maximum, in at least float32.

    Both maps are invariant to a shift of the row, and without it ``1 + k z`` and
    ``max z - 1`` round to ``k z`` and ``max z`` for large logits (``[1e8, 0]`` in
    float32, ``[4096, 0]`` in float16). A row whose maximum is ``-inf`` is not shifted;
    a ``+inf`` maximum turns the row NaN (``inf - inf``), as in ``torch.softmax``.
    Half-precision rows are summed in float32, as torch's softmax does on the CPU.
    """
    z = x.transpose(dim, -1)
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()
    return z - max_shift(row_max(z, -1))


class _Sparsemax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        z = _shifted_rows(x, dim)  # (..., n), maximum 0
        ordered, _ = torch.sort(z, dim=-1, descending=True)
        k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
        cumulative = ordered.cumsum(-1)
        in_support = 1 + k * ordered > cumulative  # a prefix of the sorted row
        support = in_support.sum(-1, keepdim=True)  # |S|
        tau = (cumulative.gather(-1, (support - 1).clamp(min=0)) - 1) / support
        p = torch.clamp(z - tau, min=0)
        nan_rows = torch.isnan(z).any(-1, keepdim=True)  # NaN propagates, as in softmax
        p = torch.where(nan_rows, torch.full_like(p, math.nan), p)
        p = p.to(x.dtype).transpose(dim, -1)
        ctx.save_for_backward(p)
        ctx.dim = dim
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        s = (p > 0).to(grad.dtype)  # support indicator
        mean = (grad * s).sum(ctx.dim, keepdim=True) / s.sum(ctx.dim, keepdim=True)
        return s * (grad - mean), None  # (diag(s) - s sᵀ/|S|) g


def _check_normalised_input(x, dim) -> int:
    check_tensor("x", x, floating=True, min_dim=1)
    return check_dim("dim", dim, x.dim())


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Sparsemax: the Euclidean projection of ``x`` onto the probability simplex.

    .. math::

        \operatorname{sparsemax}(z) = \arg\min_{p \in \Delta} \lVert p - z \rVert^2
        = [z - \tau]_+, \qquad \tau = \frac{\sum_{k \le K} z_{(k)} - 1}{K}

    with :math:`z_{(1)} \ge z_{(2)} \ge \dots` the sorted entries and :math:`K` the
    largest :math:`k` with :math:`1 + k z_{(k)} > \sum_{l \le k} z_{(l)}`
    :cite:`martins2016softmax`. Entries below the threshold get exactly 0. The backward
    pass is the closed-form Jacobian :math:`\operatorname{diag}(s) - s s^\top / |S|`
    (``s`` the support indicator). The row's maximum is subtracted first (the map is
    invariant to it), so large logits keep their precision; half-precision inputs are
    computed in float32. ``-inf`` entries get 0; a row containing NaN or ``+inf``, or
    only ``-inf``, comes out NaN, as in ``torch.softmax``. A zero-width row
    (``x.shape[dim] = 0``) gives the empty tensor back, as ``torch.softmax`` does.

    Args:
        x: any floating tensor, ``(..., n)`` when ``dim = -1``.
        dim: the axis that sums to one.

    Returns:
        A tensor of ``x``'s shape, non-negative, summing to one along ``dim``.

    Example:
        >>> import torch
        >>> p = sparsemax(torch.tensor([1.0, 0.8, -1.0]))  # the last key gets exactly 0
        >>> [round(v, 4) for v in p.tolist()]
        [0.6, 0.4, 0.0]
    """
    dim = _check_normalised_input(x, dim)
    if x.shape[dim] == 0:  # nothing to normalise, as torch.softmax
        return x.clone()
    return _Sparsemax.apply(x, dim)


class _Entmax15(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, iterations):
        z = _shifted_rows(x, dim) / 2  # (alpha - 1) z, alpha = 1.5; maximum 0
        high = torch.zeros_like(z[..., :1])  # sum p(high) = 0 <= 1
        low = high - 1  # sum p(low) >= 1: the maximum alone gives (0 - (-1))² = 1
        for _ in range(iterations):  # bisection on the threshold
            tau = (low + high) / 2
            too_much = torch.clamp(z - tau, min=0).square().sum(-1, keepdim=True) >= 1
            low = torch.where(too_much, tau, low)
            high = torch.where(too_much, high, tau)
        p = torch.clamp(z - (low + high) / 2, min=0).square()
        p = p / p.sum(-1, keepdim=True)  # remove the last bisection slack
        p = p.to(x.dtype).transpose(dim, -1)
        ctx.save_for_backward(p)
        ctx.dim = dim
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        g = p.sqrt()  # p^(2 - alpha)
        shift = (g * grad).sum(ctx.dim, keepdim=True) / g.sum(ctx.dim, keepdim=True)
        return g * (grad - shift), None, None  # (diag(g) - g gᵀ/Σg) grad


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    r"""1.5-entmax: between softmax (α = 1) and sparsemax (α = 2), with exact zeros.

    .. math::

        \operatorname{entmax}_{1.5}(z)_n = \left[\tfrac{z_n}{2} - \tau\right]_+^2,
        \qquad \tau \text{ such that } \textstyle\sum_n p_n = 1

    :cite:`peters2019sparse`. The row's maximum is subtracted first (the map is
    invariant to it), so :math:`\max z = 0`; the threshold :math:`\tau` is then found by
    bisection on :math:`[-1, 0]`, where the sum falls from at least one to zero, to the
    precision of the input's dtype (float32 for half-precision inputs, which are
    computed in float32); the result is then renormalised. The backward pass is
    the closed-form Jacobian :math:`\operatorname{diag}(g) - g g^\top / \sum g` with
    :math:`g = \sqrt{p}`.

    Args:
        x: any floating tensor, ``(..., n)`` when ``dim = -1``; finite entries (use a
            large negative number, not ``-inf``, for a masked entry). A row with NaN
            comes out NaN; a zero-width row gives the empty tensor back, as in
            ``torch.softmax``.
        dim: the axis that sums to one.

    Returns:
        A tensor of ``x``'s shape, non-negative, summing to one along ``dim``.

    Example:
        >>> import torch
        >>> p = entmax15(torch.tensor([2.0, 1.0, -2.0], dtype=torch.float64))
        >>> # sparser than softmax, smoother than sparsemax
        >>> [round(v, 4) for v in p.tolist()]
        [0.8307, 0.1693, 0.0]
    """
    dim = _check_normalised_input(x, dim)
    if x.shape[dim] == 0:  # nothing to normalise, as torch.softmax
        return x.clone()
    if x.device.type != "meta" and torch.isinf(x).any():
        raise ValueError(
            "entmax15 needs finite inputs (its bisection starts from the row's "
            "maximum): give a masked entry a large negative number, not -inf"
        )
    work = torch.promote_types(x.dtype, torch.float32)  # half precision: float32
    iterations = round(-math.log2(torch.finfo(work).eps)) + 4  # one bit per step
    return _Entmax15.apply(x, dim, iterations)


# ------------------------------------------------------------------ sigmoid attention
def _sigmoid_weights(
    query, key, attn_mask, is_causal, scale, bias, enable_gqa
) -> Tensor:
    scores, attn_mask = attention_scores(
        query, key, attn_mask, is_causal, scale, enable_gqa
    )  # (..., h, i, j)
    j = scores.shape[-1]
    if bias is None:
        bias = -math.log(j) if j > 0 else 0.0
    scores = scores + bias  # (..., h, i, j)
    if attn_mask is not None:  # added, as torch adds a mask: sigmoid(-inf) = 0 exactly,
        scores = add_mask(scores, attn_mask)  # and a masked NaN or +inf score stays NaN
    return torch.sigmoid(scores)


def sigmoid_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    bias: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    r"""Sigmoid attention: each key weighted on its own, no softmax over the keys.

    .. math::

        o_i = \sum_j \sigma(s\, q_i \cdot k_j + b)\, v_j,
        \qquad b = -\log j \text{ by default}

    :cite:`ramapuram2024theory`. The weights of a row need not sum to one, and one key's
    weight does not depend on the others' scores. The bias :math:`-\log j` starts the
    total weight of a row near one when the scores are near zero
    (:math:`j\,\sigma(-\log j) \approx 1`), as softmax's rows are.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, j, d)``.
        value: ``(..., h_kv, j, e)``.
        attn_mask: boolean (**True = may attend**; blocked keys get weight exactly 0) or
            float, broadcastable to ``(..., h, i, j)``; added to the scores before the
            sigmoid (a boolean one as 0 or -inf), so a NaN or ``+inf`` score against a
            blocked key still makes its row NaN, as in the dense reference.
        is_causal: top-left causal mask; not together with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        bias: added to every score; ``None`` means :math:`-\log j`.
        enable_gqa: ``h`` a multiple of ``h_kv``; query head ``n`` reads key/value head
            ``n // (h / h_kv)``.

    Returns:
        ``(..., h, i, e)``.

    Example:
        >>> import torch
        >>> q, k, v = torch.zeros(1, 1, 2), torch.zeros(1, 4, 2), torch.ones(1, 4, 1)
        >>> sigmoid_attention(q, k, v).tolist()  # 4 · sigmoid(-log 4) = 4 · 0.2
        [[[0.800000011920929]]]
    """
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    if bias is not None:
        bias = check_real("bias", bias)
    weights = _sigmoid_weights(
        query, key, attn_mask, is_causal, scale, bias, enable_gqa
    )
    if enable_gqa:
        value = expand_kv_heads(value, query.shape[-3])  # (..., h, j, e)
    return weights @ value  # (..., h, i, e)


# --------------------------------------------------------------- differential attention
def differential_lambda_init(layer_index: int) -> float:
    r"""The Differential Transformer's initial :math:`\lambda` for layer ``layer_index``
    (1-based).

    .. math:: \lambda_\text{init} = 0.8 - 0.6\, e^{-0.3\,(l - 1)}

    :cite:`ye2024differential`: 0.2 in the first layer, approaching 0.8 in deep ones.

    Example:
        >>> first, deep = differential_lambda_init(1), differential_lambda_init(12)
        >>> round(first, 4), round(deep, 4)
        (0.2, 0.7779)
    """
    check_int("layer_index", layer_index, minimum=1)
    return 0.8 - 0.6 * math.exp(-0.3 * (layer_index - 1))


def _check_lambda(lam, query: Tensor) -> Tensor | float:
    if isinstance(lam, Tensor):
        check_tensor("lam", lam, floating=True)
        if not (lam.dim() == 0 and lam.device.type == "cpu"):  # torch's scalar rule
            check_same_device(query1=query, lam=lam)
        h = query.shape[-3] if query.dim() >= 3 else 1  # (i, d): no heads axis
        if lam.dim() > 1 or (lam.dim() == 1 and lam.shape[0] not in (1, h)):
            heads = f"({h},)" if query.dim() >= 3 else "(1,) for inputs without heads"
            raise ValueError(
                f"lam must be a number, a 0-d tensor or one value per head, shape "
                f"{heads}, got {tuple(lam.shape)}"
            )
        if lam.dim() == 1 and query.dim() >= 3:  # (h, 1, 1) against (..., h, i, j)
            return lam.to(query.dtype)[:, None, None]
        return lam.to(query.dtype).reshape(())  # one value for every head
    return check_real("lam", lam)


def _differential_weights(query1, query2, key1, key2, lam, attn_mask, is_causal, scale):
    first = masked_softmax(*attention_scores(query1, key1, attn_mask, is_causal, scale))
    second = masked_softmax(
        *attention_scores(query2, key2, attn_mask, is_causal, scale)
    )
    return first - lam * second  # (..., h, i, j)


def differential_attention(
    query1: Tensor,
    query2: Tensor,
    key1: Tensor,
    key2: Tensor,
    value: Tensor,
    lam: float | Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    r"""Differential attention: the difference of two softmax maps, applied to one
    value.

    .. math::

        o = \big(\operatorname{softmax}(s\,Q_1 K_1^\top) - \lambda\,
        \operatorname{softmax}(s\,Q_2 K_2^\top)\big)\, V

    :cite:`ye2024differential`. Weight that both maps put on the same keys (common-mode
    noise, such as a distractor every query half-matches) cancels; the rows of the
    difference sum to :math:`1 - \lambda` and may be negative.

    Args:
        query1, query2: ``(..., h, i, d)``.
        key1, key2: ``(..., h, j, d)``.
        value: ``(..., h, j, e)`` (the paper's value has ``e = 2d``).
        lam: :math:`\lambda`, a number or a tensor of shape ``()`` or ``(h,)``.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``, used by both maps.
        is_causal: top-left causal mask; not together with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.

    Returns:
        ``(..., h, i, e)``.

    Example:
        >>> import torch
        >>> q, k, v = torch.zeros(1, 1, 2), torch.zeros(1, 3, 2), torch.ones(1, 3, 1)
        >>> differential_attention(q, q, k, k, v, 0.5).tolist()  # (1 - 0.5) · mean of v
        [[[0.5]]]
    """
    validate_attention(query1, key1, value, attn_mask, is_causal, scale, False)
    validate_weights(query2, key2, attn_mask, is_causal, scale, False)
    check_same_dtype(query1=query1, query2=query2)
    check_same_device(query1=query1, query2=query2)
    for name, a, b in (("query2", query2, query1), ("key2", key2, key1)):
        if a.shape != b.shape:
            raise ValueError(
                f"{name} must have the shape of {name[:-1]}1, "
                f"{tuple(b.shape)}, got {tuple(a.shape)}"
            )
    lam = _check_lambda(lam, query1)
    weights = _differential_weights(
        query1, query2, key1, key2, lam, attn_mask, is_causal, scale
    )
    return weights @ value  # (..., h, i, e)


class DifferentialAttention(nn.Module):
    r"""Multi-head differential self-attention, as in the Differential Transformer.

    Each head has two query/key pairs of size ``d = embed_dim / (2 h)`` and one value of
    size ``2d``; its output is normalised (RMS over its ``2d`` channels, per head) and
    multiplied by :math:`1 - \lambda_\text{init}`, and the heads are concatenated and
    projected. The learned :math:`\lambda` is re-parametrised as
    :math:`e^{\lambda_{q1} \cdot \lambda_{k1}} - e^{\lambda_{q2} \cdot \lambda_{k2}} +
    \lambda_\text{init}`, one scalar shared by the layer's heads
    :cite:`ye2024differential`. The per-head norm has no learned scale, as in Hugging
    Face's ``DiffLlamaAttention`` (which this layer equals, without rotary embeddings,
    once the heads are re-ordered; the tests check it); a learned scale initialised at
    one would start out identical.

    Args:
        embed_dim: model size; a multiple of ``2 * num_heads``.
        num_heads: ``h``.
        layer_index: the layer's 1-based depth, for :func:`differential_lambda_init`.
        bias: add biases to the projections.

    ``forward(x, *, attn_mask=None, is_causal=False)`` takes ``x`` of shape
    ``(b, n, embed_dim)`` and a boolean mask (**True = may attend**) broadcastable to
    ``(b, h, n, n)``, and returns ``(output (b, n, embed_dim), weights (b, h, n, n))``,
    the weights being the differential map of each head.

    Example:
        >>> import torch
        >>> layer = DifferentialAttention(16, 2)
        >>> out, weights = layer(torch.randn(1, 5, 16), is_causal=True)
        >>> out.shape, weights.shape
        (torch.Size([1, 5, 16]), torch.Size([1, 2, 5, 5]))
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        layer_index: int = 1,
        bias: bool = False,
    ) -> None:
        super().__init__()
        check_size("embed_dim", embed_dim)
        check_size("num_heads", num_heads)
        check_bool("bias", bias)
        if embed_dim % (2 * num_heads):
            raise ValueError(
                "embed_dim must be a multiple of 2 * num_heads (two query/key "
                f"pairs per head), got {embed_dim} and {num_heads}"
            )
        self.num_heads, self.head_dim = num_heads, embed_dim // (2 * num_heads)
        self.lambda_init = differential_lambda_init(layer_index)
        self.w_query = nn.Linear(embed_dim, embed_dim, bias=bias)  # 2 h d = embed_dim
        self.w_key = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_value = nn.Linear(embed_dim, embed_dim, bias=bias)  # h · 2d
        self.w_out = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(self.head_dim) * 0.1) for _ in range(4)
        )

    def lam(self) -> Tensor:
        """The current :math:`\\lambda` (a 0-d tensor)."""
        return (
            torch.exp(self.lambda_q1 @ self.lambda_k1)
            - torch.exp(self.lambda_q2 @ self.lambda_k2)
            + self.lambda_init
        )

    def forward(
        self, x: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False
    ) -> tuple[Tensor, Tensor]:
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.w_query.in_features:
            raise ValueError(
                f"x must have shape (b, n, {self.w_query.in_features}), got "
                f"{tuple(x.shape)}"
            )
        check_like("x", x, "the module's parameters", self.w_query.weight)
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        q = (
            self.w_query(x).view(b, n, h, 2, d).permute(3, 0, 2, 1, 4)
        )  # (2, b, h, n, d)
        k = self.w_key(x).view(b, n, h, 2, d).permute(3, 0, 2, 1, 4)  # (2, b, h, n, d)
        v = self.w_value(x).view(b, n, h, 2 * d).transpose(1, 2)  # (b, h, n, 2d)
        validate_attention(q[0], k[0], v, attn_mask, is_causal, None, False)
        weights = _differential_weights(
            q[0], q[1], k[0], k[1], self.lam(), attn_mask, is_causal, None
        )  # (b, h, n, n)
        heads = weights @ v  # (b, h, n, 2d)
        heads = heads * torch.rsqrt(heads.square().mean(-1, keepdim=True) + 1e-6)
        heads = (1 - self.lambda_init) * heads
        out = self.w_out(
            heads.transpose(1, 2).reshape(b, n, 2 * h * d)
        )  # (b, n, embed_dim)
        return out, weights


# ------------------------------------------------------------------ weight refinement
_MECHANISMS = ("none", "simple", "value", "additive", "stochastic")


class RefinedSelfAttention(nn.Module):
    r"""Single-head causal self-attention whose weights are refined by attending over
    them.

    Plain attention gives each query ``i`` a row :math:`A_i` of weights over the keys.
    Attention-weight refinement :cite:`liu2024pay` treats those rows as features: a
    second attention, among the queries, compares rows and mixes them, so a query can
    borrow the weight pattern of queries whose patterns resemble its own (a higher-order
    relation between positions). With :math:`R` that second, causal, row-stochastic map,
    the refined weights :math:`RA` are again causal and row-stochastic. The paper names
    four mechanisms (simple, value-weighted and additive refinement for dot-product
    self-attention as in SASRec, and a stochastic one for the Wasserstein self-attention
    of STOSA) and describes them as mapping the attention weights into a new space with
    learnable matrices and attending there. The equations below are this module's
    reading of that description, not the paper's own:

    * ``"simple"``:
      :math:`R = \operatorname{softmax}\big((A W_1)(A W_2)^\top/\sqrt r\big)`, weights
      :math:`RA`;
    * ``"value"``: the rows compared are the value-weighted rows :math:`AV` (the
      attention outputs), weights :math:`RA`;
    * ``"additive"``: as ``"simple"``, but the refinement is added to the plain weights,
      :math:`(A + RA)/2`;
    * ``"stochastic"``: each row is mapped to a diagonal Gaussian (mean :math:`A W_1`,
      scale :math:`\operatorname{elu}(A W_2) + 1`) and :math:`R` is a softmax of minus
      the 2-Wasserstein distances between them, as in stochastic self-attention;
    * ``"none"``: plain attention, for comparison.

    The module is one causal head for position-wise tasks; it does not reproduce the
    paper's recommenders (SASRec and STOSA, with their losses and item sampling).

    Args:
        embed_dim: model size ``d`` (queries, keys and values keep it).
        max_len: the longest sequence; the rows of :math:`A` are padded to it.
        mechanism: one of ``"none"``, ``"simple"``, ``"value"``, ``"additive"``,
            ``"stochastic"``.
        refine_dim: ``r``, the size rows are projected to.

    ``forward(x)`` takes ``x`` of shape ``(b, n, d)`` with ``n <= max_len`` and returns
    ``(output (b, n, d), refined weights (b, n, n))``.

    Example:
        >>> import torch
        >>> layer = RefinedSelfAttention(8, max_len=6, mechanism="simple")
        >>> out, weights = layer(torch.randn(2, 6, 8))
        >>> out.shape, bool(torch.allclose(weights.sum(-1), torch.ones(2, 6)))
        (torch.Size([2, 6, 8]), True)
    """

    def __init__(
        self,
        embed_dim: int,
        max_len: int,
        *,
        mechanism: str = "simple",
        refine_dim: int = 16,
    ) -> None:
        super().__init__()
        check_size("embed_dim", embed_dim)
        check_size("max_len", max_len)
        check_size("refine_dim", refine_dim)
        self.mechanism = check_choice("mechanism", mechanism, _MECHANISMS)
        self.max_len = max_len
        self.w_query = nn.Linear(embed_dim, embed_dim, bias=False)
        self.w_key = nn.Linear(embed_dim, embed_dim, bias=False)
        self.w_value = nn.Linear(embed_dim, embed_dim, bias=False)
        rows_in = embed_dim if mechanism == "value" else max_len
        self.refine_1 = nn.Linear(rows_in, refine_dim, bias=False)
        self.refine_2 = nn.Linear(rows_in, refine_dim, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.w_query.in_features:
            raise ValueError(
                f"x must have shape (b, n, {self.w_query.in_features}), got "
                f"{tuple(x.shape)}"
            )
        check_like("x", x, "the module's parameters", self.w_query.weight)
        n = x.shape[1]
        if not 1 <= n <= self.max_len:
            raise ValueError(
                f"the sequence length n must be between 1 and max_len = "
                f"{self.max_len}, got {n}"
            )
        q, k, v = self.w_query(x), self.w_key(x), self.w_value(x)  # (b, n, d)
        scores, causal = attention_scores(q, k, is_causal=True)  # (b, n, n)
        a = masked_softmax(scores, causal)
        if self.mechanism == "none":
            return a @ v, a
        rows = (
            a @ v
            if self.mechanism == "value"
            else nn.functional.pad(a, (0, self.max_len - n))
        )
        first, second = self.refine_1(rows), self.refine_2(rows)  # (b, n, r)
        if self.mechanism == "stochastic":
            spread = nn.functional.elu(second) + 1
            distance = (
                torch.cdist(first, first).square()
                + torch.cdist(spread, spread).square()
            )  # W2² of diagonal Gaussians
            r = masked_softmax(-distance, causal)
        else:
            r = masked_softmax(*attention_scores(first, second, causal))
        refined = r @ a  # (b, n, n)
        if self.mechanism == "additive":
            refined = (a + refined) / 2
        return refined @ v, refined
