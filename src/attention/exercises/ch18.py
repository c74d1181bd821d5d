"""Checkers for chapter 18's exercises: the KV cache's bytes per token, a gather through
a paged cache's block table, soft-capped attention and the softmax of a learned sink.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch18
    ch18.check_cache_bytes_per_token(my_cache_bytes_per_token)

Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``. Shape legend: ``h`` heads, ``i``
queries, ``j`` keys, ``d`` query/key size, ``e`` value size, ``s`` block size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..foundations.masks import causal_mask
from ..layers.kv_cache import kv_cache_bytes_per_token
from ..practice.latent import LatentKVCache
from ..practice.logits import softcap_attention
from ._checker import Case, Mistake, Property, check, generator, randn, random_mask

__all__ = [
    "check_cache_bytes_per_token",
    "check_paged_gather",
    "check_softcap_attention",
    "check_sink_weights",
]

_DTYPES = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}

# --------------------------------------------------------------------------- cache byte


def _cache_bytes(config: dict, bytes_per_number: int = 2) -> int:
    """The reference, from the package's own cache classes."""
    dtype = _DTYPES[bytes_per_number]
    if "kv_lora_rank" in config:  # MLA: the latent and the shared rotary key
        return LatentKVCache.bytes_per_token(
            config["kv_lora_rank"],
            config["rope_dim"],
            dtype=dtype,
            num_layers=config["layers"],
        )
    return kv_cache_bytes_per_token(
        config["kv_heads"], config["head_dim"], dtype=dtype, num_layers=config["layers"]
    )


def _is_mla(config):
    return "kv_lora_rank" in config


def _no_factor_two(config, bytes_per_number=2):
    if _is_mla(config):
        return _cache_bytes(config, bytes_per_number)
    c = config
    return c["layers"] * c["kv_heads"] * c["head_dim"] * bytes_per_number


def _one_layer(config, bytes_per_number=2):
    return _cache_bytes(config, bytes_per_number) // config["layers"]


def _query_heads(config, bytes_per_number=2):
    if _is_mla(config):
        return _cache_bytes(config, bytes_per_number)
    c = config
    return 2 * c["layers"] * c["heads"] * c["head_dim"] * bytes_per_number


def _mla_doubled(config, bytes_per_number=2):
    return (2 if _is_mla(config) else 1) * _cache_bytes(config, bytes_per_number)


def _mla_without_rope(config, bytes_per_number=2):
    if _is_mla(config):
        return config["layers"] * config["kv_lora_rank"] * bytes_per_number
    return _cache_bytes(config, bytes_per_number)


def _mla_as_heads(config, bytes_per_number=2):
    if _is_mla(config):
        c = config
        per_head = c["nope_dim"] + c["rope_dim"] + c["v_dim"]
        return c["layers"] * c["heads"] * per_head * bytes_per_number
    return _cache_bytes(config, bytes_per_number)


def _bits(config, bytes_per_number=2):
    return 8 * _cache_bytes(config, bytes_per_number)


def check_cache_bytes_per_token(fn) -> None:
    r"""Check ``fn(config, bytes_per_number=2)``: KV-cache bytes per token, all layers.

    ``config`` is a dict shaped like the chapter's model tables. With ``layers``,
    ``heads``, ``kv_heads`` and ``head_dim`` (MHA, GQA, MQA) every layer caches one key
    and one value vector per key/value head:

    .. math:: 2 \cdot L \cdot h_{kv} \cdot d \cdot b \ \text{bytes}.

    With ``kv_lora_rank`` (MLA, the dict also holds ``layers``, ``heads``,
    ``rope_dim``, ``nope_dim`` and ``v_dim``) every layer caches one latent and one
    rotary key shared by all heads: :math:`L (d_c + d_R) b` bytes, no factor 2.

    ``fn`` returns an int. The inputs: Llama-3-8B (GQA), its shape as MHA and as MQA,
    DeepSeek-V3 (MLA), and a small MLA in float32. Known mistakes are named: the
    factor 2 for keys and values forgotten, the layers forgotten, the query heads
    counted, MLA's latent doubled, its rotary key forgotten, MLA counted as full keys
    and values, bits instead of bytes. Answers are exact.

    Example:
        >>> def my_cache_bytes_per_token(config, bytes_per_number=2):
        ...     if "kv_lora_rank" in config:
        ...         numbers = config["kv_lora_rank"] + config["rope_dim"]
        ...     else:
        ...         numbers = 2 * config["kv_heads"] * config["head_dim"]
        ...     return config["layers"] * numbers * bytes_per_number
        >>> check_cache_bytes_per_token(my_cache_bytes_per_token)  # doctest: +ELLIPSIS
        ✓ my_cache_bytes_per_token: KV-cache bytes per token, all layers (6 inputs, ...)
    """
    __tracebackhide__ = True
    llama = dict(layers=32, heads=32, kv_heads=8, head_dim=128)
    deepseek = dict(
        layers=61, heads=128, kv_lora_rank=512, rope_dim=64, nope_dim=128, v_dim=128
    )
    small_mla = dict(
        layers=3, heads=4, kv_lora_rank=16, rope_dim=8, nope_dim=12, v_dim=10
    )
    check(
        fn,
        _cache_bytes,
        [
            Case("Llama-3-8B (GQA, 8 key/value heads), bf16", (llama,)),
            Case(
                "the same shape as MHA (32 key/value heads)",
                ({**llama, "kv_heads": 32},),
            ),
            Case(
                "the same shape as MQA (1 key/value head)", ({**llama, "kv_heads": 1},)
            ),
            Case("DeepSeek-V3 (MLA), bf16", (deepseek,)),
            Case("a small MLA, float32", (small_mla,), {"bytes_per_number": 4}),
            Case("Llama-3-8B in float32", (llama,), {"bytes_per_number": 4}),
        ],
        what="KV-cache bytes per token, all layers",
        atol=0.0,
        mistakes=[
            Mistake(
                "the factor 2 is missing: each key/value head caches a key AND a value",
                _no_factor_two,
            ),
            Mistake(
                "this is one layer's cache: every layer keeps its own, multiply by "
                "config['layers']",
                _one_layer,
            ),
            Mistake(
                "the query heads are counted: only the key/value heads (kv_heads) "
                "are cached",
                _query_heads,
            ),
            Mistake(
                "MLA's latent is counted twice: keys and values both come from one "
                "latent, so no factor 2",
                _mla_doubled,
            ),
            Mistake(
                "MLA's rotary key is missing: each layer caches kv_lora_rank + "
                "rope_dim numbers",
                _mla_without_rope,
            ),
            Mistake(
                "MLA is counted as full keys and values per head: its cache holds "
                "only the latent and the shared rotary key",
                _mla_as_heads,
            ),
            Mistake("this counts bits: a number takes bytes_per_number bytes", _bits),
        ],
    )


# --------------------------------------------------------------------------- paged gath


def _gather(pool: Tensor, block_table: list[int], length: int) -> Tensor:
    """The reference: position p lives in pool[block_table[p // s], p % s]."""
    s = pool.shape[1]
    p = torch.arange(length)
    blocks = torch.tensor(block_table, dtype=torch.long)[p // s]
    return pool[blocks, p % s]  # (length, ...)


def _table_ignored(pool, block_table, length):
    p = torch.arange(length)
    s = pool.shape[1]
    return pool[p // s, p % s]


def _untrimmed(pool, block_table, length):
    return pool[torch.tensor(block_table, dtype=torch.long)].flatten(0, 1)


def _table_sorted(pool, block_table, length):
    return _gather(pool, sorted(block_table), length)


def _slot_by_block(pool, block_table, length):
    s = pool.shape[1]
    p = torch.arange(length)
    blocks = torch.tensor(block_table, dtype=torch.long)[p // s]
    return pool.flatten(0, 1)[blocks + p % s]


def _paged_case(name: str, blocks: int, s: int, table, length: int, *rest, seed: int):
    pool = randn(blocks, s, *rest, seed=seed)
    return Case(name, (pool, list(table), length))


def check_paged_gather(fn) -> None:
    r"""Check ``fn(pool, block_table, length)``: a sequence read through its table.

    ``pool`` is ``(num_blocks, s, ...)``: physical block ``b`` holds ``s`` consecutive
    positions (and any trailing dims, e.g. ``(h_kv, d)``), the layout of vLLM and of
    :class:`attention.PagedKVCache`. ``block_table`` is a list of physical block ids:
    logical block ``n`` of the sequence lives in ``pool[block_table[n]]``. So position
    ``p`` is ``pool[block_table[p // s], p % s]``.

    ``fn`` returns ``(length, ...)``: the sequence's ``length`` positions in order, what
    a contiguous cache would hold. The inputs: a table in scrambled order with a partly
    filled last block; a length that fills its blocks; one position; keys with heads.
    Known mistakes are named: the table ignored, the last block not trimmed to
    ``length``, the table's order lost, a flat slot without the factor ``s``. Exact.

    Example:
        >>> def my_paged_gather(pool, block_table, length):
        ...     s = pool.shape[1]
        ...     p = torch.arange(length)
        ...     return pool[torch.tensor(block_table)[p // s], p % s]
        >>> check_paged_gather(my_paged_gather)  # doctest: +ELLIPSIS
        ✓ my_paged_gather: positions read through the block table (4 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _gather,
        [
            _paged_case(
                "10 positions in blocks of 4, table [3, 0, 5]",
                6,
                4,
                [3, 0, 5],
                10,
                3,
                seed=0,
            ),
            _paged_case(
                "8 positions filling blocks [2, 4] of 4", 6, 4, [2, 4], 8, 3, seed=1
            ),
            _paged_case("1 position in block [5] of 4", 6, 4, [5], 1, 3, seed=2),
            _paged_case(
                "7 positions of 2 heads of 3, blocks of 2, table [6, 1, 7, 0]",
                8,
                2,
                [6, 1, 7, 0],
                7,
                2,
                3,
                seed=3,
            ),
        ],
        what="positions read through the block table",
        atol=0.0,
        mistakes=[
            Mistake(
                "the block table is ignored: logical block p // s lives in physical "
                "block block_table[p // s]",
                _table_ignored,
            ),
            Mistake(
                "the last block is only partly filled: keep the first `length` "
                "positions",
                _untrimmed,
            ),
            Mistake(
                "the table's order is lost: logical block n is block_table[n], "
                "whatever the physical ids",
                _table_sorted,
            ),
            Mistake(
                "in the flattened pool, block b starts at slot b * s: the slot is "
                "block_table[p // s] * s + p % s",
                _slot_by_block,
            ),
        ],
    )


# --------------------------------------------------------------------------- soft-cappi


def _softcap(q, k, v, cap, mask=None):
    """The reference: the package's soft-capped attention (cap before the mask)."""
    return softcap_attention(q, k, v, attn_mask=mask, cap=cap)


def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def _masked(scores, mask):
    return scores if mask is None else scores.masked_fill(~mask, -math.inf)


def _cap_after_mask(q, k, v, cap, mask=None):
    s = cap * torch.tanh(_masked(_scores(q, k), mask) / cap)
    return torch.softmax(s, -1) @ v


def _cap_after_softmax(q, k, v, cap, mask=None):
    w = torch.softmax(_masked(_scores(q, k), mask), -1)
    return (cap * torch.tanh(w / cap)) @ v


def _no_cap(q, k, v, cap, mask=None):
    return torch.softmax(_masked(_scores(q, k), mask), -1) @ v


def _tanh_only(q, k, v, cap, mask=None):
    s = torch.tanh(_scores(q, k) / cap)
    return torch.softmax(_masked(s, mask), -1) @ v


def _cap_unscaled(q, k, v, cap, mask=None):
    s = q @ k.transpose(-2, -1)
    return torch.softmax(_masked(cap * torch.tanh(s / cap), mask), -1) @ v


def _cap_before_scale(q, k, v, cap, mask=None):
    s = cap * torch.tanh(q @ k.transpose(-2, -1) / cap) / math.sqrt(q.shape[-1])
    return torch.softmax(_masked(s, mask), -1) @ v


def check_softcap_attention(fn) -> None:
    r"""Check ``fn(q, k, v, cap, mask=None)``: attention with soft-capped scores.

    .. math:: o = \operatorname{softmax}\big(c \tanh(s / c) + M\big)\, V, \qquad
        s = \frac{Q K^\top}{\sqrt d}

    The cap acts on the scaled scores, **before** the mask: a masked score stays
    ``-inf`` (a capped ``-inf`` would be ``-c``, a visible key).

    Args of ``fn``:
        q: ``(..., i, d)``; k: ``(..., j, d)``; v: ``(..., j, e)``.
        cap: ``c > 0``.
        mask: None or bool ``(i, j)``, **True = may attend** (no row is all False).

    ``fn`` returns ``(..., i, e)``. The inputs have scores of up to about 30, so the cap
    matters: small ones, large ones, a mask, batch dims, a cap so large it changes
    nothing. Known mistakes are named: the cap after the mask, the cap after the
    softmax, no cap, ``tanh(s / c)`` without the factor ``c``, the cap on unscaled
    scores, the scale after the cap. Tolerance: 1e-10.

    Example:
        >>> def my_softcap_attention(q, k, v, cap, mask=None):
        ...     s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ...     s = cap * torch.tanh(s / cap)
        ...     if mask is not None:
        ...         s = s.masked_fill(~mask, float("-inf"))
        ...     return torch.softmax(s, dim=-1) @ v
        >>> check_softcap_attention(my_softcap_attention)  # doctest: +ELLIPSIS
        ✓ my_softcap_attention: softmax(c tanh(s / c), masked) @ v (5 inputs, ...)
    """
    __tracebackhide__ = True

    def qkv(i, j, d, e, batch=(), seed=0, scale=1.0):
        g = generator(seed)
        q = scale * torch.randn(*batch, i, d, generator=g, dtype=torch.float64)
        k = scale * torch.randn(*batch, j, d, generator=g, dtype=torch.float64)
        return q, k, torch.randn(*batch, j, e, generator=g, dtype=torch.float64)

    check(
        fn,
        _softcap,
        [
            Case(
                "3 queries, 5 keys, scores up to ~5, cap 2",
                (*qkv(3, 5, 4, 2, seed=0), 2.0),
            ),
            Case(
                "large scores (up to ~30), cap 5",
                (*qkv(4, 6, 4, 3, seed=1, scale=3.0), 5.0),
            ),
            Case(
                "a mask (True = may attend), cap 5",
                (*qkv(4, 6, 4, 3, seed=2, scale=3.0), 5.0),
                {"mask": random_mask(4, 6, seed=3)},
            ),
            Case(
                "a causal mask with batch dims (2, 3), cap 3",
                (*qkv(5, 5, 8, 2, batch=(2, 3), seed=4, scale=2.0), 3.0),
                {"mask": causal_mask(5)},
            ),
            Case("a cap of 1e6 (no effect)", (*qkv(3, 4, 4, 2, seed=5), 1e6)),
        ],
        what="softmax(c tanh(s / c), masked) @ v",
        mistakes=[
            Mistake(
                "the cap comes after the mask: c tanh(-inf / c) = -c, so masked keys "
                "get weight; cap first, then mask",
                _cap_after_mask,
            ),
            Mistake(
                "the cap is applied after the softmax: it acts on the scores, before "
                "the softmax",
                _cap_after_softmax,
            ),
            Mistake("the scores are not capped: replace s by c * tanh(s / c)", _no_cap),
            Mistake(
                "the factor c is missing: the capped score is c * tanh(s / c)",
                _tanh_only,
            ),
            Mistake(
                "the cap acts on unscaled scores: divide q @ k^T by sqrt(d) first",
                _cap_unscaled,
            ),
            Mistake(
                "the scale comes after the cap: cap the scaled score s = q.k / sqrt(d)",
                _cap_before_scale,
            ),
        ],
    )


# -------------------------------------------------------------------------------- sinks


def _sink_weights(scores: Tensor, sinks: Tensor) -> Tensor:
    """The reference: the sink logit joins every row's softmax, then its column goes."""
    h, i, _ = scores.shape[-3:]
    column = sinks[:, None, None].expand(*scores.shape[:-1], 1)  # (..., h, i, 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def _plain_softmax(scores, sinks):
    return torch.softmax(scores, dim=-1)


def _sink_column_kept(scores, sinks):
    column = sinks[:, None, None].expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)


def _sink_per_row(scores, sinks):
    # sinks[:, None] is (h, 1): broadcast to (..., h, i, 1) it lines up with the queries
    column = torch.broadcast_to(sinks[:, None], (*scores.shape[:-1], 1))
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def _sink_of_zero(scores, sinks):
    column = torch.zeros_like(scores[..., :1])
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def check_sink_weights(fn) -> None:
    r"""Check ``fn(scores, sinks)``: weights with a learned sink per head (gpt-oss).

    .. math:: a_{ij} = \frac{e^{s_{ij}}}{e^{\sigma_h} + \sum_{j'} e^{s_{ij'}}}

    The head's sink logit :math:`\sigma_h` joins each row's softmax as one more
    column, and that column is then dropped: a row sums to less than 1, the rest is
    the weight parked on the sink.

    Args of ``fn``:
        scores: ``(..., h, i, j)`` the scores of ``h`` heads (any leading dims).
        sinks: ``(h,)`` one logit per head.

    ``fn`` returns ``(..., h, i, j)``. The inputs: a few heads; scores near 1000
    (without a shift that includes the sink, ``exp`` overflows); sinks of ``-inf``
    (plain softmax); a batch dim; more heads than queries. Known mistakes are named:
    the sink ignored (or added to every score, which is the same), its column kept,
    the sinks broadcast over the queries instead of the heads, a sink of ``e^0 = 1``
    for every head. Tolerance: 1e-10.

    Example:
        >>> def my_sink_weights(scores, sinks):
        ...     column = sinks[:, None, None].expand(*scores.shape[:-1], 1)
        ...     both = torch.cat([scores, column], dim=-1)
        ...     return torch.softmax(both, dim=-1)[..., :-1]
        >>> check_sink_weights(my_sink_weights)  # doctest: +ELLIPSIS
        ✓ my_sink_weights: softmax with a sink logit per head (5 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    overflow = "exp overflows near 1000: shift by the row's maximum, the sink included"
    big = randn(2, 3, 4, seed=13) + 1000.0
    check(
        fn,
        _sink_weights,
        [
            Case(
                "3 heads, 3 queries, 4 keys",
                (
                    randn(3, 3, 4, seed=10),
                    torch.tensor([-1.0, 2.0, 0.5], dtype=torch.float64),
                ),
            ),
            Case(
                "3 heads, 2 queries, 5 keys",
                (
                    randn(3, 2, 5, seed=11),
                    torch.tensor([0.5, -2.0, 1.5], dtype=torch.float64),
                ),
            ),
            Case(
                "scores near 1000, sinks near 1000",
                (big, torch.tensor([1000.5, 999.0], dtype=torch.float64)),
                hint=overflow,
            ),
            Case(
                "sinks of -inf (no sink: plain softmax)",
                (
                    randn(2, 3, 3, seed=12),
                    torch.full((2,), -math.inf, dtype=torch.float64),
                ),
            ),
            Case(
                "a batch dim: (2, 3 heads, 4, 4)",
                (
                    randn(2, 3, 4, 4, seed=14),
                    torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64),
                ),
            ),
        ],
        what="softmax with a sink logit per head",
        properties=[
            Property(
                "a row's weights are >= 0 and sum to at most 1 (the sink has the rest)",
                lambda out, *_: (out >= 0).all(-1) & (out.sum(-1) <= 1 + 1e-9),
            )
        ],
        mistakes=[
            Mistake(
                "the sink is ignored (adding it to every score changes nothing "
                "either): its e^sigma joins each row's denominator",
                _plain_softmax,
            ),
            Mistake(
                "the sink's column is kept: drop it after the softmax ([..., :-1])",
                _sink_column_kept,
            ),
            Mistake(
                "the sinks are broadcast over the queries: there is one per head, "
                "sinks[:, None, None]",
                _sink_per_row,
            ),
            Mistake(
                "the denominator adds 1 for every head: it adds e^sigma_h, the "
                "head's own sink",
                _sink_of_zero,
            ),
        ],
    )
