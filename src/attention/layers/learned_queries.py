"""Cross-attention from learned queries: Perceiver latents and DETR object queries
(chapter 8).

In an encoder-decoder the queries of cross-attention come from the decoder's tokens.
Here they are parameters: ``m`` learned vectors, the same for every input, that attend
to an input of any size ``n`` and return ``m`` outputs. The Perceiver (Jaegle et al.,
2021) calls them *latents*: a fixed-size summary of an input too large, or too
variable, to attend over with itself. DETR (Carion et al., 2020) calls them *object
queries*: each one returns one predicted object (or "no object"), and training matches
the predictions to the real objects one to one (:func:`match_queries`).

:class:`LatentCrossAttention` is that block: a learned ``(m, embed_dim)`` query
matrix and a :class:`~attention.MultiHeadAttention` whose keys and values come from the
input. Two toy tasks, small enough to train on a CPU in seconds, come with it:
:func:`typed_set_batch` (latents that each average the items of one type in a set of
variable size) and :func:`scene_batch` (object queries that each claim one object of a
1-D scene).

Shape legend: ``b`` batch, ``m`` learned queries (latents), ``n`` input elements,
``h`` heads, ``d`` ``embed_dim``, ``d_in`` ``input_dim``.

Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``. A variable-size input is padded
to ``n`` elements and described by ``input_mask`` ``(b, n)``: True at the real
elements (those that may be attended), False at the padding.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_device,
    check_dtype,
    check_generator,
    check_int,
    check_like,
    check_mask,
    check_positive,
    check_tensor,
)
from .multihead import MultiHeadAttention

__all__ = [
    "LatentCrossAttention",
    "SetBatch",
    "typed_set_batch",
    "SceneBatch",
    "scene_batch",
    "match_queries",
]


class LatentCrossAttention(nn.Module):
    r"""Learned queries attending to an input of any size (Perceiver, DETR).

    .. math::
        Z = \operatorname{MHA}(L,\ X,\ X) \in \mathbb{R}^{b \times m \times d},
        \qquad L \in \mathbb{R}^{m \times d} \text{ learned}

    The ``m`` rows of ``latents`` are the queries, shared by every input of the batch;
    the keys and values are projections of the input ``X`` ``(b, n, d_in)``. The
    output has ``m`` rows whatever ``n`` is, so a set of 3 elements and a set of 3,000
    are both summarised in ``m`` vectors, at a cost of ``O(m n)`` scores instead of
    self-attention's ``O(n^2)``. The module is cross-attention with the queries given:
    ``layer(x)`` equals ``layer.attn(q, x, x)`` with
    ``q = layer.latents.expand(b, m, d)``.

    Args:
        num_latents: ``m``, the number of learned queries.
        embed_dim: ``d``, the size of each query and of each output row.
        num_heads: ``h``, heads of the attention (default 1).
        input_dim: ``d_in``, features of each input element (default ``embed_dim``).
        head_dim: size of each head (default ``embed_dim // num_heads``).
        bias: give the attention's four projections a bias (default True).
        init_std: the latents start as ``N(0, init_std^2)`` entries (default 1.0, as
            DETR's ``nn.Embedding`` of object queries; the Perceiver uses 0.02).
        device, dtype: where and in which dtype to create the parameters.

    Attributes:
        latents: ``(m, d)`` parameter, the learned queries.
        attn: the :class:`~attention.MultiHeadAttention` (``kdim = vdim = d_in``).

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> pool = LatentCrossAttention(4, 16, num_heads=2, input_dim=5)
        >>> x = torch.randn(3, 7, 5)  # 3 sets of up to 7 elements
        >>> real = torch.arange(7) < torch.tensor([[7], [4], [2]])  # (3, 7)
        >>> out, w = pool(x, input_mask=real, need_weights=True)
        >>> out.shape, w.shape  # 4 rows per set, whatever its size
        (torch.Size([3, 4, 16]), torch.Size([3, 2, 4, 7]))
        >>> bool((w[2, :, :, 2:] == 0).all())  # no weight on the padding
        True
    """

    def __init__(
        self,
        num_latents: int,
        embed_dim: int,
        num_heads: int = 1,
        *,
        input_dim: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        init_std: float = 1.0,
        device=None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_latents = check_int("num_latents", num_latents, minimum=1)
        embed_dim = check_int("embed_dim", embed_dim, minimum=1)
        input_dim = (
            embed_dim
            if input_dim is None
            else check_int("input_dim", input_dim, minimum=1)
        )
        init_std = check_positive("init_std", init_std)
        device = check_device("device", device)
        dtype = None if dtype is None else check_dtype("dtype", dtype, floating=True)
        self.embed_dim, self.input_dim = embed_dim, input_dim
        self.attn = MultiHeadAttention(
            embed_dim,
            num_heads,
            head_dim=head_dim,
            kdim=input_dim,
            vdim=input_dim,
            bias=bias,
            device=device,
            dtype=dtype,
        )
        weight = self.attn.w_query.weight
        self.latents = nn.Parameter(
            torch.randn(self.num_latents, embed_dim, device=weight.device).to(
                weight.dtype
            )
            * init_std
        )

    @property
    def num_heads(self) -> int:
        """``h``, the heads of the attention."""
        return self.attn.num_heads

    def extra_repr(self) -> str:
        return (
            f"num_latents={self.num_latents}, embed_dim={self.embed_dim}, "
            f"input_dim={self.input_dim}"
        )

    def forward(
        self,
        x: Tensor,
        *,
        input_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from the ``m`` learned queries to the elements of ``x``.

        Args:
            x: ``(b, n, d_in)``, the input: a set or a sequence, padded to ``n``.
            input_mask: ``(b, n)`` boolean, **True = a real element** that may be
                attended, False = padding. Every row needs at least one True (a query
                with nothing to attend to has no answer). None: every element is real.
            attn_mask: any other mask, boolean (**True = may attend**) or float (added
                to the scores), broadcastable to ``(b, h, m, n)``; combined with
                ``input_mask`` (a boolean AND, a float one gets ``-inf`` at the
                padding).
            need_weights: also return the weights.

        Returns:
            ``(output, weights)``: output ``(b, m, d)``; weights ``(b, h, m, n)`` (row =
            learned query, column = input element; exactly 0 on the padding) if
            ``need_weights`` else ``None``.
        """
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.input_dim:
            raise ValueError(
                f"x must have shape (b, n, input_dim={self.input_dim}), "
                f"got {tuple(x.shape)}"
            )
        check_like("x", x, "the module's parameters", self.latents)
        check_bool("need_weights", need_weights)
        b, n = x.shape[0], x.shape[1]
        mask = attn_mask
        if input_mask is not None:
            check_tensor("input_mask", input_mask, dtype=torch.bool)
            if tuple(input_mask.shape) != (b, n):
                raise ValueError(
                    f"input_mask must have shape (b, n) = {(b, n)} (True = a real "
                    f"element), got {tuple(input_mask.shape)}"
                )
            if input_mask.device != x.device:
                raise ValueError(
                    "x and input_mask must be on the same device, "
                    f"got {x.device} and {input_mask.device}"
                )
            empty = (~input_mask.any(-1)).nonzero().flatten()
            if n > 0 and empty.numel():
                raise ValueError(
                    "every input needs at least one real element (a True in "
                    f"input_mask), but row {int(empty[0])} has none"
                )
            keep = input_mask[:, None, None, :]  # (b, 1, 1, n)
            if attn_mask is None:
                mask = keep
            else:
                check_mask(
                    attn_mask,
                    x.dtype,
                    (b, self.num_heads, self.num_latents, n),
                    device=x.device,
                )
                if attn_mask.dtype == torch.bool:
                    mask = attn_mask & keep
                else:
                    mask = attn_mask.masked_fill(~keep, float("-inf"))
        queries = self.latents.expand(b, *self.latents.shape)  # (b, m, d)
        return self.attn(queries, x, x, attn_mask=mask, need_weights=need_weights)


# --- toy task: a typed set


class SetBatch(NamedTuple):
    """One batch of :func:`typed_set_batch`.

    ``items`` ``(b, n, T + 1)``: each element's type, one-hot over ``T`` types, then
    its value (zeros at the padding); ``mask`` ``(b, n)``: True at the real elements;
    ``types`` ``(b, n)``: each element's type (-1 at the padding); ``target``
    ``(b, T)``: the mean value of the elements of each type.
    """

    items: Tensor
    mask: Tensor
    types: Tensor
    target: Tensor


def typed_set_batch(
    batch_size: int,
    *,
    num_types: int = 4,
    max_items: int = 12,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> SetBatch:
    """Sets of typed values, of random sizes; the answer is the mean value per type.

    Each set holds between ``num_types`` and ``max_items`` elements (uniformly), at
    least one of every type, in a random order, padded to ``max_items``. An element is
    a type (one of ``num_types``) and a value drawn from ``N(0, 1)``. The target of
    type ``t`` is the mean of the values of type ``t``: a latent that puts equal weight
    on every element of type ``t``, and none elsewhere, reads it off exactly. The
    answer does not depend on the order of the elements, nor on how many padding
    slots follow them.

    Args:
        batch_size: ``b``.
        num_types: ``T``.
        max_items: ``n``, the padded size (at least ``num_types``).
        generator: a seeded ``torch.Generator`` for reproducible batches.
        dtype: of ``items`` and ``target``.

    Returns:
        :class:`SetBatch`.

    Example:
        >>> batch = typed_set_batch(2, generator=torch.Generator().manual_seed(0))
        >>> batch.items.shape, batch.mask.shape, batch.target.shape
        (torch.Size([2, 12, 5]), torch.Size([2, 12]), torch.Size([2, 4]))
    """
    b = check_int("batch_size", batch_size, minimum=1)
    t = check_int("num_types", num_types, minimum=1)
    n = check_int("max_items", max_items, minimum=1)
    if n < t:
        raise ValueError(
            f"max_items must be >= num_types (one element of every type), "
            f"got {n} and {t}"
        )
    check_generator(generator, torch.device("cpu"))
    dtype = check_dtype("dtype", dtype, floating=True)
    sizes = torch.randint(t, n + 1, (b,), generator=generator)  # (b,)
    # the first T slots hold one element of each type, the rest random types
    types = torch.randint(t, (b, n), generator=generator)
    types[:, :t] = torch.arange(t)
    order = torch.rand(b, n, generator=generator)
    real = torch.arange(n)[None, :] < sizes[:, None]  # (b, n) before shuffling
    # shuffle the real elements among themselves; the padding stays at the end
    order = order.masked_fill(~real, float("inf"))
    perm = order.argsort(-1)
    types = types.gather(-1, perm)
    values = torch.randn(b, n, generator=generator, dtype=torch.float64)
    types = types.masked_fill(~real, -1)
    values = values.masked_fill(~real, 0.0)
    one_hot = (types[..., None] == torch.arange(t)).to(torch.float64)  # (b, n, T)
    counts = one_hot.sum(1)  # (b, T), each >= 1
    target = (one_hot * values[..., None]).sum(1) / counts  # (b, T)
    items = torch.cat([one_hot, values[..., None]], dim=-1).to(dtype)
    return SetBatch(items, real, types, target.to(dtype))


# --- toy task: a 1-D scene


class SceneBatch(NamedTuple):
    """One batch of :func:`scene_batch`.

    ``cells`` ``(b, W, C + 1 + W)``: each cell's content, one-hot over background and
    ``C`` classes, then its position, one-hot over ``W``; ``classes`` ``(b, K)``: the
    class of each object, ``1 ... C`` (0 = no object, in the slots after the last
    one); ``positions`` ``(b, K)``: the cell of each object (-1 in empty slots);
    ``count`` ``(b,)``: the number of objects.
    """

    cells: Tensor
    classes: Tensor
    positions: Tensor
    count: Tensor


def scene_batch(
    batch_size: int,
    *,
    width: int = 16,
    regions: int = 4,
    num_classes: int = 3,
    max_objects: int = 3,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> SceneBatch:
    """1-D scenes of ``width`` cells holding 1 to ``max_objects`` objects.

    The strip is cut into ``regions`` equal regions; each object sits in a different
    region, at a random cell of it, with a random class ``1 ... C``; the other cells
    are background (class 0). The objects are listed left to right. A DETR-style model
    with one object query per region can claim each object with one query, and
    answer "no object" with the queries whose region is empty.

    Args:
        batch_size: ``b``.
        width: ``W`` cells, a multiple of ``regions``.
        regions: the number of regions, at least ``max_objects``.
        num_classes: ``C`` object classes.
        max_objects: ``K``, the most objects in a scene.
        generator: a seeded ``torch.Generator`` for reproducible batches.
        dtype: of ``cells``.

    Returns:
        :class:`SceneBatch`.

    Example:
        >>> s = scene_batch(2, generator=torch.Generator().manual_seed(0))
        >>> s.cells.shape, s.classes.shape, s.count.tolist()
        (torch.Size([2, 16, 20]), torch.Size([2, 3]), [3, 1])
    """
    b = check_int("batch_size", batch_size, minimum=1)
    w = check_int("width", width, minimum=1)
    r = check_int("regions", regions, minimum=1)
    c = check_int("num_classes", num_classes, minimum=1)
    k = check_int("max_objects", max_objects, minimum=1)
    if w % r:
        raise ValueError(f"width must be a multiple of regions, got {w} and {r}")
    if k > r:
        raise ValueError(
            f"max_objects must be <= regions (one object per region), got {k} and {r}"
        )
    check_generator(generator, torch.device("cpu"))
    dtype = check_dtype("dtype", dtype, floating=True)
    size = w // r
    count = torch.randint(1, k + 1, (b,), generator=generator)  # (b,)
    # which regions hold an object: the first `count` of a random order, sorted
    chosen = torch.rand(b, r, generator=generator).argsort(-1)[:, :k]  # (b, K)
    used = torch.arange(k)[None, :] < count[:, None]  # (b, K)
    chosen = chosen.masked_fill(~used, r).sort(-1).values  # empty slots last
    offset = torch.randint(size, (b, k), generator=generator)
    classes = torch.randint(1, c + 1, (b, k), generator=generator)
    positions = torch.where(used, chosen * size + offset, -1)
    classes = classes.masked_fill(~used, 0)
    content = torch.zeros(b, w, dtype=torch.long)  # background
    rows = torch.arange(b)[:, None].expand(b, k)
    content[rows[used], positions[used]] = classes[used]
    cells = torch.cat(
        [
            nn.functional.one_hot(content, c + 1),
            torch.eye(w, dtype=torch.long).expand(b, w, w),
        ],
        dim=-1,
    ).to(dtype)
    return SceneBatch(cells, classes, positions, count)


def match_queries(cost: Tensor, count: Tensor | None = None) -> Tensor:
    """The one-to-one assignment of objects to queries of least total cost (DETR).

    DETR matches its ``m`` predictions to the ``g <= m`` real objects of an image with
    the Hungarian algorithm, then trains each matched query on its object and every
    other query on "no object". For the few queries of a toy, trying every assignment
    is exact and fast: ``m! / (m - g)!`` of them.

    Args:
        cost: ``(b, m, g)`` floating, ``cost[n, q, o]`` the cost of giving object ``o``
            to query ``q`` (e.g. minus the probability the query gives the object's
            class).
        count: ``(b,)`` integers, the real objects of each example (the first
            ``count[n]`` columns; the others are ignored). None: all ``g``.

    Returns:
        ``(b, g)`` LongTensor: the query assigned to each object (-1 for the ignored
        columns); no query serves two objects.

    Example:
        >>> cost = torch.tensor([[[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]]])  # (1, 3, 2)
        >>> match_queries(cost).tolist()
        [[1, 0]]
    """
    check_tensor("cost", cost, floating=True)
    if cost.dim() != 3:
        raise ValueError(f"cost must have shape (b, m, g), got {tuple(cost.shape)}")
    b, m, g = cost.shape
    if g > m:
        raise ValueError(
            f"there must be at least as many queries as objects, got m={m} and g={g}"
        )
    if m > 8:
        raise ValueError(
            f"match_queries tries every assignment, which is for at most 8 queries, "
            f"got {m} (use scipy.optimize.linear_sum_assignment)"
        )
    if count is None:
        count = torch.full((b,), g, dtype=torch.long)
    check_tensor("count", count)
    if count.dtype in (torch.bool,) or count.is_floating_point() or count.is_complex():
        raise TypeError(f"count must hold integers, got {count.dtype}")
    if tuple(count.shape) != (b,):
        raise ValueError(f"count must have shape (b,) = ({b},), got {count.shape}")
    if bool(((count < 0) | (count > g)).any()):
        raise ValueError(f"count must lie in [0, g={g}], got {count.tolist()}")
    if g == 0:
        return torch.empty(b, 0, dtype=torch.long, device=cost.device)
    # every ordered choice of g distinct queries: (P, g)
    choices = torch.tensor(
        list(itertools.permutations(range(m), g)), device=cost.device
    )
    real = torch.arange(g, device=cost.device)[None, :] < count[:, None]  # (b, g)
    # cost of object o under choice p: cost[n, choices[p, o], o]
    picked = cost.detach()[:, choices, torch.arange(g, device=cost.device)]  # (b, P, g)
    total = (picked * real[:, None, :]).sum(-1)  # (b, P)
    best = choices[total.argmin(-1)]  # (b, g)
    return best.masked_fill(~real, -1)
