"""Diagrams of the Attention layers part (chapters 5-9): order, heads, caches, position.

Each function returns a matplotlib Figure drawn with :mod:`._draw`; a chapter shows it
in a cell tagged ``diagram`` and ``remove-input``. Every number and shape printed in a
diagram is computed by the package on a tiny seeded example (``SelfAttention``,
``split_heads``, ``merge_heads``, ``scaled_dot_product_attention``,
``MultiHeadAttention`` with its ``KVCache``, ``kv_cache_bytes_per_token``,
``rope_frequencies``, ``apply_rope``, ``alibi_bias``), so the
picture cannot drift from the mechanism it shows; each such text carries a ``gid``
naming what it shows (``weights[r,c]``, ``shape:heads`` ...) for the tests.

The module has one section per chapter; chapters 7-9 add theirs below chapter 6's.

Shape legend: ``n`` or ``L`` tokens, ``b`` batch, ``h`` query heads, ``h_kv``
key/value heads, ``d`` head size. Mask convention: boolean, **True = may attend**, as
in ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import Normalize
from matplotlib.patches import Arc, Circle, FancyArrowPatch

from ...foundations.scaled_dot_product import scaled_dot_product_attention
from ...layers.alignment import hard_alignment, local_alignment, soft_alignment
from ...layers.cross_attention import CrossAttention
from ...layers.kv_cache import kv_cache_bytes_per_token
from ...layers.learned_queries import LatentCrossAttention
from ...layers.multihead import MultiHeadAttention, merge_heads, split_heads
from ...layers.positional import alibi_bias, apply_rope, rope_frequencies
from ...layers.scoring import AdditiveScore, additive_hidden, dot_scores
from ...layers.self_attention import SelfAttention
from . import _draw as draw

__all__ = [
    "permutation_equivariance",
    "split_merge_heads",
    "grouped_query_heads",
    "kv_cache_growth",
    "position_schemes",
    "rope_rotation",
    "encoder_decoder_cross_attention",
    "learned_queries_summary",
    "alignment_kinds",
    "additive_vs_dot",
]

#: Colours that tell tokens (or heads) apart, the Okabe-Ito hues not used by ROLE.
HUES = ("#e69f00", "#56b4e9", "#cc79a7", "#f0e442")


def _shape(size) -> str:
    return "(" + ", ".join(str(n) for n in size) + ")"


def _row_fills(colours, cols: int, amount: float = 0.35):
    """One tinted colour per row, repeated across its ``cols`` cells."""
    return [[draw.tint(c, amount)] * cols for c in colours]


# =========================================================================== chapter 5


_PERM_TOKENS = ("cats", "chase", "mice")


def permutation_example():
    """The tiny seeded head of :func:`permutation_equivariance`, in float64.

    Returns:
        ``(tokens, x, perm, head)``: three token names, their vectors ``x`` ``(3, 4)``,
        the new order ``perm`` (row ``r`` of ``x[perm]`` is token ``perm[r]``) and a
        ``SelfAttention(4, 2, 2)``.
    """
    torch.manual_seed(5)
    head = SelfAttention(4, 2, 2).double()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64)
    return _PERM_TOKENS, x, torch.tensor([2, 0, 1]), head


def permutation_equivariance():
    """Reordering the tokens reorders the output rows, and nothing else changes.

    A seeded ``SelfAttention`` head runs on three tokens in their order and in a new
    order ``P X``. The weights of the reordered tokens are ``P A P^T`` (the same
    numbers, rows and columns moved) and their outputs ``P Z`` (the same rows, moved):
    each token's output does not depend on where it stands. All numbers are the head's
    own results (its weights with ``need_weights=True``).

    Returns:
        The Figure.
    """
    tokens, x, perm, head = permutation_example()
    with torch.no_grad():
        z, a = head(x, need_weights=True)  # (3, 2), (3, 3)
        zp, ap = head(x[perm], need_weights=True)  # the reordered tokens
    hues = dict(zip(tokens, HUES))
    order = [tokens[p] for p in perm.tolist()]

    fig, ax = draw.canvas(
        7.2, 4.55, "Reorder the tokens and the outputs reorder with them"
    )
    cell, wcell = 0.22, 0.36
    rows = {"in order": (tokens, a, z, 2.95), "reordered": (order, ap, zp, 1.2)}
    for k, (name, (names, weights, out, y)) in enumerate(rows.items()):
        suffix = "" if k == 0 else "P"
        xb = draw.matrix(
            ax,
            (1.2, y),
            *x.shape,
            cell=cell,
            name="X" if k == 0 else "P X",
            shape=_shape(x.shape),
            fills=_row_fills([hues[t] for t in names], x.shape[1]),
            row_labels=names,
            gid=f"{suffix}X",
        )
        ab = draw.heatmap(
            ax,
            (3.2, y),
            weights,
            cell=wcell,
            name="weights A" if k == 0 else "weights P A Pᵀ",
            row_labels=names,
            col_labels=names,
            colorbar="weight" if k == 0 else None,
            gid=f"{suffix}A",
        )
        ob = draw.matrix(
            ax,
            (6.1, y),
            *out.shape,
            cell=wcell,
            values=out,
            name="output Z" if k == 0 else "output P Z",
            shape=_shape(out.shape),
            fills=_row_fills([hues[t] for t in names], out.shape[1]),
            row_labels=names,
            gid=f"{suffix}Z",
        )
        draw.arrow(ax, (xb.right + 0.05, y), (ab.left - 0.5, y), text="attend")
        draw.arrow(ax, (ab.right + 0.75, y), (ob.left - 0.5, y), text="× V")
        draw.label(
            ax,
            (0.18, y),
            name,
            size=draw.SMALL,
            colour=draw.MUTED,
            ha="left",
            rotation=90,
        )
    draw.label(
        ax,
        (3.6, 0.3),
        "attention(P X) = P attention(X): the same rows, in the new order",
        size=draw.SMALL,
    )
    return fig


# =========================================================================== chapter 6


def split_example():
    """The numbered input and the per-head outputs of :func:`split_merge_heads`.

    Returns:
        ``(x, heads, out, merged)``: ``x`` ``(1, 2, 6)`` holds ``0 ... 11`` (2 tokens,
        3 heads of size 2), ``heads = split_heads(x, 3)`` ``(1, 3, 2, 2)``, ``out`` the
        attention of every head on itself (``q = k = v`` = the head's slice, scaled by
        1/4 so the weights do not saturate) and ``merged = merge_heads(out)``.
    """
    x = torch.arange(12, dtype=torch.float64).reshape(1, 2, 6)
    heads = split_heads(x, 3)  # (1, 3, 2, 2)
    small = heads / 4
    out = scaled_dot_product_attention(small, small, heads)  # (1, 3, 2, 2)
    return x, heads, out, merge_heads(out)


def split_merge_heads():
    """split_heads and merge_heads: which numbers each head gets, and where they return.

    ``x`` ``(b, L, h d) = (1, 2, 6)`` holds the numbers 0 ... 11 (two tokens, three
    heads of size 2), coloured by the head that owns them. ``split_heads`` (a reshape to
    ``(b, L, h, d)`` and a transpose) gives each head an ``(L, d)`` matrix: its two
    features of every token. Attention runs in every head separately; ``merge_heads``
    (the transpose back and a reshape) puts each head's output back in its columns.
    Numbers and shapes are the package's results.

    Returns:
        The Figure.
    """
    x, heads, out, merged = split_example()
    h = heads.shape[1]
    fig, ax = draw.canvas(
        7.2, 4.75, "Heads split off and merged back: a reshape and a transpose"
    )
    cell = 0.3
    top, bottom = 3.15, 1.0
    tokens = ("token 0", "token 1")

    def by_head(m):  # fills of an (L, h d) matrix, one hue per head's columns
        d = m.shape[-1] // h
        return [[draw.tint(HUES[c // d], 0.45) for c in range(m.shape[-1])] for _ in m]

    def note(xy, text, gid=None, **kw):
        t = draw.label(ax, xy, text, size=draw.SMALL, colour=draw.MUTED, **kw)
        if gid is not None:
            t.set_gid(gid)

    xb = draw.matrix(
        ax,
        (1.55, top),
        *x.shape[1:],
        cell=cell,
        values=x[0],
        fmt="{:.0f}",
        name="x",
        fills=by_head(x[0]),
        row_labels=tokens,
        gid="x",
    )
    note(
        (xb.centre[0], xb.bottom - 0.07),
        f"(b, L, h·d) = {_shape(x.shape)}",
        "shape:x",
        va="top",
    )
    for n in range(h):
        left = xb.left + n * 2 * cell
        draw.bracket(
            ax,
            (left + 0.03, xb.top + 0.32),
            (left + 2 * cell - 0.03, xb.top + 0.32),
            f"head {n}",
            side="above",
            depth=0.06,
        )
    centres = [4.55 + 0.95 * n for n in range(h)]
    head_boxes, out_boxes = [], []
    for n, cx in enumerate(centres):
        fills = [[draw.tint(HUES[n], 0.45)] * 2 for _ in range(2)]
        head_boxes.append(
            draw.matrix(
                ax,
                (cx, top),
                2,
                2,
                cell=cell,
                values=heads[0, n],
                fmt="{:.0f}",
                name=f"head {n}",
                fills=fills,
                gid=f"head{n}",
            )
        )
        out_boxes.append(
            draw.matrix(
                ax,
                (cx, bottom),
                2,
                2,
                cell=cell,
                values=out[0, n],
                fmt="{:.1f}",
                name=f"output {n}",
                fills=fills,
                gid=f"out{n}",
                size=8.5,
            )
        )
        draw.arrow(ax, (cx, head_boxes[-1].bottom - 0.05), (cx, bottom + 0.58))
    note(
        (centres[1], head_boxes[1].top + 0.3),
        f"(b, h, L, d) = {_shape(heads.shape)}",
        "shape:heads",
        va="bottom",
    )
    note(
        (centres[0] - 0.25, (top + bottom) / 2 + 0.05),
        "attention\nin each head",
        ha="right",
    )
    mb = draw.matrix(
        ax,
        (1.55, bottom),
        *merged.shape[1:],
        cell=cell,
        values=merged[0],
        fmt="{:.1f}",
        name="merged",
        fills=by_head(merged[0]),
        row_labels=tokens,
        gid="merged",
        size=8.5,
    )
    note(
        (mb.centre[0], mb.bottom - 0.07),
        f"(b, L, h·d) = {_shape(merged.shape)}",
        "shape:merged",
        va="top",
    )
    start, end = xb.right + 0.12, head_boxes[0].left - 0.12
    draw.arrow(ax, (start, top), (end, top), text="split_heads")
    note(((start + end) / 2, top - 0.08), "reshape,\ntranspose(1, 2)", va="top")
    start, end = out_boxes[0].left - 0.12, mb.right + 0.12
    draw.arrow(ax, (start, bottom), (end, bottom), text="merge_heads")
    note(((start + end) / 2, bottom - 0.08), "transpose(1, 2),\nreshape", va="top")
    return fig


def head_groups(num_heads: int, num_kv_heads: int) -> list[int]:
    """The key/value head each query head reads, found by running attention.

    Key/value head ``g`` holds values equal to ``g``; with ``enable_gqa=True`` the
    package's ``scaled_dot_product_attention`` returns, in query head ``n``, the value
    of the key/value head it reads.
    """
    q = torch.zeros(1, num_heads, 1, 1)
    k = torch.zeros(1, num_kv_heads, 1, 1)
    v = torch.arange(num_kv_heads, dtype=torch.float32).reshape(1, num_kv_heads, 1, 1)
    out = scaled_dot_product_attention(q, k, v, enable_gqa=True)  # (1, h, 1, 1)
    return [round(g) for g in out.flatten().tolist()]


def grouped_query_heads():
    """Multi-head, grouped-query and multi-query attention: who shares keys and values.

    Eight query heads (top) read key/value heads (bottom): eight of them in MHA, two in
    GQA (each serving a group of four consecutive query heads), one in MQA. The lines
    are found by running the package's attention with ``enable_gqa=True``; the cache
    size under each panel is ``kv_cache_bytes_per_token`` for heads of size 128 in
    fp16, per token and per layer.

    Returns:
        The Figure.
    """
    h, d = 8, 128
    fig, ax = draw.canvas(7.2, 3.3, "Query heads share key/value heads: MHA, GQA, MQA")
    panels = (("MHA", 8), ("GQA", 2), ("MQA", 1))
    width, box, gap = 2.27, 0.19, 0.05
    q_y, k_y = 2.2, 1.3  # centres of the query row and of the key cells
    for p, (name, h_kv) in enumerate(panels):
        mid = 0.32 + p * width + width / 2
        groups = head_groups(h, h_kv)
        row = h * box + (h - 1) * gap
        qx = [mid - row / 2 + n * (box + gap) + box / 2 for n in range(h)]
        # each key/value head sits under the middle of the query heads that read it
        kx = [
            sum(qx[n] for n in range(h) if groups[n] == g) / groups.count(g)
            for g in range(h_kv)
        ]
        title = draw.label(
            ax, (mid, 2.55), f"{name}: h_kv = {h_kv}", fontweight="bold", va="bottom"
        )
        title.set_gid(f"title:{name}")
        for n, cx in enumerate(qx):
            g = groups[n]
            line = ax.plot(
                [cx, kx[g]],
                [q_y - box / 2, k_y + box / 2],
                color=draw.MUTED,
                lw=0.9,
            )[0]
            line.set_gid(f"{name}:q{n}->kv{g}")
            draw.matrix(ax, (cx, q_y), 1, 1, cell=box, colour=draw.ROLE["query"])
        for cx in kx:
            for role, y in (("key", k_y), ("value", k_y - box)):
                draw.matrix(ax, (cx, y), 1, 1, cell=box, colour=draw.ROLE[role])
        if 1 < h_kv < h:
            size = h // h_kv
            for g in range(h_kv):
                left, right = qx[g * size] - box / 2, qx[g * size + size - 1] + box / 2
                draw.bracket(
                    ax,
                    (left + 0.02, q_y + box / 2 + 0.06),
                    (right - 0.02, q_y + box / 2 + 0.06),
                    side="above",
                    depth=0.05,
                )
        if p == 0:
            for text, y in (("Q", q_y), ("K", k_y), ("V", k_y - box)):
                draw.label(ax, (qx[0] - 0.15, y), text, size=draw.SMALL, ha="right")
        kib = kv_cache_bytes_per_token(h_kv, d, dtype=torch.float16) / 2**10
        text = draw.label(
            ax,
            (mid, 0.72),
            f"cache: {kib:g} KiB per token\nper layer (d = {d}, fp16)",
            size=draw.SMALL,
            colour=draw.MUTED,
        )
        text.set_gid(f"bytes:{name}")
    draw.label(
        ax,
        (3.6, 0.24),
        "query head n reads key/value head n // (h / h_kv); here h = 8",
        size=draw.SMALL,
    )
    return fig


def cache_example():
    """The decoding run of :func:`kv_cache_growth`: a prompt of 3, then 2 steps.

    Returns:
        ``(steps, max_len)``: for each call, ``(new, length, weights)`` with the number
        of new tokens, the cache's length after the call and the newest query's weights
        over the cached keys (head 0, ``(length,)``); ``max_len`` the cache's capacity.
    """
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 2, num_kv_heads=1).eval()
    x = torch.randn(1, 5, 8)
    cache = layer.new_cache(batch_size=1, max_len=5)
    steps = []
    with torch.no_grad():
        for start, stop in ((0, 3), (3, 4), (4, 5)):
            chunk = x[:, start:stop]
            _, w = layer(
                chunk, chunk, chunk, is_causal=True, cache=cache, need_weights=True
            )
            steps.append((stop - start, cache.length, w[0, 0, -1]))
    return steps, cache.max_len


def kv_cache_growth():
    """The KV cache during decoding: one key and one value appended per step.

    A ``MultiHeadAttention`` layer with a ``KVCache`` of 5 positions reads a prompt of
    3 tokens (the prefill), then generates one token per step. After each call the
    cache holds the keys and values of every position so far (the new ones dark); the
    newest query attends to all of them, and its weights (head 0) are the layer's own.
    Nothing earlier is recomputed.

    Returns:
        The Figure.
    """
    steps, max_len = cache_example()
    fig, ax = draw.canvas(
        7.2, 4.6, "The KV cache grows by one key and one value per step"
    )
    cell = 0.3
    names = ("prefill: tokens 0-2", "step: token 3", "step: token 4")
    empty = draw.tint(draw.MUTED, 0.08)
    for s, ((new, length, weights), name) in enumerate(zip(steps, names)):
        y = 3.45 - 1.2 * s
        draw.label(ax, (0.25, y), name, ha="left", fontweight="bold")
        lab = draw.label(
            ax,
            (0.25, y - 0.3),
            f"cache length {length}/{max_len}",
            size=draw.SMALL,
            colour=draw.MUTED,
            ha="left",
        )
        lab.set_gid(f"length{s}")
        for r, (role, tag) in enumerate((("key", "K"), ("value", "V"))):
            colour = draw.ROLE[role]
            fills = [
                [
                    colour
                    if length - new <= c < length
                    else draw.tint(colour, 0.3)
                    if c < length
                    else empty
                    for c in range(max_len)
                ]
            ]
            b = draw.matrix(
                ax,
                (3.0, y + 0.17 - r * 0.36),
                1,
                max_len,
                cell=cell,
                fills=fills,
                colour=draw.INK,
                gid=f"{tag}{s}",
            )
            draw.label(
                ax, (b.left - 0.1, b.centre[1]), tag, size=draw.SMALL, ha="right"
            )
        left = 4.85
        heat = draw.heatmap(
            ax,
            (left + length * cell / 2, y),
            weights[None],
            cell=cell,
            colorbar=None,
            gid=f"weights{s}",
            size=8.0,
            fmt="{:.1f}",
        )
        for c in range(length, max_len):
            draw.matrix(
                ax,
                (left + (c + 0.5) * cell, y),
                1,
                1,
                cell=cell,
                fills=[[empty]],
                colour=draw.GRID,
            )
        draw.arrow(ax, (b.right + 0.1, y), (heat.left - 0.1, y), text="attend")
        if s == 0:
            draw.label(
                ax,
                (left + max_len * cell / 2, y + 0.35),
                "newest query's weights (head 0)",
                size=draw.SMALL,
                colour=draw.MUTED,
                va="bottom",
            )
            draw.label(
                ax,
                (3.0, y + 0.52),
                "positions 0-4",
                size=draw.SMALL,
                colour=draw.MUTED,
                va="bottom",
            )
    # one colour bar for the three rows of weights, right of them
    cax = ax.inset_axes((6.6, 1.0, 0.1, 2.3), transform=ax.transData)
    bar = fig.colorbar(
        plt.cm.ScalarMappable(norm=Normalize(0, 1), cmap=draw.WEIGHT_CMAP), cax=cax
    )
    bar.set_ticks([0, 0.5, 1])
    bar.ax.tick_params(labelsize=draw.SMALL, colors=draw.MUTED, length=2)
    bar.outline.set_edgecolor(draw.GRID)
    bar.set_label("weight", fontsize=draw.SMALL, color=draw.MUTED, labelpad=2)
    draw.label(
        ax,
        (3.6, 0.25),
        "dark: appended by this call; light: kept from earlier calls, never recomputed",
        size=draw.SMALL,
    )
    return fig


# =========================================================================== chapter 7
# Position: where position enters attention; RoPE as a rotation of feature pairs.

#: One colour per feature pair (Okabe-Ito, distinct from nothing else in the figure).
_PAIR_COLOURS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7")


def _vector(ax, centre, tip, colour, *, gid=None, lw=1.8, zorder=3):
    """An arrow from ``centre`` to ``tip``; its shaft is a line with ``gid`` (tests
    read its end point back)."""
    (line,) = ax.plot(
        [centre[0], tip[0]],
        [centre[1], tip[1]],
        color=colour,
        lw=lw,
        solid_capstyle="butt",
        zorder=zorder,
    )
    if gid is not None:
        line.set_gid(gid)
    ax.add_patch(
        FancyArrowPatch(
            centre,
            tip,
            arrowstyle="-|>",
            mutation_scale=11,
            lw=0,
            color=colour,
            shrinkA=0,
            shrinkB=0,
            zorder=zorder,
        )
    )


def rope_rotation(d: int = 8, base: float = 100.0, position: int = 4):
    """RoPE: the features of a query come in pairs, and pair ``k`` turns by
    ``position * theta_k``, each pair at its own frequency.

    Left, a query of ``d`` features (seeded), its pairs ``(2k, 2k+1)`` bracketed (the
    interleaved layout). Right, each pair as a 2-D vector on its circle: at position 0
    (grey) and at ``position`` (coloured, computed by :func:`attention.apply_rope`),
    with a dot for every position between, and the frequency, the angle and the
    positions per full turn printed below (from :func:`attention.rope_frequencies`).
    The default base is 100, not 10,000, so that every pair's turn is visible.

    Returns:
        The Figure.
    """
    if d != 2 * len(_PAIR_COLOURS):
        raise ValueError(
            f"the diagram draws {len(_PAIR_COLOURS)} pairs, d = 8, got {d}"
        )
    g = torch.Generator().manual_seed(3)
    q = torch.randn(d, generator=g, dtype=torch.float64)
    theta = rope_frequencies(d, base=base)  # (d/2,)
    rotated = apply_rope(
        q[None], torch.tensor([position]), base=base, interleaved=True
    )[0]
    fig, ax = draw.canvas(
        7.3, 3.75, "RoPE: each feature pair turns at its own frequency"
    )
    cell = 0.25
    qb = draw.matrix(
        ax,
        (0.72, 1.95),
        d,
        1,
        cell=cell,
        values=q[:, None],
        fmt="{:.1f}",
        colour=draw.ROLE["query"],
        name="q",
        shape=f"(d,) = ({d},)",
        gid="q",
        size=8.5,
    )
    for k, colour in enumerate(_PAIR_COLOURS):
        top = qb.top - 2 * k * cell
        draw.bracket(
            ax,
            (qb.right + 0.05, top - 0.03),
            (qb.right + 0.05, top - 2 * cell + 0.03),
            f"pair {k}",
            side="right",
            colour=colour,
        )
    draw.arrow(ax, (1.62, 1.95), (1.98, 1.95), colour=draw.INK)
    draw.label(
        ax,
        (1.8, 2.12),
        f"m = {position}",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="bottom",
    )
    radius, y = 0.47, 2.25
    for k, colour in enumerate(_PAIR_COLOURS):
        cx = 2.62 + 1.27 * k
        ax.add_patch(Circle((cx, y), radius, fill=False, edgecolor=draw.GRID, lw=0.8))
        ax.plot([cx - radius, cx + radius], [y, y], color=draw.BLOCKED, lw=0.6)
        ax.plot([cx, cx], [y - radius, y + radius], color=draw.BLOCKED, lw=0.6)
        pair = q[2 * k : 2 * k + 2]
        start = math.atan2(float(pair[1]), float(pair[0]))
        turned = rotated[2 * k : 2 * k + 2]
        end = math.atan2(float(turned[1]), float(turned[0]))
        for p in range(1, position):  # the positions in between, one dot each
            a = start + p * float(theta[k])
            ax.plot(
                cx + radius * math.cos(a),
                y + radius * math.sin(a),
                "o",
                ms=2.6,
                color=draw.tint(colour, 0.6),
                zorder=2,
            )
        _vector(
            ax,
            (cx, y),
            (cx + radius * math.cos(start), y + radius * math.sin(start)),
            draw.MUTED,
            gid=f"start[{k}]",
            lw=1.3,
        )
        _vector(
            ax,
            (cx, y),
            (cx + radius * math.cos(end), y + radius * math.sin(end)),
            colour,
            gid=f"rotated[{k}]",
        )
        sweep = position * float(theta[k])  # the angle turned, counter-clockwise
        ax.add_patch(
            Arc(
                (cx, y),
                0.5 * radius,
                0.5 * radius,
                theta1=math.degrees(start),
                theta2=math.degrees(start + sweep),
                color=colour,
                lw=1.2,
            )
        )
        draw.label(
            ax,
            (cx, y + radius + 0.1),
            f"pair {k}",
            colour=colour,
            va="bottom",
            fontweight="bold",
        )
        lines = (
            ("theta", f"θ = {float(theta[k]):.2f}"),
            ("angle", f"{position}θ = {sweep:.2f} rad"),
            ("period", f"turn: {2 * math.pi / float(theta[k]):.0f} positions"),
        )
        for n, (what, text) in enumerate(lines):
            t = draw.label(ax, (cx, y - radius - 0.2 - 0.22 * n), text, size=draw.SMALL)
            t.set_gid(f"{what}[{k}]")
    draw.label(
        ax,
        (3.65, 0.34),
        "grey: the pair at position 0; coloured: at m; dots: the positions between. "
        f"d = {d}, base {base:g}",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig


def position_schemes():
    """Where position enters attention: added to the input once (absolute), added to
    the scores (relative biases: T5, ALiBi), turned into the queries and keys (RoPE),
    or nowhere but the causal mask (NoPE).

    Under the relative column, ALiBi's bias for the first of 8 heads (slope 1/2) on 4
    positions, computed by :func:`attention.alibi_bias`.

    Returns:
        The Figure.
    """
    fig, ax = draw.canvas(7.3, 4.3, "Where position enters attention")
    columns = (
        (
            "Absolute",
            "sinusoidal, learned",
            ("token + PE(p)", "projections", "scores q · k"),
            "once, at the input",
        ),
        (
            "Relative bias",
            "T5, ALiBi",
            ("scores q · k", "+ bias b(i − j)", "softmax"),
            "every layer, on the scores",
        ),
        (
            "Rotary (RoPE)",
            "Llama, Qwen, Gemma",
            ("projections", "turn q by i, k by j", "score sees j − i"),
            "every layer, on q and k",
        ),
        (
            "None (NoPE)",
            "layers of Llama 4, SmolLM3",
            ("scores q · k", "causal mask", "query p: p + 1 keys"),
            "order leaks through the mask",
        ),
    )
    colours = (draw.ROLE["input"], draw.ROLE["weight"], draw.ROLE["query"], "#8c6d1f")
    width = 1.72
    for n, ((head, who, steps, where), colour) in enumerate(zip(columns, colours)):
        cx = 0.2 + width / 2 + n * (width + 0.03)
        draw.label(ax, (cx, 3.72), head, colour=colour, fontweight="bold")
        draw.label(ax, (cx, 3.48), who, size=draw.SMALL, colour=draw.MUTED)
        previous = None
        for r, step in enumerate(steps):
            b = draw.box(
                ax,
                (cx, 3.05 - 0.62 * r),
                step,
                width=width - 0.12,
                colour=colour,
                size=9.0,
            )
            if previous is not None:
                draw.arrow(ax, previous.south, b.north, colour=colour)
            previous = b
        draw.label(ax, (cx, 1.55), where, size=draw.SMALL, colour=colour)
    # ALiBi's bias of one head, under the relative column: -slope * |i - j|
    bias = alibi_bias(8, 4, 4, dtype=torch.float64)[0]  # (i, j), slope 1/2
    cx = 0.2 + width / 2 + (width + 0.03)
    bounds = draw.matrix(
        ax,
        (cx - 0.35, 0.78),
        4,
        4,
        cell=0.28,
        values=bias,
        fmt="{:g}",
        fills=[
            [draw.tint(colours[1], 0.12 + 0.45 * float(-v) / 1.5) for v in row]
            for row in bias
        ],
        colour=colours[1],
        gid="bias",
        size=8.0,
    )
    draw.label(
        ax,
        (bounds.right + 0.12, bounds.top - 0.12),
        "ALiBi, one head:",
        size=draw.SMALL,
        colour=colours[1],
        ha="left",
    )
    draw.label(
        ax,
        (bounds.right + 0.12, bounds.top - 0.36),
        "b = −|i − j| / 2",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    draw.label(
        ax,
        (bounds.right + 0.12, bounds.top - 0.6),
        "rows: queries i,",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    draw.label(
        ax,
        (bounds.right + 0.12, bounds.top - 0.82),
        "columns: keys j",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    return fig


# =========================================================================== chapter 8


_SOURCE = ("the", "black", "cat", "sat", "down")
_TARGET = ("<s>", "le", "chat")


def cross_example():
    """The tiny seeded layer of :func:`encoder_decoder_cross_attention`, in float64.

    Returns:
        ``(source, target, memory, states, layer)``: the source and target token
        names, the encoder output ``memory`` ``(5, 4)``, the decoder states ``(3, 4)``
        and a ``CrossAttention(4, 4, 2, 2)``.
    """
    torch.manual_seed(8)
    layer = CrossAttention(4, 4, 2, 2).double()
    g = torch.Generator().manual_seed(8)
    memory = 2 * torch.randn(len(_SOURCE), 4, generator=g, dtype=torch.float64)
    states = 2 * torch.randn(len(_TARGET), 4, generator=g, dtype=torch.float64)
    return _SOURCE, _TARGET, memory, states, layer


def encoder_decoder_cross_attention():
    """Cross-attention in an encoder-decoder: queries from the decoder, keys and
    values from the encoder.

    A seeded ``CrossAttention`` reads 3 decoder states (target tokens) and 5 encoder
    outputs (source tokens). The weights are a 3 x 5 table, target rows against
    source columns, and the output has one row per target token. All numbers are the
    layer's own (``need_weights=True``).

    Returns:
        The Figure.
    """
    source, target, memory, states, layer = cross_example()
    with torch.no_grad():
        z, a = layer(states, memory, need_weights=True)  # (3, 2), (3, 5)
    fig, ax = draw.canvas(
        7.2, 4.0, "Cross-attention: the decoder asks, the encoder answers"
    )
    dec = draw.matrix(
        ax,
        (1.05, 2.5),
        *states.shape,
        cell=0.22,
        colour=draw.ROLE["query"],
        name="decoder states",
        shape=_shape(states.shape),
        row_labels=target,
        gid="dec",
    )
    enc = draw.matrix(
        ax,
        (1.05, 0.95),
        *memory.shape,
        cell=0.22,
        colour=draw.ROLE["key"],
        name="encoder output",
        shape=_shape(memory.shape),
        row_labels=source,
        gid="enc",
    )
    heat = draw.heatmap(
        ax,
        (4.1, 2.5),
        a,
        cell=0.42,
        name="weights A (target × source)",
        row_labels=target,
        col_labels=source,
        gid="A",
    )
    out = draw.matrix(
        ax,
        (6.65, 2.5),
        *z.shape,
        cell=0.42,
        values=z,
        colour=draw.ROLE["value"],
        name="output",
        shape=_shape(z.shape),
        gid="Z",
    )
    draw.arrow(ax, dec.east, (heat.left - 0.55, 2.5), text="queries")
    draw.arrow(
        ax, enc.east, (heat.centre[0], heat.bottom - 0.05), text="keys", side="below"
    )
    draw.arrow(ax, (heat.right + 0.7, 2.5), out.west, text="× V")
    draw.arrow(
        ax,
        (enc.right + 0.1, enc.bottom + 0.15),
        (out.centre[0], out.bottom - 0.35),
        text="values",
        side="below",
    )
    note = draw.label(
        ax,
        (4.4, 0.3),
        f"one output row per target token: {_shape(z.shape)}",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    note.set_gid("shape:Z")
    return fig


def latent_example():
    """The tiny seeded block of :func:`learned_queries_summary`, in float64.

    Returns:
        ``(layer, small, large)``: a ``LatentCrossAttention(3, 4, input_dim=3)`` and
        two inputs, a set of 4 and a set of 7 elements, ``(1, n, 3)``.
    """
    torch.manual_seed(3)
    layer = LatentCrossAttention(3, 4, input_dim=3, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    small = 2 * torch.randn(1, 4, 3, generator=g, dtype=torch.float64)
    large = 2 * torch.randn(1, 7, 3, generator=g, dtype=torch.float64)
    return layer, small, large


def learned_queries_summary():
    """Learned queries summarise an input of any size in a fixed number of rows.

    A seeded ``LatentCrossAttention`` with 3 learned queries (Perceiver latents, DETR
    object queries) reads a set of 4 elements and a set of 7. Its weights have one
    column per element, but the output has 3 rows both times. The numbers are the
    block's own.

    Returns:
        The Figure.
    """
    layer, small, large = latent_example()
    with torch.no_grad():
        results = [layer(x, need_weights=True) for x in (small, large)]
    latents = layer.latents.detach()
    fig, ax = draw.canvas(7.2, 4.3, "Learned queries: any number of inputs, m outputs")
    lat = draw.matrix(
        ax,
        (0.95, 2.1),
        *latents.shape,
        cell=0.24,
        colour=draw.ROLE["query"],
        name="learned queries",
        shape=f"(m, d) = {_shape(latents.shape)}",
        row_labels=[f"q{i}" for i in range(latents.shape[0])],
        gid="L",
    )
    for k, ((z, w), y) in enumerate(zip(results, (3.05, 1.05))):
        assert w is not None
        weights = w[0, 0]  # (m, n)
        n = weights.shape[-1]
        heat = draw.heatmap(
            ax,
            (2.55 + n * 0.36 / 2, y),
            weights,
            cell=0.36,
            fmt="{:.1f}",
            size=8.0,
            name=f"weights over a set of {n} elements",
            row_labels=[f"q{i}" for i in range(weights.shape[0])],
            col_labels=[f"x{j + 1}" for j in range(n)],
            colorbar="weight" if k == 1 else None,
            gid=f"A{k}",
        )
        out = draw.matrix(
            ax,
            (6.45, y),
            *z[0].shape,
            cell=0.2,
            colour=draw.ROLE["value"],
            name="output",
            shape=_shape(z[0].shape),
            gid=f"Z{k}",
        )
        draw.arrow(ax, lat.east, heat.west)
        end = heat.right + (0.75 if k == 1 else 0.1)
        draw.arrow(ax, (end, y), out.west)
        for t in ax.texts:
            if t.get_text() == _shape(z[0].shape) and t.get_gid() is None:
                t.set_gid(f"shape:Z{k}")
    return fig


# =========================================================================== chapter 9


def alignment_example():
    """The scores and choices of :func:`alignment_kinds`: ``(scores, sample, centre,
    half_width)``, eight seeded scores ``(1, 8)`` in float64, the hard draw's position
    (seeded), the local window's centre ``(1,)`` and half-width."""
    g = torch.Generator().manual_seed(9)
    scores = 1.5 * torch.randn(1, 8, generator=g, dtype=torch.float64)
    weights = soft_alignment(scores)
    sample = int(hard_alignment(weights, generator=torch.Generator().manual_seed(2)))
    return scores, sample, torch.tensor([5.2], dtype=torch.float64), 2.0


def alignment_kinds():
    """One row of scores, three alignments: soft, hard and local.

    Soft: the softmax over every key (``soft_alignment``). Hard: one position drawn
    from those weights (``hard_alignment``, seeded), weight 1 there. Local: the
    softmax over the window ``|l - p| <= D`` only, damped by a Gaussian around ``p``
    (``local_alignment``). All numbers are the package's own.

    Returns:
        The Figure.
    """
    scores, sample, centre, half = alignment_example()
    soft = soft_alignment(scores)
    hard = torch.zeros_like(soft)
    hard[0, sample] = 1.0
    local = local_alignment(scores, centre, half)
    fig, ax = draw.canvas(7.2, 4.3, "From scores to weights: soft, hard and local")
    keys = [f"k{c}" for c in range(scores.shape[-1])]
    cell = 0.5
    x = 3.9
    top = draw.matrix(
        ax,
        (x, 3.3),
        1,
        8,
        cell=cell,
        values=scores,
        fmt="{:.1f}",
        colour=draw.MUTED,
        col_labels=keys,
        gid="scores",
    )
    draw.label(ax, (top.left - 0.15, 3.3), "scores", ha="right")
    rows = (
        ("soft", soft, "softmax over all keys", None),
        ("hard", hard, f"one draw: k{sample}", None),
        (
            "local",
            local,
            f"window |l - p| <= {half:g}, p = {float(centre):.1f}",
            "weight",
        ),
    )
    for r, (name, w, note, bar) in enumerate(rows):
        y = 2.35 - 0.85 * r
        b = draw.heatmap(
            ax,
            (x, y),
            w,
            cell=cell,
            fmt="{:.2f}",
            size=8.5,
            colorbar=None,
            gid=name,
        )
        draw.label(ax, (b.left - 0.15, y), name, ha="right")
        draw.label(
            ax,
            (b.centre[0], b.bottom - 0.12),
            note,
            size=draw.SMALL,
            colour=draw.MUTED,
            va="top",
        )
        if bar:
            cax = ax.inset_axes(
                (b.right + 0.25, 0.55, 0.1, 2.05), transform=ax.transData
            )
            cbar = fig.colorbar(
                plt.cm.ScalarMappable(
                    norm=Normalize(0, 1), cmap=plt.get_cmap(draw.WEIGHT_CMAP)
                ),
                cax=cax,
            )
            cbar.set_ticks([0, 0.5, 1])
            cbar.ax.tick_params(labelsize=draw.SMALL, colors=draw.MUTED, length=2)
            cbar.set_label("weight", fontsize=draw.SMALL, color=draw.MUTED)
    return fig


def additive_example():
    """The tiny seeded score of :func:`additive_vs_dot`: ``(q, k, score)`` with
    ``q`` ``(2, 4)``, ``k`` ``(3, 4)`` in float64 and an ``AdditiveScore(4, 4, 5)``."""
    torch.manual_seed(4)
    score = AdditiveScore(4, 4, 5).double()
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, generator=g, dtype=torch.float64)
    k = torch.randn(3, 4, generator=g, dtype=torch.float64)
    return q, k, score


def additive_vs_dot():
    """What each score computes, with the shapes of a tiny example.

    Dot: one matrix product ``Q K^T`` of shape ``(i, j)``. Additive: both sides are
    projected to ``h``, every query-key pair is added into an ``(i, j, h)`` tensor,
    passed through tanh and reduced by ``v``. The shapes are those of
    ``dot_scores``, ``additive_hidden`` and ``AdditiveScore`` on ``i = 2`` queries,
    ``j = 3`` keys, ``d = 4``, ``h = 5``.

    Returns:
        The Figure.
    """
    q, k, score = additive_example()
    with torch.no_grad():
        dot = dot_scores(q, k)
        hidden = additive_hidden(q, k, score.w_query, score.w_key, score.bias)
        add = score(q, k)
    fig, ax = draw.canvas(7.2, 3.6, "Dot and additive scores: one product, or a tensor")
    draw.label(ax, (0.3, 2.85), "dot", ha="left", fontweight="bold")
    draw.label(ax, (0.3, 1.25), "additive", ha="left", fontweight="bold")
    qb = draw.box(ax, (1.8, 3.05), f"Q {_shape(q.shape)}", colour=draw.ROLE["query"])
    kb = draw.box(ax, (1.8, 2.6), f"K {_shape(k.shape)}", colour=draw.ROLE["key"])
    mm = draw.box(ax, (3.7, 2.85), "Q Kᵀ")
    out = draw.box(ax, (6.1, 2.85), f"scores {_shape(dot.shape)}")
    draw.arrow(ax, qb.east, mm.west)
    draw.arrow(ax, kb.east, mm.west)
    draw.arrow(ax, mm.east, out.west, text="one matrix product")
    for t in ax.texts:
        if t.get_text() == f"scores {_shape(dot.shape)}":
            t.set_gid("shape:dot")
    qa = draw.box(
        ax,
        (1.8, 1.5),
        f"Q W₁ᵀ {_shape(q.shape[:1] + (score.w_query.shape[0],))}",
        colour=draw.ROLE["query"],
    )
    ka = draw.box(
        ax,
        (1.8, 1.0),
        f"K W₂ᵀ {_shape(k.shape[:1] + (score.w_key.shape[0],))}",
        colour=draw.ROLE["key"],
    )
    hb = draw.box(ax, (3.9, 1.25), f"tanh(sum) {_shape(hidden.shape)}")
    ob = draw.box(ax, (6.1, 1.25), f"scores {_shape(add.shape)}")
    draw.arrow(ax, qa.east, hb.west)
    draw.arrow(ax, ka.east, hb.west)
    draw.arrow(ax, hb.east, ob.west, text="dot with v")
    for t in ax.texts:
        if t.get_text() == f"tanh(sum) {_shape(hidden.shape)}":
            t.set_gid("shape:hidden")
        if t.get_text() == f"scores {_shape(add.shape)}" and t.get_gid() is None:
            t.set_gid("shape:additive")
    draw.label(
        ax,
        (3.9, 0.45),
        "every query-key pair gets its own h-vector: i × j × h numbers in memory",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig
