"""Diagrams of the In-practice part (chapters 17-18): a pretrained layer, the caches.

Each function returns a matplotlib Figure drawn with :mod:`._draw`; a chapter shows it
in a cell tagged ``diagram`` and ``remove-input``. Every shape and number a diagram
prints is computed by the package: the shapes of one BERT layer by running
``split_heads``, ``attention_weights`` and ``merge_heads`` on tensors of the model's
size, the bytes per token by ``kv_cache_bytes_per_token`` and
``LatentKVCache.bytes_per_token``, the block tables and slots by a
:class:`~attention.PagedKVCache`. Each such text carries a ``gid`` naming what it shows
(``shape:A``, ``bytes:MLA``, ``table:A[1]`` ...) for the tests.

Shape legend: ``n`` tokens, ``d_model`` hidden size, ``h`` heads, ``d`` head size,
``h_kv`` key/value heads, ``d_c`` MLA's latent size, ``d_R`` its rotary key size, ``s``
positions per block.
"""

from __future__ import annotations

import torch

from ...foundations.scaled_dot_product import (
    attention_weights,
    scaled_dot_product_attention,
)
from ...layers.kv_cache import kv_cache_bytes_per_token
from ...layers.multihead import merge_heads, split_heads
from ...practice.latent import LatentKVCache
from ...practice.paged import PagedKVCache
from . import _draw as draw

__all__ = ["attention_layer_maps", "cache_per_token", "paged_block_table"]


def _shape(size) -> str:
    return "(" + ", ".join(str(int(n)) for n in size) + ")"


# --------------------------------------------------------------------------- chapter 17


def layer_shapes(n: int = 15, d_model: int = 384, num_heads: int = 12) -> dict:
    """The shapes drawn by :func:`attention_layer_maps`, computed by the package.

    Runs one BERT-style attention layer's steps on zero tensors of the model's size
    (``split_heads``, ``attention_weights``, ``scaled_dot_product_attention``,
    ``merge_heads``) and returns ``{name: torch.Size}`` for ``X``, ``Q`` (the
    projection), ``Q_h`` (its heads), ``A`` (the weights ``output_attentions`` returns
    for the layer), ``O_h`` (each head's weighted sum) and ``O`` (the heads merged).
    """
    x = torch.zeros(1, n, d_model)  # (1, n, d_model)
    q = torch.zeros(1, n, d_model)  # x W_Q^T + b_Q has the input's shape
    q_h = split_heads(q, num_heads)  # (1, h, n, d)
    a = attention_weights(q_h, q_h)  # (1, h, n, n)
    o_h = scaled_dot_product_attention(q_h, q_h, q_h)  # (1, h, n, d)
    o = merge_heads(o_h)  # (1, n, d_model)
    return {
        "X": x.shape[1:],
        "Q": q.shape[1:],
        "Q_h": q_h.shape[1:],
        "A": a.shape[1:],
        "O_h": o_h.shape[1:],
        "O": o.shape[1:],
    }


def _stack(ax, xy, rows, cols, *, cell, colour, name=None, depth=3, gap=0.07):
    """``depth`` grids drawn behind each other, offset up and right: a stack of heads.

    The name is written above the rearmost grid. Returns the front grid's Bounds.
    """
    for k in reversed(range(1, depth)):
        draw.matrix(
            ax,
            (xy[0] + k * gap, xy[1] + k * gap),
            rows,
            cols,
            cell=cell,
            colour=colour,
        )
    front = draw.matrix(ax, xy, rows, cols, cell=cell, colour=colour)
    if name is not None:
        shift = (depth - 1) * gap
        draw.label(
            ax,
            (front.centre[0] + shift / 2, front.top + shift + 0.07),
            name,
            va="bottom",
            colour=colour,
            fontweight="bold",
            size=12,
        )
    return front


def attention_layer_maps(n: int = 15, d_model: int = 384, num_heads: int = 12):
    """Where the attention maps of one layer come from, and where they go.

    The top row: the layer's input ``X`` ``(n, d_model)`` is projected to queries, keys
    and values of the same shape, which are cut into ``h`` heads of ``d = d_model / h``
    features. The bottom row, right to left: each head's scores become the map
    ``A_h = softmax(Q_h K_h^T / sqrt(d))`` (what ``output_attentions`` returns), the
    maps weight the values, the heads are merged and the output projection, the
    residual and the LayerNorm give the next layer's input. Shapes are MiniLM's by
    default, computed by :func:`layer_shapes`; each is a text with gid ``shape:<name>``.

    Returns:
        The Figure.
    """
    shapes = layer_shapes(n, d_model, num_heads)
    d = shapes["Q_h"][-1]
    fig, ax = draw.canvas(7.2, 4.5, "One attention layer: where the maps come from")
    top, bottom = 3.05, 1.15
    grey, q_col, w_col = draw.ROLE["input"], draw.ROLE["query"], draw.ROLE["weight"]

    xb = draw.matrix(
        ax, (0.75, top), 6, 4, cell=0.15, name="$X$", colour=grey, name_size=12
    )
    t = draw.label(
        ax,
        (xb.centre[0], xb.bottom - 0.1),
        _shape(shapes["X"]),
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    t.set_gid("shape:X")

    proj = draw.box(ax, (2.15, top), "query, key,\nvalue Linear", size=draw.SMALL)
    draw.arrow(ax, xb.east, proj.west)
    qs = []
    for k, (role, name) in enumerate((("query", "Q"), ("key", "K"), ("value", "V"))):
        qs.append(
            draw.matrix(
                ax,
                (3.35 + 0.5 * k, top),
                6,
                3,
                cell=0.13,
                name=f"${name}$",
                name_size=12,
                colour=draw.ROLE[role],
            )
        )
    draw.arrow(ax, proj.east, qs[0].west)
    t = draw.label(
        ax,
        (qs[1].centre[0], qs[1].bottom - 0.1),
        _shape(shapes["Q"]) + " each",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    t.set_gid("shape:Q")

    hb = _stack(
        ax,
        (5.85, top - 0.05),
        6,
        2,
        cell=0.13,
        colour=q_col,
        name="$Q_h, K_h, V_h$",
    )
    draw.arrow(ax, qs[2].east, hb.west, text=f"{num_heads} heads", size=draw.SMALL)
    t = draw.label(
        ax,
        (hb.centre[0] + 0.07, hb.bottom - 0.1),
        _shape(shapes["Q_h"]) + " each",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    t.set_gid("shape:Q_h")
    draw.label(
        ax,
        (hb.right + 0.25, top + 0.05),
        f"d = {d}\nper head",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )

    ab = _stack(ax, (5.85, bottom), 6, 6, cell=0.11, colour=w_col, name="$A_h$")
    draw.arrow(
        ax,
        (hb.centre[0], hb.bottom - 0.32),
        (ab.centre[0], ab.top + 0.45),
        text=f"softmax$(Q_h K_h^T / \\sqrt{{{d}}})$",
        side="left",
        size=12,
    )
    t = draw.label(
        ax,
        (ab.centre[0] + 0.07, ab.bottom - 0.1),
        _shape(shapes["A"]),
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    t.set_gid("shape:A")
    draw.label(
        ax,
        (ab.centre[0] + 0.07, ab.bottom - 0.38),
        "output_attentions[layer]:\nthe maps this chapter reads",
        size=draw.SMALL,
        colour=w_col,
        va="top",
    )

    ob = _stack(
        ax,
        (3.9, bottom),
        6,
        2,
        cell=0.13,
        colour=draw.ROLE["value"],
        name="$A_h V_h$",
    )
    draw.arrow(ax, ab.west, ob.east)
    t = draw.label(
        ax,
        (ob.centre[0] + 0.07, ob.bottom - 0.1),
        _shape(shapes["O_h"]),
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    t.set_gid("shape:O_h")

    mb = draw.matrix(ax, (2.45, bottom), 6, 4, cell=0.13, name="merged", colour=grey)
    draw.arrow(ax, ob.west, mb.east, text="concat", size=draw.SMALL)
    t = draw.label(
        ax,
        (mb.centre[0], mb.bottom - 0.1),
        _shape(shapes["O"]),
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    t.set_gid("shape:O")

    out = draw.box(ax, (0.8, bottom), "output Linear,\n+ X, LayerNorm", size=draw.SMALL)
    draw.arrow(ax, mb.west, out.east)
    draw.label(
        ax,
        (out.centre[0], out.bottom - 0.12),
        "input of the\nnext layer",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    return fig


# --------------------------------------------------------------------------- chapter 18

#: The example of :func:`cache_per_token`: 8 query heads of 64; GQA with 2 key/value
#: heads; MLA with a latent of 4 heads' width and a rotary key of half a head.
CACHE_EXAMPLE = dict(
    heads=8, head_dim=64, gqa_kv_heads=2, kv_lora_rank=256, rope_dim=32
)


def cache_rows(dtype: torch.dtype = torch.bfloat16) -> dict[str, dict]:
    """What :func:`cache_per_token` draws: per attention kind, the cached vectors of one
    token in one layer (``[(kind, numbers), ...]``) and its bytes, from the package's
    ``kv_cache_bytes_per_token`` and ``LatentKVCache.bytes_per_token``."""
    c = CACHE_EXAMPLE
    rows = {}
    for name, kv_heads in (
        ("MHA", c["heads"]),
        ("GQA", c["gqa_kv_heads"]),
        ("MQA", 1),
    ):
        parts = [("key", c["head_dim"])] * kv_heads + [
            ("value", c["head_dim"])
        ] * kv_heads
        rows[name] = {
            "parts": parts,
            "kv_heads": kv_heads,
            "bytes": kv_cache_bytes_per_token(kv_heads, c["head_dim"], dtype=dtype),
        }
    rows["MLA"] = {
        "parts": [("latent", c["kv_lora_rank"]), ("key", c["rope_dim"])],
        "kv_heads": None,
        "bytes": LatentKVCache.bytes_per_token(
            c["kv_lora_rank"], c["rope_dim"], dtype=dtype
        ),
    }
    return rows


def cache_per_token():
    """What one token leaves in one layer's cache under MHA, GQA, MQA and MLA.

    One strip per kind, one cell per 32 cached numbers: MHA keeps a key (orange) and a
    value (green) for each of the 8 heads, GQA for each of 2 key/value heads, MQA for
    one, and MLA one latent ``c`` (grey) plus one rotary key ``k_R`` shared by all
    heads.
    The bytes per token and layer (bf16) are written after each strip (gid
    ``bytes:<kind>``), computed by :func:`cache_rows`.

    Returns:
        The Figure.
    """
    rows = cache_rows()
    c = CACHE_EXAMPLE
    unit = 32  # numbers per cell
    colours = {
        "key": draw.ROLE["key"],
        "value": draw.ROLE["value"],
        "latent": draw.ROLE["input"],
    }
    fig, ax = draw.canvas(7.3, 3.3, "What one token leaves in one layer's cache (bf16)")
    cell, left = 0.135, 1.45
    notes = {
        "MHA": f"a key and a value per head ({c['heads']} heads of {c['head_dim']})",
        "GQA": f"{c['gqa_kv_heads']} key/value heads, each shared by "
        f"{c['heads'] // c['gqa_kv_heads']} query heads",
        "MQA": "one key/value head for all query heads",
        "MLA": f"latent c ({c['kv_lora_rank']}) + rotary key k_R ({c['rope_dim']}),"
        " shared by all heads",
    }
    top = 2.6
    for r, (name, row) in enumerate(rows.items()):
        y = top - 0.56 * r
        fills = [
            draw.tint(colours[kind], 0.55)
            for kind, numbers in row["parts"]
            for _ in range(numbers // unit)
        ]
        bounds = draw.matrix(
            ax,
            (left + len(fills) * cell / 2, y),
            1,
            len(fills),
            cell=cell,
            fills=[fills],
            colour=draw.INK,
            gid=f"cells:{name}",
        )
        # an outline around each head's vector (or the latent, the rotary key)
        x = bounds.left
        for kind, numbers in row["parts"]:
            w = numbers // unit * cell
            draw.outline(
                ax,
                draw.Bounds(x, bounds.bottom, w, cell),
                colour=colours[kind],
                pad=0.0,
            )
            x += w
        draw.label(ax, (left - 0.15, y), name, ha="right", fontweight="bold")
        t = draw.label(
            ax,
            (bounds.right + 0.12, y),
            f"{row['bytes']:,} B",
            size=draw.SMALL,
            ha="left",
        )
        t.set_gid(f"bytes:{name}")
        draw.label(
            ax,
            (left, y - 0.2),
            notes[name],
            size=draw.SMALL,
            colour=draw.MUTED,
            ha="left",
            va="top",
        )
    for x, (kind, text) in zip(
        (0.4, 1.3, 2.35),
        (("key", "key"), ("value", "value"), ("latent", "MLA latent c")),
    ):
        draw.legend(ax, (x, 0.3), [(draw.tint(colours[kind], 0.55), text)])
    draw.label(
        ax,
        (4.1, 0.3),
        f"one cell = {unit} numbers",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    return fig


def paged_example() -> tuple[PagedKVCache, dict[str, int]]:
    """The seeded pool of :func:`paged_block_table`, as chapter 18 builds it: 12 blocks
    of 4 positions handed out in a shuffled order, sequences A, B and C of 11, 3 and 7
    positions, prompts first, then one token each per step."""
    g = torch.Generator().manual_seed(8)
    pool = PagedKVCache(num_blocks=12, block_size=4, num_kv_heads=1, head_dim=1)
    pool.free_blocks = torch.randperm(12, generator=g).tolist()
    lengths, prompt = {"A": 11, "B": 3, "C": 7}, {"A": 5, "B": 2, "C": 4}
    ids = {name: pool.add_sequence() for name in lengths}
    one = torch.zeros(1, 1, 1)
    for name in lengths:
        pool.append(
            ids[name], torch.zeros(1, prompt[name], 1), torch.zeros(1, prompt[name], 1)
        )
    for t in range(max(lengths.values())):
        for name, length in lengths.items():
            if prompt[name] + t < length:
                pool.append(ids[name], one, one)
    return pool, ids


_SEQUENCE_COLOURS = (
    draw.ROLE["query"],
    draw.ROLE["key"],
    draw.ROLE["value"],
    draw.ROLE["weight"],
)


def paged_block_table(
    cache: PagedKVCache | None = None, names: dict[str, int] | None = None
):
    """Block tables map each sequence's logical blocks to physical blocks of one pool.

    Top: the pool's physical blocks, coloured by the sequence that holds them, each
    with its filled slots (``fill:<b>``), the free ones light. Below: each sequence's
    block table, its logical blocks in order, each labelled with its physical block
    (``table:<name>[<n>]``) and joined to it by an arrow. A note follows one position
    through the table to its slot (``slot``). Drawn from ``cache`` (default: the seeded
    :func:`paged_example`); ``names`` maps a letter to each sequence id.

    Returns:
        The Figure.
    """
    if cache is None:
        cache, names = paged_example()
    if names is None:
        names = {chr(ord("A") + k): s for k, s in enumerate(cache.block_tables)}
    s = cache.block_size
    owner = {}
    for k, (name, seq) in enumerate(names.items()):
        for logical, physical in enumerate(cache.block_tables[seq]):
            filled = min(s, cache.lengths[seq] - s * logical)
            owner[physical] = (name, k, filled)
    fig, ax = draw.canvas(7.3, 3.4, "Paged KV cache: block tables point into one pool")
    cell = 0.5
    n_blocks = cache.num_blocks
    pool_left = 7.15 - n_blocks * cell
    pool_y = 2.3
    fills = [
        [
            draw.tint(_SEQUENCE_COLOURS[owner[b][1] % 4], 0.45)
            if b in owner
            else draw.BLOCKED
            for b in range(n_blocks)
        ]
    ]
    pb = draw.matrix(
        ax,
        (pool_left + n_blocks * cell / 2, pool_y),
        1,
        n_blocks,
        cell=cell,
        fills=fills,
        colour=draw.INK,
        col_labels=[str(b) for b in range(n_blocks)],
        gid="pool",
    )
    draw.label(ax, (pb.left - 0.1, pool_y + 0.1), "pool", ha="right", fontweight="bold")
    draw.label(
        ax,
        (pb.left - 0.1, pool_y - 0.12),
        f"blocks of {s}",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="right",
    )
    for b in range(n_blocks):
        text = f"{owner[b][0]} {owner[b][2]}/{s}" if b in owner else "free"
        t = draw.label(ax, (pb.left + (b + 0.5) * cell, pool_y), text, size=draw.SMALL)
        t.set_gid(f"fill:{b}")
    table_y = 1.15
    x_next = 0.9
    for k, (name, seq) in enumerate(names.items()):
        table = cache.block_tables[seq]
        colour = _SEQUENCE_COLOURS[k % 4]
        width = len(table) * cell * 0.8
        tb = draw.matrix(
            ax,
            (x_next + width / 2, table_y),
            1,
            len(table),
            cell=cell * 0.8,
            colour=colour,
            fills=[[draw.tint(colour, 0.45)] * len(table)],
            col_labels=[str(n) for n in range(len(table))],
        )
        draw.label(
            ax,
            (tb.centre[0], tb.bottom - 0.08),
            f"table {name}\n({cache.lengths[seq]} positions)",
            size=draw.SMALL,
            va="top",
        )
        for logical, physical in enumerate(table):
            x = tb.left + (logical + 0.5) * cell * 0.8
            t = draw.label(ax, (x, table_y), f"{physical}", size=draw.SMALL)
            t.set_gid(f"table:{name}[{logical}]")
            target = (pb.left + (physical + 0.5) * cell, pb.bottom)
            draw.arrow(ax, (x, tb.top + 0.2), target, colour=colour)
        x_next = tb.right + 0.9
    draw.label(
        ax,
        (0.3, table_y + 0.5),
        "logical\nblock n",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    first, seq = next(iter(names.items()))
    p = cache.lengths[seq] - 1
    slot = int(cache.slots(seq)[p])
    table = cache.block_tables[seq]
    t = draw.label(
        ax,
        (x_next - 0.5, table_y - 0.05),
        f"{first}'s position {p}: logical block\n{p} // {s} = {p // s}, physical block "
        f"{table[p // s]},\nslot {table[p // s]} x {s} + {p % s} = {slot}",
        size=draw.SMALL,
        ha="left",
    )
    t.set_gid("slot")
    return fig
