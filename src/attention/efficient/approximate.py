"""Content-based and low-rank approximations of attention (taught in chapter 13).

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``n`` sequence length (self-attention, ``i = j = n``),
``d`` query/key size, ``e`` value size, ``r`` hash rounds, ``c`` chunks, ``C`` chunk
size, ``k`` projected length.

* :func:`lsh_attention` (Reformer {cite}`kitaev2020reformer`): shared queries/keys are
  hashed with random rotations so that similar vectors tend to share a bucket; the
  sequence is sorted by bucket and cut into chunks, and each query attends only inside
  its chunk and the one before it, to keys of its own bucket.
* :func:`linformer_attention` (Linformer {cite}`wang2020linformer`): keys and values are
  projected along the *sequence* axis to ``k`` rows, so the scores are ``(i, k)``.

Both are approximations; the tests check that each reduces to full attention in its
limit (one bucket and one chunk; ``k = n`` with identity projections). Both take the
package's attention contract ``(query, key, value, *, attn_mask=None, is_causal=False,
scale=None, enable_gqa=False, ...)`` and refuse what they cannot do (LSH: an
``attn_mask``, and a key other than the query; Linformer: any mask or ``is_causal``).
``lsh_buckets`` and ``linformer_projection`` are importable from
``attention.efficient.approximate``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import (
    broadcast_shapes,
    check_bool,
    check_dtype,
    check_generator,
    check_int,
    check_same_device,
    check_size,
    check_tensor,
    validate_attention,
)
from .._core import attention_scores, default_scale, matmul_skipping
from ..foundations.scaled_dot_product import scaled_dot_product_attention

# The facade re-exports the library names (the first 2); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "lsh_attention",
    "linformer_attention",
    "linformer_projection",
    "lsh_buckets",
]


def _check_num_buckets(num_buckets) -> int:
    num_buckets = check_size("num_buckets", num_buckets)
    if num_buckets != 1 and num_buckets % 2:
        raise ValueError(
            "num_buckets must be 1 or even (the hash is argmax over [xR, -xR]), "
            f"got {num_buckets}"
        )
    return num_buckets


def lsh_buckets(
    x: Tensor,
    num_buckets: int,
    num_hashes: int = 1,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Angular LSH bucket of every vector: :math:`h(x) = \arg\max([xR, -xR])`.

    ``R`` is a random ``(d, num_buckets / 2)`` Gaussian matrix (one per hash round),
    i.e. a random rotation followed by a projection. Vectors at a small angle land in
    the same bucket with high probability; the bucket does not depend on the vector's
    length.

    Args:
        x: ``(..., n, d)``.
        num_buckets: 1 (everything in bucket 0) or an even number.
        num_hashes: independent hash rounds ``r >= 1``.
        generator: a CPU ``torch.Generator``, source of the rotations (drawn on the CPU,
            so a seeded generator gives the same buckets on every device). The same seed
            gives the same buckets as :func:`lsh_attention`.

    Returns:
        ``(..., r, n)`` integer buckets in ``[0, num_buckets)``.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [2.0, 0.1], [-1.0, 0.0]])
        >>> b = lsh_buckets(x, 4, generator=torch.Generator().manual_seed(0))[0]
        >>> bool(b[0] == b[1]), bool(b[0] != b[2])  # same direction, opposite direction
        (True, True)
    """
    check_tensor("x", x, floating=True, min_dim=2)
    num_buckets = _check_num_buckets(num_buckets)
    num_hashes = check_size("num_hashes", num_hashes)
    check_generator(generator, torch.device("cpu"))
    if x.device.type != "meta" and bool(x.isnan().any()):
        raise ValueError("x holds NaN: a NaN vector has no direction, hence no bucket")
    return _buckets(x, num_buckets, num_hashes, generator)


def _buckets(x: Tensor, num_buckets: int, num_hashes: int, generator) -> Tensor:
    """Unchecked core of :func:`lsh_buckets`."""
    *batch, n, d = x.shape
    if num_buckets == 1:
        return torch.zeros(*batch, num_hashes, n, dtype=torch.long, device=x.device)
    rotations = torch.randn(d, num_hashes, num_buckets // 2, generator=generator)
    rotations = rotations.to(device=x.device, dtype=x.dtype)
    rotated = torch.einsum(
        "...nd,drk->...rnk", x, rotations
    )  # (..., r, n, num_buckets/2)
    return torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)  # (..., r, n)


def _chunks_with_look_back(x: Tensor, fill: float | int | bool) -> Tensor:
    """``(..., c, C, f)`` -> ``(..., c, 2C, f)``: chunk ``c - 1`` (``fill`` before the
    first) then ``c``."""
    before = torch.full_like(x[..., :1, :, :], fill)
    previous = torch.cat([before, x[..., :-1, :, :]], dim=-3)  # (..., c, C, f)
    return torch.cat([previous, x], dim=-2)  # (..., c, 2C, f)


def lsh_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    num_buckets: int,
    num_hashes: int = 1,
    chunk_size: int,
    generator: torch.Generator | None = None,
    normalize_keys: bool = False,
    deduplicate: bool = True,
) -> Tensor:
    r"""Reformer's LSH attention with shared queries and keys
    {cite}`kitaev2020reformer`.

    Pass the same tensor as ``query`` and ``key`` (``lsh_attention(x, x, v, ...)``): the
    method needs queries and keys to land in the same buckets, so it shares them.
    Exactly what is computed, for each hash round :math:`r`:

    1. Queries and keys are both ``x = query``; with ``normalize_keys`` the keys are
       normalised to unit length, :math:`k_j = x_j / \lVert x_j \rVert`, as in the
       Reformer paper. Scores are :math:`q_i \cdot k_j \cdot s`, ``s = scale`` (default
       :math:`1/\sqrt{d}`).
    2. Bucket every position with :func:`lsh_buckets` (argmax over ``[xR, -xR]``).
    3. Sort the positions by bucket, ties by position (so the sort is stable and the
       order inside a bucket is the sequence order).
    4. Cut the sorted sequence into chunks of ``chunk_size`` (the last one padded). A
       query attends to the keys of its own chunk and of the chunk before it (the first
       chunk has no look-back; no wrap-around), restricted to keys **in its own bucket**
       and, with ``is_causal``, to key positions :math:`\le` its own.
    5. A query never attends to its own position, **unless no other key is left** after
       step 4; then it attends to itself alone (weight 1). (Shared QK makes
       :math:`q_i \cdot k_i` the largest score, which would otherwise dominate.)
    6. Softmax over the remaining keys; unsort the outputs back to sequence order. A key
       left out by steps 4-5 never affects the query, whatever its value.

    With several rounds the outputs are combined by the share of the softmax mass each
    round found, :math:`o_i = \sum_r \frac{e^{L_{ri}}}{\sum_{r'} e^{L_{r'i}}} o_{ri}`
    with :math:`L_{ri}` the log-sum-exp of query ``i``'s scores in round ``r``. A key
    found in :math:`N_{ij}` rounds would then count :math:`N_{ij}` times. With
    ``deduplicate`` (the default) each round's score of such a key is lowered by
    :math:`\log N_{ij}`, as in the Reformer paper, so that every key counts once and the
    result is exactly attention over the **union** of the rounds' key sets
    :math:`P_i = \bigcup_r P_i^{(r)}` (steps 4-5 in each round). :math:`N_{ij}` is found
    by looking each key of a query's chunks up in every round: :math:`O(n C r^2)` extra
    work.

    With ``num_buckets=1`` and ``chunk_size >= n`` every query sees every key, so the
    result is full shared-QK attention with the self position masked (step 5):
    ``scaled_dot_product_attention(x, keys, value, attn_mask=~eye)`` with ``keys = x``
    (or ``x`` normalised).

    Args:
        query: ``(..., h, n, d)`` shared queries/keys.
        key: the same tensor as ``query``.
        value: ``(..., h, n, e)``. Leading dims broadcast.
        attn_mask: must be None (the buckets, not a mask, decide what a query sees).
        is_causal: only keys at positions ``<= i``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: accepted for the contract; shared queries and keys have the same
            heads, so value must have them too.
        num_buckets: 1 or an even number.
        num_hashes: hash rounds ``r >= 1``.
        chunk_size: ``C >= 1`` (a chunk longer than the sequence is cut to it).
        generator: a CPU generator, source of the random rotations (see
            :func:`lsh_buckets`).
        normalize_keys: use unit-length keys (Reformer); default False, plain shared QK.
        deduplicate: count a key found in several rounds once (subtract the log of its
            count from its score); False counts it once per round.

    Returns:
        ``(..., h, n, e)``.

    Example:
        >>> x, v = torch.randn(6, 4), torch.arange(6.0)[:, None]
        >>> out = lsh_attention(x, x, v, num_buckets=2, chunk_size=3,
        ...                     generator=torch.Generator().manual_seed(0))
        >>> out.shape
        torch.Size([6, 1])
    """
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    if key is not query:
        raise ValueError(
            "lsh_attention shares queries and keys (Reformer): pass the same "
            "tensor as query and key, e.g. lsh_attention(x, x, value, ...)"
        )
    if attn_mask is not None:
        raise ValueError(
            "lsh_attention cannot apply an attn_mask: the hash buckets decide "
            "which keys a query sees (use is_causal for the causal pattern)"
        )
    num_buckets = _check_num_buckets(num_buckets)
    num_hashes = check_size("num_hashes", num_hashes)
    C = check_size("chunk_size", chunk_size)
    check_bool("normalize_keys", normalize_keys)
    check_bool("deduplicate", deduplicate)
    check_generator(generator, torch.device("cpu"))
    if query.shape[-2] != value.shape[-2]:
        raise ValueError(
            "query and value must have the same number of positions n, "
            f"got {query.shape[-2]} and {value.shape[-2]}"
        )
    batch = broadcast_shapes(
        "the batch dims of query and value",
        tuple(query.shape[:-2]),
        tuple(value.shape[:-2]),
    )
    x = query.expand(*batch, *query.shape[-2:])
    value = value.expand(*batch, *value.shape[-2:])
    n, d, e = x.shape[-2], x.shape[-1], value.shape[-1]
    scale = default_scale(scale, d)
    if n == 0:
        return x.new_zeros(*batch, 0, e)
    C = min(C, n)  # a longer chunk holds only padding

    buckets = _buckets(x, num_buckets, num_hashes, generator)  # (..., r, n)
    positions = torch.arange(n, device=x.device)
    order = (buckets * n + positions).argsort(
        dim=-1
    )  # (..., r, n): by bucket, then position

    def sort(
        t: Tensor,
    ) -> Tensor:  # (..., n, f) -> (..., r, n, f) in each round's order
        t = t.unsqueeze(-3).expand(*batch, num_hashes, n, t.shape[-1])
        return t.gather(-2, order.unsqueeze(-1).expand(*order.shape, t.shape[-1]))

    keys = (
        torch.nn.functional.normalize(x, dim=-1) if normalize_keys else x
    )  # (..., n, d)
    q, k, v = sort(x), sort(keys), sort(value)  # (..., r, n, *)
    pos = positions.expand_as(order).gather(-1, order)  # (..., r, n)
    bkt = buckets.gather(-1, order)  # (..., r, n)

    nc = -(-n // C)
    pad = nc * C

    def chunk(t: Tensor, fill) -> Tensor:  # (..., r, n, f) -> (..., r, c, C, f)
        t = torch.cat(
            [t, t.new_full((*t.shape[:-2], pad - n, t.shape[-1]), fill)], dim=-2
        )
        return t.unflatten(-2, (nc, C))

    q_c = chunk(q, 0.0)  # (..., r, c, C, d)
    k_c = _chunks_with_look_back(chunk(k, 0.0), 0.0)  # (..., r, c, 2C, d)
    v_c = _chunks_with_look_back(chunk(v, 0.0), 0.0)  # (..., r, c, 2C, e)
    pos_q = chunk(pos.unsqueeze(-1), -1)  # (..., r, c, C, 1)
    bkt_q = chunk(bkt.unsqueeze(-1), -1)  # (..., r, c, C, 1)
    pos_k = _chunks_with_look_back(chunk(pos.unsqueeze(-1), -1), -1).transpose(
        -1, -2
    )  # (..., r, c, 1, 2C)
    bkt_k = _chunks_with_look_back(chunk(bkt.unsqueeze(-1), -1), -1).transpose(
        -1, -2
    )  # (..., r, c, 1, 2C)

    allowed = (pos_k >= 0) & (
        bkt_k == bkt_q
    )  # (..., r, c, C, 2C): real key, same bucket
    if is_causal:
        allowed = allowed & (pos_k <= pos_q)
    others = allowed & (pos_k != pos_q)
    mask = torch.where(others.any(dim=-1, keepdim=True), others, allowed)  # step 5
    mask = mask | ~mask.any(
        dim=-1, keepdim=True
    )  # padding queries: anything finite, dropped below

    scores, _ = attention_scores(q_c, k_c, scale=scale)  # (..., r, c, C, 2C)
    if deduplicate and num_hashes > 1:
        undo = order.argsort(dim=-1)  # (..., r, n): sorted slot of each position
        alone = ~others.any(dim=-1).flatten(-2, -1)[..., :n].gather(
            -1, undo
        )  # (..., r, n)
        count = _rounds_containing(
            buckets, undo // C, alone, pos_q, pos_k, is_causal, batch
        )
        scores = scores - torch.log(count.clamp(min=1).to(scores.dtype))
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (..., r, c, C)
    out = matmul_skipping(
        torch.exp(scores - lse.unsqueeze(-1)), v_c, ~mask
    )  # (..., r, c, C, e)

    out = out.flatten(-3, -2)[..., :n, :]  # (..., r, n, e) in sorted order
    lse = lse.flatten(-2, -1)[..., :n]  # (..., r, n)
    undo = order.argsort(dim=-1)  # (..., r, n): sorted slot of each position
    out = out.gather(-2, undo.unsqueeze(-1).expand(*undo.shape, e))  # (..., r, n, e)
    lse = lse.gather(-1, undo)  # (..., r, n)
    share = torch.softmax(lse, dim=-2)  # (..., r, n): each round's share of the mass
    return (share.unsqueeze(-1) * out).sum(dim=-3)  # (..., n, e)


def _rounds_containing(
    buckets: Tensor,
    chunk: Tensor,
    alone: Tensor,
    pos_q: Tensor,
    pos_k: Tensor,
    is_causal: bool,
    batch,
) -> Tensor:
    """:math:`N_{ij}`: in how many rounds key ``j`` is in query ``i``'s set (steps 4-5).

    ``buckets``, ``chunk`` (sorted slot // C) and ``alone`` (no key but itself) are
    ``(..., r, n)`` per position; ``pos_q`` ``(..., r, c, C, 1)`` and ``pos_k``
    ``(..., r, c, 1, 2C)`` the positions of each round's query/key slots (-1 = padding).
    Returns ``(..., r, c, C, 2C)``; meaningless at padding, which the caller masks.
    """

    def at(
        t: Tensor, idx: Tensor
    ) -> Tensor:  # per-position (..., r', n) at idx -> idx.shape + (r',)
        per_pos = t.transpose(-1, -2)  # (..., n, r')
        flat = idx.clamp(min=0).reshape(*batch, -1)  # (..., M)
        got = per_pos.gather(
            -2, flat.unsqueeze(-1).expand(*flat.shape, per_pos.shape[-1])
        )
        return got.reshape(*idx.shape, per_pos.shape[-1])

    same_bucket = at(buckets, pos_q) == at(buckets, pos_k)  # (..., r, c, C, 2C, r')
    back = at(chunk, pos_q) - at(
        chunk, pos_k
    )  # the key's chunk: own (0) or previous (1)
    member = same_bucket & ((back == 0) | (back == 1))
    if is_causal:
        member = member & (pos_k <= pos_q).unsqueeze(-1)
    is_self = (pos_k == pos_q).unsqueeze(
        -1
    )  # the query's own position: only when alone
    member = torch.where(is_self, at(alone, pos_q), member)
    return member.sum(dim=-1)  # (..., r, c, C, 2C)


def linformer_projection(
    n: int, k: int, *, generator: torch.Generator | None = None, dtype=torch.float32
) -> Tensor:
    r"""A random ``(k, n)`` sequence projection with entries :math:`\mathcal N(0, 1/k)`.

    Johnson-Lindenstrauss style: :math:`E^\top E \approx I` on average, so
    :math:`(E K)^\top (E V) \approx K^\top V`. Linformer learns ``E`` and ``F``; a
    random draw is the untrained starting point {cite}`wang2020linformer`.

    Args:
        n: sequence length ``>= 0``.
        k: projected length ``>= 1``.
        generator: a CPU ``torch.Generator``, the random source.
        dtype: a floating dtype.

    Returns:
        ``(k, n)`` tensor.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> linformer_projection(10, 3, generator=g).shape
        torch.Size([3, 10])
    """
    n = check_int("n", n, minimum=0)
    k = check_size("k", k)
    check_generator(generator, torch.device("cpu"))
    check_dtype("dtype", dtype, floating=True)
    return torch.randn(k, n, generator=generator, dtype=dtype) / math.sqrt(k)


def linformer_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    key_projection: Tensor,
    value_projection: Tensor,
) -> Tensor:
    r"""Linformer attention :math:`\operatorname{softmax}(Q (E K)^\top s)\,(F V)`
    {cite}`wang2020linformer`.

    ``E = key_projection`` and ``F = value_projection`` project the ``n`` key/value
    *positions* down to ``k`` rows, so the scores are ``(i, k)``: time and memory
    :math:`O(n k)` instead of :math:`O(n^2)`. The approximation rests on the attention
    matrix being close to low rank. With ``k = n`` and ``E = F`` the identity or a
    permutation (which reorders keys and values together without mixing them) it is
    exactly full attention; any other projection mixes keys inside the softmax and is an
    approximation. No mask and no causal pattern: each projected row mixes all ``n``
    positions, future ones included, so a causal or padding mask cannot be applied after
    it, and the ``(k, n)`` projection fixes the length ``n``, so it cannot grow token by
    token either; both are refused.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, n, d)``.
        value: ``(..., h_kv, n, e)``.
        attn_mask: must be None.
        is_causal: must be False.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        key_projection: ``E``, ``(..., k, n)`` (leading dims broadcast with the key's,
            e.g. one per head).
        value_projection: ``F``, ``(..., k, n)``.

    Returns:
        ``(..., h, i, e)``.

    Example:
        >>> q, k, v = torch.randn(3, 2), torch.randn(4, 2), torch.randn(4, 1)
        >>> I = torch.eye(4)
        >>> out = linformer_attention(q, k, v, key_projection=I, value_projection=I)
        >>> torch.allclose(out, torch.softmax(q @ k.T / 2 ** 0.5, -1) @ v)
        True
    """
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    if attn_mask is not None or is_causal:
        raise ValueError(
            "linformer_attention cannot apply attn_mask or is_causal: its projections "
            "mix all key positions, so no mask over positions survives them"
        )
    E, F = key_projection, value_projection
    for name, t in (("key_projection", E), ("value_projection", F)):
        check_tensor(name, t, floating=True, min_dim=2, dtype=query.dtype)
        if t.shape[-1] != key.shape[-2]:
            raise ValueError(
                f"{name} must have shape (..., k, n) with n = {key.shape[-2]} key "
                f"positions, got {tuple(t.shape)}"
            )
    if E.shape[-2] != F.shape[-2]:
        raise ValueError(
            "key_projection and value_projection must project to the same k, "
            f"got {E.shape[-2]} and {F.shape[-2]}"
        )
    check_same_device(query=query, key_projection=E, value_projection=F)
    broadcast_shapes(
        "the batch dims of key and key_projection", key.shape[:-2], E.shape[:-2]
    )
    broadcast_shapes(
        "the batch dims of value and value_projection", value.shape[:-2], F.shape[:-2]
    )
    key_k = E @ key  # (..., k, d)
    value_k = F @ value  # (..., k, e)
    # The projections' batch dims may add heads: the reference checks the projected
    # shapes once more.
    return scaled_dot_product_attention(
        query, key_k, value_k, scale=scale, enable_gqa=enable_gqa
    )  # (..., i, e)
